"""Multi-head attention, written out step by step, plus the caches for decoding.

One class serves the three places attention appears in the Transformer:

* encoder self-attention:        ``mha(x, key_padding_mask=src_pad)``
* decoder masked self-attention: ``mha(y, key_padding_mask=tgt_pad, causal=True)``
* decoder cross-attention:       ``mha(y, memory, key_padding_mask=src_pad)``

``forward`` follows the paper (Vaswani et al., 2017, section 3.2):

1. project the inputs to queries, keys and values and split them into ``h`` heads,
2. scaled dot-product attention per head: ``softmax(Q K^T / sqrt(d_head)) V``,
3. concatenate the heads (after multiplying each by its optional gate),
4. project back with ``W_O``.

Step 2 has two implementations with the same maths. Without ``need_weights`` it calls
``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient kernels on
GPU); with ``need_weights=True`` it computes the softmax explicitly and returns the
per-head weights ``(B, h, T_q, T_k)``, so attention maps need no hooks.

Weight layout. ``in_proj`` is one ``Linear(d, 3d)`` whose weight rows are
``[W_Q; W_K; W_V]``, exactly ``nn.MultiheadAttention.in_proj_weight``; ``out_proj`` is
``W_O``. Self-attention uses the fused matmul; cross-attention applies the first third to
the query and the last two thirds to the encoder output. :meth:`load_from_torch` copies
the weights of an ``nn.MultiheadAttention`` in.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinymt.errors import TinyMTError


class KVCache:
    """Keys and values of one attention layer, kept between decoding steps.

    A self-attention cache grows by the new time steps on every call; a ``static``
    (cross-attention) cache is filled once from the encoder output and then reused.
    ``k`` and ``v`` are ``(B, h, T, d_head)``. ``reorder`` picks batch rows (beam search).

    A self-attention cache writes into a buffer with spare room along time, doubled when
    full, instead of concatenating a new tensor every step (which copies the whole cache
    each time: quadratic in the length). ``k``/``v`` are views of the filled part. For
    inference only: later writes into the buffer would invalidate earlier autograd graphs.

    Example: feeding a sequence one token at a time with a cache gives the same output
    as causal attention over the whole sequence.

    >>> import torch
    >>> from tinymt.attention import KVCache, MultiHeadAttention
    >>> _ = torch.manual_seed(0)
    >>> mha = MultiHeadAttention(d_model=8, n_heads=2).eval()
    >>> x = torch.randn(1, 3, 8)                       # (B, T, d)
    >>> full, _ = mha(x, causal=True)
    >>> cache = KVCache()
    >>> steps = [mha(x[:, t : t + 1], causal=True, cache=cache)[0] for t in range(3)]
    >>> cache.length
    3
    >>> torch.allclose(torch.cat(steps, dim=1), full, atol=1e-6)
    True
    >>> cache.reorder(torch.tensor([0, 0]))            # e.g. two beams of sentence 0
    >>> tuple(cache.k.shape)
    (2, 2, 3, 4)
    """

    MIN_ROOM = 16  # time steps a self-attention buffer starts with

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self.length = 0  # number of cached time steps
        self._k: Tensor | None = None  # (B, h, capacity, d_head); capacity >= length
        self._v: Tensor | None = None  # (B, h, capacity, d_head)

    @property
    def k(self) -> Tensor | None:
        """Cached keys ``(B, h, length, d_head)`` (None before the first update)."""
        if self._k is None or self.static:
            return self._k
        return self._k[:, :, : self.length]

    @property
    def v(self) -> Tensor | None:
        """Cached values ``(B, h, length, d_head)`` (None before the first update)."""
        if self._v is None or self.static:
            return self._v
        return self._v[:, :, : self.length]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values ``(B, h, T_new, d_head)``; return everything cached."""
        T_new = k.size(2)
        if self.static:
            if self._k is not None:
                raise ValueError("a static (cross-attention) KVCache is filled only once")
            self._k, self._v, self.length = k, v, T_new
            return self.k, self.v
        end = self.length + T_new
        if self._k is None or end > self._k.size(2):  # no room: a bigger buffer
            B, h, _, d_head = k.shape
            room = max(end, 2 * self.length, self.MIN_ROOM)
            bigger_k = k.new_empty(B, h, room, d_head)  # (B, h, room, d_head)
            bigger_v = v.new_empty(B, h, room, d_head)
            if self.length:
                bigger_k[:, :, : self.length] = self.k
                bigger_v[:, :, : self.length] = self.v
            self._k, self._v = bigger_k, bigger_v
        self._k[:, :, self.length : end] = k  # write the new time steps in place
        self._v[:, :, self.length : end] = v
        self.length = end
        return self.k, self.v  # (B, h, T_past + T_new, d_head)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (may repeat, drop or permute rows)."""
        if self._k is not None:
            self._k = self._k.index_select(0, index)  # spare room included
            self._v = self._v.index_select(0, index)


