"""Incremental decoding: the decoder fed one token at a time, keys and values kept (a KV
cache), so each step projects only the new token instead of re-running the whole prefix.

Only step 1 of attention changes (where the keys and values come from); steps 2–4 are the
core's own :meth:`tinymt.attention.MultiHeadAttention.forward`, run on
:class:`CachedSelfAttention` / :class:`CachedCrossAttention`, which stand in for a decoder
layer's two attention modules. Tested equal to teacher forcing (tests/test_decoding.py).
After :meth:`DecoderCache.set_beams` the decoder rows are hypotheses, the cross-attention's
keys and values one row per *sentence* (docs/architecture.md, "Shared encoder side").
"""

from __future__ import annotations

from torch import Tensor

from tinymt.attention import MultiHeadAttention
from tinymt.model import Transformer


class KVCache:
    """Keys and values ``(B, h, T, d_head)`` of the positions fed so far, in a buffer whose
    time axis doubles when full: concatenating every step would copy the whole cache each
    time (quadratic in the length). For inference only."""

    MIN_ROOM = 16  # time steps a buffer starts with

    def __init__(self) -> None:
        self.length = 0  # number of cached time steps
        self.k: Tensor | None = None  # (B, h, capacity, d_head); capacity >= length
        self.v: Tensor | None = None

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``(B, h, T_new, d_head)`` keys and values; return all of them so far."""
        end = self.length + k.size(2)
        if self.k is None or end > self.k.size(2):  # no room: a bigger buffer
            B, h, _, d_head = k.shape
            room = max(end, 2 * self.length, self.MIN_ROOM)
            bigger_k, bigger_v = k.new_empty(B, h, room, d_head), v.new_empty(B, h, room, d_head)
            if self.length:
                bigger_k[:, :, : self.length] = self.k[:, :, : self.length]
                bigger_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = bigger_k, bigger_v
        self.k[:, :, self.length : end] = k  # write the new time steps in place
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, h, T_past + T_new, d_head)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (may repeat, drop or permute rows); after an update."""
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class CachedSelfAttention:
    """A decoder layer's masked self-attention, one new position per call: step 1 projects
    the new token and appends its keys and values to the earlier ones'. No mask is needed:
    a new position may look at every position fed so far."""

    forward = __call__ = MultiHeadAttention.forward  # steps 2-4: the core's, unchanged

    def __init__(self, mha: MultiHeadAttention):
        self.mha, self.out_proj, self.kv = mha, mha.out_proj, KVCache()
        self.training, self.dropout = False, 0.0

    def project(self, query: Tensor, key_value: Tensor | None = None):
        q, k, v = self.mha.project(query)  # (R, h, 1, d_head) each
        return (q, *self.kv.update(k, v))  # keys and values (R, h, t, d_head)


class CachedCrossAttention:
    """A decoder layer's cross-attention: the encoder output's keys and values, projected
    once (``(N, h, S, d_head)``, one row per sentence), reused at every step."""

    forward = MultiHeadAttention.forward  # steps 2-4: the core's, unchanged

    def __init__(self, mha: MultiHeadAttention, memory: Tensor):
        self.mha, self.out_proj = mha, mha.out_proj
        self.training, self.dropout = False, 0.0
        _, self.k, self.v = mha.project(memory[:, :0], memory)  # (N, h, S, d_head) each
        self.slots: Tensor | None = None  # beam layout: (R,) the slot n * beam + j of each row
        self.beam = 1

    def project(self, query: Tensor, key_value: Tensor | None = None):
        return self.mha.project_queries(query), self.k, self.v  # (N, h, T, d_head), K, V

    def __call__(self, query: Tensor, memory=None, mask: Tensor | None = None,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if self.slots is None:
            return self.forward(query, None, mask, need_weights)
        # Beam layout: the beams of one sentence become the query positions of that
        # sentence's row, so each sentence's encoder keys and values are used once.
        R, T, d = query.shape  # T == 1: one new token per hypothesis
        N = self.k.size(0)  # sentences
        grid = query.new_zeros(N * self.beam, T * d)  # empty slots stay zero (outputs unused)
        grid[self.slots] = query.reshape(R, T * d)
        # (no attention weights: decode_step asks for none)
        out, _ = self.forward(grid.view(N, self.beam * T, d), None, mask)
        return out.reshape(N * self.beam, T, d)[self.slots], None  # (R, T, d)

    def keep_sentences(self, index: Tensor) -> None:
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class DecoderCache:
    """Everything incremental decoding keeps: per decoder layer a ``(self, cross)`` pair,
    the source mask ``(N, 1, 1, S)`` of the cross-attention rows, and ``step``, the number
    of target positions fed so far (the position of the next token)."""

    def __init__(self, model: Transformer, memory: Tensor, src_mask: Tensor):
        self.layers = [(CachedSelfAttention(layer.self_attn),
                        CachedCrossAttention(layer.cross_attn, memory))
                       for layer in model.decoder_layers]
        self.src_mask = src_mask
        self.step = 0

    def reorder(self, index: Tensor) -> None:
        """Default layout (before :meth:`set_beams`): keep rows (= sentences) ``index``."""
        for self_attn, cross_attn in self.layers:
            self_attn.kv.reorder(index)
            cross_attn.keep_sentences(index)
        self.src_mask = self.src_mask.index_select(0, index)

    def set_beams(self, rows: Tensor | None, slots: Tensor, beam: int,
                  sentences: Tensor | None = None) -> None:
        """Beam layout: keep decoder rows ``rows`` (None: all, as they are), which are now
        the slots ``slots`` ``(R,)`` of an ``(N, beam)`` grid; ``sentences`` (None: all)
        are the sentences that stay, in the numbering before this call."""
        for self_attn, cross_attn in self.layers:
            if rows is not None:
                self_attn.kv.reorder(rows)
            if sentences is not None:
                cross_attn.keep_sentences(sentences)
            cross_attn.slots, cross_attn.beam = slots, beam
        if sentences is not None:
            self.src_mask = self.src_mask.index_select(0, sentences)


def decode_step(model: Transformer, tokens: Tensor, cache: DecoderCache) -> Tensor:
    """Feed the next target token of every row ``(R, 1)`` and extend ``cache``: the
    logits of the next token ``(R, V_tgt)``."""
    x = model.embed(tokens, model.tgt_embed, model.tgt_pos, "a target prefix",
                    offset=cache.step)  # (R, 1, d)
    for layer, layer_cache in zip(model.decoder_layers, cache.layers):
        x, _, _ = layer(x, None, cache.src_mask, None, cache=layer_cache)
    cache.step += tokens.size(1)
    return model.logits(model.decoder_norm(x[:, -1]))  # (R, V_tgt)
