"""The pieces the Transformer is stacked from, in paper order: dropout, position encodings,
the position-wise feed-forward network, and the encoder and decoder layers (each a
:class:`tinymt.attention.MultiHeadAttention` or two plus the feed-forward, with residual
connections and LayerNorm before (pre-LN) or after (post-LN, the paper's) each sub-layer).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinymt.attention import KVCache, MultiHeadAttention


# --------------------------------------------------------------------------- dropout
class Dropout(nn.Module):
    """Dropout (Srivastava et al., 2014): in training, zero each element with probability
    ``p`` and scale the rest by ``1 / (1 - p)``; in eval, the identity.

    On a CPU the mask comes from 16 random bits per element (``int64`` draws viewed as
    four ``int16``): an element is kept when its bits are at least ``round(p * 2^16)``, so
    ``p`` is rounded to a multiple of 2^-16 and the scale uses the rounded value (the
    expectation stays exact). About 3x cheaper than ``torch.bernoulli_``, which draws
    per element: dropout was 13 % of a CPU training step of ``small`` (docs/benchmarks.md).
    Elsewhere it is ``F.dropout``.

    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> drop = Dropout(0.25)
    >>> y = drop(torch.ones(10_000))
    >>> sorted(set(y.tolist()))
    [0.0, 1.3333333730697632]
    >>> round(float(y.eq(0).float().mean()), 2)
    0.25
    >>> bool(drop.eval()(y).equal(y))
    True
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p >= 1.0:
            return F.dropout(x, self.p, True)
        cut = round(self.p * 65536)  # drop when the 16 bits, read unsigned, are below this
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        keep = bits.view(torch.int16)[:n].view(x.shape) >= cut - 32768  # signed view
        scale = 65536 / (65536 - cut)
        return x * torch.where(keep, scale, 0.0).to(x.dtype)


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
        self.dropout = Dropout(dropout)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear1(x)  # (B, T, d_ff)
        h = F.relu(h) if self.activation == "relu" else F.gelu(h)
        return self.linear2(self.dropout(h))  # (B, T, d)


class EncoderLayer(nn.Module):
    """Self-attention + FFN, each in a residual block (pre-LN or post-LN)."""

    def __init__(self, d_model, n_heads, d_ff, dropout, attention_dropout, activation, norm_first):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        pad_mask: Tensor | None,
        need_weights: bool = False,
        gate: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        kw = {"key_padding_mask": pad_mask, "need_weights": need_weights, "head_gate": gate}
        if self.norm_first:
            h, w = self.self_attn(self.norm1(x), **kw)
            x = x + self.dropout1(h)
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            h, w = self.self_attn(x, **kw)
            x = self.norm1(x + self.dropout1(h))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return x, w  # (B, S, d), (B, h, S, S) or None


class DecoderLayer(nn.Module):
    """Masked self-attention + cross-attention + FFN, each in a residual block."""

    def __init__(self, d_model, n_heads, d_ff, dropout, attention_dropout, activation, norm_first):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ff = FeedForward(d_model, d_ff, dropout, activation)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        memory_pad_mask: Tensor | None,
        tgt_pad_mask: Tensor | None = None,
        need_weights: bool = False,
        self_gate: Tensor | None = None,
        cross_gate: Tensor | None = None,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
        beam_slots: tuple[Tensor, int] | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """``beam_slots=(slots, beam)``: rows of ``x`` are beam slots over sentence rows of
        ``memory``/``cross_cache`` (see :class:`tinymt.attention.DecoderCache`)."""
        def self_block(y):
            return self.self_attn(
                y, key_padding_mask=tgt_pad_mask, causal=True, need_weights=need_weights,
                cache=self_cache, head_gate=self_gate,
            )

        def cross_block(y):
            if beam_slots is None:
                return self.cross_attn(
                    y, memory, key_padding_mask=memory_pad_mask, need_weights=need_weights,
                    cache=cross_cache, head_gate=cross_gate,
                )
            # The beams of one sentence become the query positions of that sentence's
            # row, so each sentence's encoder keys/values are used once, not copied.
            slots, beam = beam_slots
            R, T, d = y.shape  # T == 1: one new token per hypothesis
            N = cross_cache.k.size(0)  # sentences
            grid = y.new_zeros(N * beam, T * d)  # empty slots stay zero (outputs unused)
            grid[slots] = y.reshape(R, T * d)
            grid = grid.view(N, beam * T, d)  # (N, beam * T, d)
            out, w = self.cross_attn(
                grid, memory, key_padding_mask=memory_pad_mask, need_weights=need_weights,
                cache=cross_cache, head_gate=cross_gate,
            )  # (N, beam * T, d), (N, h, beam * T, S)
            out = out.reshape(N * beam, T, d)[slots]  # (R, T, d)
            if w is not None:
                h, S = w.size(1), w.size(3)
                w = w.view(N, h, beam, T, S).transpose(1, 2).reshape(N * beam, h, T, S)[slots]
            return out, w  # (R, T, d), (R, h, T, S) or None

        if self.norm_first:
            h, self_w = self_block(self.norm1(x))
            x = x + self.dropout1(h)
            h, cross_w = cross_block(self.norm2(x))
            x = x + self.dropout2(h)
            x = x + self.dropout3(self.ff(self.norm3(x)))
        else:
            h, self_w = self_block(x)
            x = self.norm1(x + self.dropout1(h))
            h, cross_w = cross_block(x)
            x = self.norm2(x + self.dropout2(h))
            x = self.norm3(x + self.dropout3(self.ff(x)))
        return x, self_w, cross_w  # (B, T, d), (B, h, T, T_k) or None, (B, h, T, S) or None