class DecoderCache:
    """Everything incremental decoding keeps: one self and one cross cache per layer.

    ``step`` is the number of target positions already fed (the position offset of the
    next token); ``src_pad_mask`` ``(B, S)`` travels with the cross-attention rows.

    Two layouts. By default decoder row ``i`` belongs to sentence ``i`` (greedy search).
    After :meth:`set_beams` the cross-attention caches keep one row per *sentence*
    ``(N, h, S, d_head)`` while the decoder rows are hypotheses: row ``i`` is slot
    ``slots[i]`` of an ``(N, beam)`` grid, so the beams of a sentence share its encoder
    keys and values instead of holding ``beam`` copies that move on every reorder.
    """

    def __init__(
        self,
        self_attn: list[KVCache],
        cross_attn: list[KVCache],
        src_pad_mask: Tensor | None,
        step: int = 0,
    ) -> None:
        self.self_attn = self_attn
        self.cross_attn = cross_attn
        self.src_pad_mask = src_pad_mask
        self.step = step
        self.slots: Tensor | None = None  # (R,) each row's slot n * beam + j, beam layout
        self.beam = 1

    def reorder(self, index: Tensor) -> None:
        """Default layout: keep rows (= sentences) ``index``."""
        assert self.slots is None, "beam layout: use set_beams"
        for cache in self.self_attn + self.cross_attn:
            cache.reorder(index)
        if self.src_pad_mask is not None:
            self.src_pad_mask = self.src_pad_mask.index_select(0, index)

    def set_beams(
        self, rows: Tensor | None, slots: Tensor, beam: int, sentences: Tensor | None = None
    ) -> None:
        """Beam layout: keep decoder rows ``rows`` (None: all, as they are), which are now
        the slots ``slots`` ``(R,)`` of an ``(N, beam)`` grid; ``sentences`` (None: all)
        are the sentences that stay, in the numbering before this call."""
        if rows is not None:
            for cache in self.self_attn:
                cache.reorder(rows)
        if sentences is not None:
            for cache in self.cross_attn:
                cache.reorder(sentences)
            if self.src_pad_mask is not None:
                self.src_pad_mask = self.src_pad_mask.index_select(0, sentences)
        self.slots, self.beam = slots, beam


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (self, masked self or cross)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model % n_heads != 0:
            raise TinyMTError(
                f"model.d_model={d_model} is not divisible by model.n_heads={n_heads}; "
                "pick sizes where d_model / n_heads is a whole number"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.dropout = dropout  # on the attention probabilities, training only
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: [W_Q; W_K; W_V]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W_O

    # ----------------------------------------------------------------- helpers
    def _split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, d_head)

    def project_q(self, query: Tensor) -> Tensor:
        """Queries of ``query`` ``(B, T, d)``, split into heads ``(B, h, T, d_head)``."""
        d = self.d_model
        w = self.in_proj.weight[:d]  # W_Q (d, d)
        b = None if self.in_proj.bias is None else self.in_proj.bias[:d]
        return self._split_heads(F.linear(query, w, b))

    def project_kv(self, key_value: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``key_value`` ``(B, T, d)``, each ``(B, h, T, d_head)``."""
        d = self.d_model
        w = self.in_proj.weight[d:]  # [W_K; W_V] (2d, d)
        b = None if self.in_proj.bias is None else self.in_proj.bias[d:]
        k, v = F.linear(key_value, w, b).chunk(2, dim=-1)  # 2 x (B, T, d)
        return self._split_heads(k), self._split_heads(v)

    @torch.no_grad()
    def load_from_torch(self, ref: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of an ``nn.MultiheadAttention`` (same d_model and heads)."""
        self.in_proj.weight.copy_(ref.in_proj_weight)
        self.out_proj.weight.copy_(ref.out_proj.weight)
        if self.in_proj.bias is not None:
            self.in_proj.bias.copy_(ref.in_proj_bias)
            self.out_proj.bias.copy_(ref.out_proj.bias)
        return self

    @staticmethod
    def may_attend(
        key_padding_mask: Tensor | None, causal: bool, t_q: int, t_k: int, device
    ) -> Tensor | None:
        """Boolean mask, True where query i may look at key j, or None if all may.

        Broadcastable to ``(B, h, T_q, T_k)``. With ``causal`` the queries are the *last*
        ``T_q`` positions of the ``T_k`` keys (earlier keys may come from a cache), so
        query i sits at absolute position ``T_k - T_q + i``.
        """
        allowed = None
        if key_padding_mask is not None:
            allowed = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, T_k)
        if causal and t_q > 1:
            ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
            future = ones.tril(diagonal=t_k - t_q)  # (T_q, T_k)
            allowed = future if allowed is None else allowed & future  # (B, 1, T_q, T_k)
        return allowed

    # ----------------------------------------------------------------- forward
    # long: the four numbered steps of the paper read top to bottom in one place (most of
    # its length is the docstring); split up, a learner would jump between helpers
    def forward(
        self,
        query: Tensor,
        key_value: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
        head_gate: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` ``(B, T_q, d)`` to ``key_value`` ``(B, T_k, d)``.

        Args:
            query: the sequence asking; ``(B, T_q, d)``.
            key_value: the sequence attended to; None means self-attention (``query``).
            key_padding_mask: ``(B, T_k)`` bool, True on padding keys. With a
                self-attention cache it must cover all keys, cached ones included.
            causal: query i may only see keys up to its own position.
            need_weights: also return per-head weights ``(B, h, T_q, T_k)`` (explicit
                softmax path; the weights are the probabilities before dropout, float32
                also under bf16 autocast).
            cache: a :class:`KVCache`. Self-attention appends the new keys/values; a
                static cache (cross-attention) is filled from ``key_value`` on first use
                and reused afterwards, when ``key_value`` may be None.
            head_gate: ``(h,)`` or ``(B, h)``; each head's context is multiplied by its
                gate before ``W_O``. Differentiable (head importance = |d loss / d gate|).

        Returns:
            ``(out (B, T_q, d), weights (B, h, T_q, T_k) or None)``.
        """
        B, T_q, d = query.shape

        # 1. project and split into heads
        if key_value is None and (cache is None or not cache.static):
            q, k, v = self.in_proj(query).chunk(3, dim=-1)  # 3 x (B, T_q, d)
            q = self._split_heads(q)  # (B, h, T_q, d_head)
            k = self._split_heads(k)  # (B, h, T_q, d_head)
            v = self._split_heads(v)  # (B, h, T_q, d_head)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, h, T_k, d_head), T_k = T_past + T_q
        else:
            q = self.project_q(query)  # (B, h, T_q, d_head)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v  # (B, h, T_k, d_head), computed at an earlier step
            elif key_value is None:
                raise ValueError("cross-attention needs key_value or a filled static cache")
            else:
                k, v = self.project_kv(key_value)  # (B, h, T_k, d_head)
                if cache is not None:
                    cache.update(k, v)
        T_k = k.size(2)

        # 2. scaled dot-product attention, per head
        use_is_causal = not need_weights and causal and key_padding_mask is None and T_q == T_k
        allowed = None
        if not use_is_causal:
            allowed = self.may_attend(key_padding_mask, causal, T_q, T_k, query.device)
        dead = None  # query rows with no key to look at (e.g. an all-padding sentence)
        if key_padding_mask is not None:
            dead = ~allowed.any(dim=-1, keepdim=True)  # (B, 1, T_q or 1, 1)
            allowed = allowed | dead  # let them attend anywhere (no NaN); zeroed below
        p_drop = self.dropout if self.training else 0.0

        weights = None
        if need_weights:
            scores = torch.matmul(q, k.transpose(-2, -1))  # (B, h, T_q, T_k)
            # scale, mask and softmax in at least float32 (no-ops in fp32 and fp64), as CUDA
            # autocast and the fused kernels do; under CPU bf16 autocast they would be bf16
            scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
            scores = scores / math.sqrt(self.d_head)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            weights = scores.softmax(dim=-1)  # (B, h, T_q, T_k) >= float32, rows sum to 1
            if dead is not None:
                weights = weights.masked_fill(dead, 0.0)
            probs = F.dropout(weights, p_drop, self.training).to(v.dtype)
            ctx = torch.matmul(probs, v)  # (B, h, T_q, d_head)
        else:
            ctx = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=p_drop, is_causal=use_is_causal and T_q > 1
            )  # (B, h, T_q, d_head)
        if dead is not None:
            ctx = ctx.masked_fill(dead, 0.0)

        # 3. gate each head, then concatenate the heads
        if head_gate is not None:
            ctx = ctx * head_gate[..., None, None].to(ctx.dtype)  # (B, h, T_q, d_head)
        ctx = ctx.transpose(1, 2).reshape(B, T_q, d)  # (B, T_q, h * d_head)

        # 4. output projection W_O
        return self.out_proj(ctx), weights  # (B, T_q, d)
