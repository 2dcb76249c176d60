"""Multi-head attention (Vaswani et al., 2017, section 3.2), written out step by step.

One class serves the three places attention appears in the Transformer:

* encoder self-attention:        ``mha(x, mask=src_mask)``
* decoder masked self-attention: ``mha(y, mask=tgt_mask)`` (the mask holds the triangle)
* decoder cross-attention:       ``mha(y, memory, mask=src_mask)``

``mask`` is boolean and broadcasts to ``(B, h, T_q, T_k)``: True where query ``i`` may look
at key ``j``. The model builds the masks (:meth:`tinymt.model.Transformer.padding_mask`,
``causal_mask``); attention only applies them.

Weight layout: ``in_proj`` is one ``Linear(d, 3d)`` whose rows are ``[W_Q; W_K; W_V]``,
exactly ``nn.MultiheadAttention.in_proj_weight``; ``out_proj`` is ``W_O``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                          dropout: float = 0.0) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention (section 3.2.1): ``softmax(Q K^T / sqrt(d_k)) V``.

    ``q`` ``(B, h, T_q, d_head)``, ``k`` and ``v`` ``(B, h, T_k, d_head)``. Returns the
    context ``(B, h, T_q, d_head)`` and the weights ``(B, h, T_q, T_k)`` (each row sums to 1;
    before dropout). The scores are computed in at least float32, as fused kernels do.
    """
    scores = q @ k.transpose(-2, -1)  # (B, h, T_q, T_k): how well each query matches each key
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # masked keys get weight 0
    weights = scores.softmax(dim=-1)  # (B, h, T_q, T_k)
    ctx = F.dropout(weights, dropout, dropout > 0).to(v.dtype) @ v  # (B, h, T_q, d_head)
    return ctx, weights


class MultiHeadAttention(nn.Module):
    """``h`` heads, each attending in its own ``d_head = d_model / h`` subspace (3.2.2)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout  # on the attention weights, training only
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: [W_Q; W_K; W_V]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W_O

    def forward(self, query: Tensor, key_value: Tensor | None = None, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` ``(B, T_q, d)`` to ``key_value`` ``(B, T_k, d)`` (None:
        self-attention). Returns ``(out (B, T_q, d), weights (B, h, T_q, T_k) or None)``."""
        B, T_q, d = query.shape
        p = self.dropout if self.training else 0.0

        # 1. project to queries, keys and values, and split each into h heads
        q, k, v = self.project(query, key_value)  # (B, h, T, d_head) each

        # 2. scaled dot-product attention in every head at once
        if need_weights:  # written out, so the weights come back (attention maps)
            ctx, weights = dot_product_attention(q, k, v, mask, p)  # (B, h, T_q, d_head)
        else:  # the same maths in PyTorch's fused kernel
            ctx, weights = F.scaled_dot_product_attention(q, k, v, mask, p), None

        # 3. concatenate the heads
        ctx = ctx.transpose(1, 2).reshape(B, T_q, d)  # (B, T_q, h * d_head)

        # 4. mix them with the output projection W_O
        return self.out_proj(ctx), weights  # (B, T_q, d)

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, d_head)

    def project(self, query: Tensor, key_value: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Step 1: ``Q = query W_Q``, ``K = key_value W_K``, ``V = key_value W_V``, each split
        into heads ``(B, h, T, d_head)``. Self-attention does the three in one matmul."""
        if key_value is None:
            q, k, v = self.in_proj(query).chunk(3, dim=-1)  # 3 x (B, T, d)
            return self.split_heads(q), self.split_heads(k), self.split_heads(v)
        d, w, b = self.d_model, self.in_proj.weight, self.in_proj.bias
        k, v = F.linear(key_value, w[d:], None if b is None else b[d:]).chunk(2, dim=-1)
        return self.project_queries(query), self.split_heads(k), self.split_heads(v)

    def project_queries(self, query: Tensor) -> Tensor:
        """``Q = query W_Q`` alone, split into heads ``(B, h, T_q, d_head)``."""
        d, w, b = self.d_model, self.in_proj.weight, self.in_proj.bias
        return self.split_heads(F.linear(query, w[:d], None if b is None else b[:d]))
