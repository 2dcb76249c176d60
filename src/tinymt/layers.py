"""The pieces the Transformer is stacked from, in paper order: position encodings (3.5),
the position-wise feed-forward network (3.3), and the encoder and decoder layers (3.1): each
a :class:`tinymt.attention.MultiHeadAttention` or two plus the feed-forward, every sub-layer
in a residual connection with LayerNorm before it (pre-LN, the default) or after it
(post-LN, the paper's).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinymt.attention import MultiHeadAttention


# --------------------------------------------------------------------------- positions
class SinusoidalPositions(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        pos = torch.arange(max_positions, dtype=torch.float32)[:, None]  # (P, 1)
        inv_freq = torch.exp(
            torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model)
        )  # (ceil(d/2),)
        angles = pos * inv_freq  # (P, ceil(d/2))
        pe = torch.zeros(max_positions, d_model)  # (P, d)
        pe[:, 0::2] = torch.sin(angles)
        pe[:, 1::2] = torch.cos(angles)[:, : d_model // 2]
        self.register_buffer("pe", pe, persistent=False)  # rebuilt on load, not saved

    def forward(self, length: int, offset: int = 0) -> Tensor:
        return self.pe[offset : offset + length]  # (T, d)


class LearnedPositions(nn.Module):
    """One trained vector per position."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        return self.embedding.weight[offset : offset + length]  # (T, d)


# ----------------------------------------------- feed-forward, encoder and decoder layers
class FeedForward(nn.Module):
    """FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear1(x)  # (B, T, d_ff)
        h = F.relu(h) if self.activation == "relu" else F.gelu(h)
        return self.linear2(self.dropout(h))  # (B, T, d)


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network, each in a residual block."""

    def __init__(self, d_model, n_heads, d_ff, dropout, attention_dropout, activation, norm_first):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None, need_weights: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        """``x`` ``(B, S, d)``; ``mask`` ``(B, 1, 1, S)``: True on real source tokens."""
        if self.norm_first:  # x + sublayer(norm(x))
            h, w = self.self_attn(self.norm1(x), mask=mask, need_weights=need_weights)
            x = x + self.dropout1(h)
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:  # norm(x + sublayer(x))
            h, w = self.self_attn(x, mask=mask, need_weights=need_weights)
            x = self.norm1(x + self.dropout1(h))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, w  # (B, S, d), (B, h, S, S) or None


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder's output, then the feed-forward
    network, each in a residual block."""

    def __init__(self, d_model, n_heads, d_ff, dropout, attention_dropout, activation, norm_first):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor | None, src_mask: Tensor | None,
                tgt_mask: Tensor | None, need_weights: bool = False, cache=None
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``x`` ``(B, T, d)`` the target so far; ``memory`` ``(B, S, d)`` the encoder's output;
        ``src_mask`` ``(B, 1, 1, S)``; ``tgt_mask`` ``(B, 1, T, T)``: padding and the triangle.

        ``cache``: decoding one token at a time, the layer's KV caches
        (:mod:`tinymt.decoding.cache`) stand in for its two attention modules."""
        self_attn, cross_attn = (self.self_attn, self.cross_attn) if cache is None else cache
        kw = {"need_weights": need_weights}
        if self.norm_first:  # x + sublayer(norm(x))
            h, self_w = self_attn(self.norm1(x), mask=tgt_mask, **kw)
            x = x + self.dropout1(h)
            h, cross_w = cross_attn(self.norm2(x), memory, mask=src_mask, **kw)
            x = x + self.dropout2(h)
            x = x + self.dropout3(self.ff(self.norm3(x)))
        else:  # norm(x + sublayer(x))
            h, self_w = self_attn(x, mask=tgt_mask, **kw)
            x = self.norm1(x + self.dropout1(h))
            h, cross_w = cross_attn(x, memory, mask=src_mask, **kw)
            x = self.norm2(x + self.dropout2(h))
            x = self.norm3(x + self.dropout3(self.ff(x)))
        return x, self_w, cross_w  # (B, T, d), (B, h, T, T) or None, (B, h, T, S) or None
