"""The benchmark's peer: the same translator built from ``torch.nn.Transformer``.

:class:`PeerTransformer` has exactly the architecture of :class:`tinymt.model.Transformer`
-- the same embeddings (scaled by ``sqrt(d_model)``, tied the same way), the same position
encodings, ``nn.Transformer`` with the same width, heads, depth, FFN, activation,
dropout and LayerNorm placement (``batch_first=True``; pre-LN adds the same final encoder
and decoder LayerNorms), and the same bias-free output projection -- so it has the same
parameters, one for one. Only the attention and layer code is PyTorch's instead of ours.

It speaks the same interface:

* ``forward(src, tgt_in) -> (logits, None)`` (teacher forcing, for training),
* ``encode(src, src_pad_mask) -> (memory, None)`` and
  ``decode(tgt_in, memory, src_pad_mask, last_only=...) -> (logits, None)``, so that
  :func:`tinymt.decoding.greedy_decode` / ``beam_search`` drive it with ``use_cache=False``
  (it has no KV cache): every step recomputes the whole target prefix and projects only the
  last position to the vocabulary -- the usual ``nn.Transformer`` recipe.

The embeddings, positions, output projection and initialisation are built by the same
functions as ours (:func:`tinymt.model.add_embeddings`, :func:`~tinymt.model.init_weights`,
:func:`~tinymt.model.embed`).

:meth:`PeerTransformer.load_from_ours` copies the weights of one of our models in, after
which both compute the same function (up to floating-point rounding).
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch
from torch import Tensor, nn

from tinymt.errors import TinyMTError
from tinymt.model import add_embeddings, embed, init_weights


class PeerTransformer(nn.Module):
    """Encoder-decoder translator on ``torch.nn.Transformer``, shaped like ours.

    Args mirror :class:`tinymt.model.Transformer`: ``cfg`` (a ``ModelConfig``),
    ``src_vocab_size``, ``tgt_vocab_size``, ``shared_vocab``, ``pad_id``.
    """

    def __init__(self, cfg, src_vocab_size: int, tgt_vocab_size: int, shared_vocab: bool,
                 pad_id: int = 0):
        super().__init__()
        add_embeddings(self, cfg, src_vocab_size, tgt_vocab_size, shared_vocab, pad_id)
        self.dropout = nn.Dropout(cfg.dropout)  # torch's, like the rest of the peer
        d = cfg.d_model

        layer_kw = {
            "d_model": d,
            "nhead": cfg.n_heads,
            "dim_feedforward": cfg.d_ff,
            "dropout": cfg.dropout,
            "activation": cfg.activation,
            "batch_first": True,
            "norm_first": cfg.norm_first,
        }
        # built by hand only so that post-LN gets no final norms (as ours); for pre-LN this
        # is exactly what nn.Transformer builds itself
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(**layer_kw),
            cfg.n_encoder_layers,
            norm=nn.LayerNorm(d) if cfg.norm_first else None,
            enable_nested_tensor=False,  # unused with norm_first anyway; avoids a warning
        )
        decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(**layer_kw),
            cfg.n_decoder_layers,
            norm=nn.LayerNorm(d) if cfg.norm_first else None,
        )
        self.transformer = nn.Transformer(
            d_model=d,
            nhead=cfg.n_heads,
            custom_encoder=encoder,
            custom_decoder=decoder,
            batch_first=True,
            norm_first=cfg.norm_first,
        )
        for module in self.transformer.modules():  # attention dropout, as ours, separately
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = cfg.attention_dropout
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=False)

        init_weights(self)  # the same initialisation (and tying) as ours

    # ----------------------------------------------------------------- weights from ours
    _RENAMES: ClassVar[list[tuple[str, str]]] = [
        (r"^encoder_layers\.", "transformer.encoder.layers."),
        (r"^decoder_layers\.", "transformer.decoder.layers."),
        (r"^encoder_norm\.", "transformer.encoder.norm."),
        (r"^decoder_norm\.", "transformer.decoder.norm."),
        (r"\.cross_attn\.", ".multihead_attn."),
        (r"_attn\.in_proj\.weight$", "_attn.in_proj_weight"),
        (r"_attn\.in_proj\.bias$", "_attn.in_proj_bias"),
        (r"\.ff\.linear", ".linear"),
    ]

    @classmethod
    def peer_key(cls, key: str) -> str:
        """The name in this model of parameter/buffer ``key`` of a ``tinymt`` model."""
        for pattern, repl in cls._RENAMES:
            key = re.sub(pattern, repl, key)
        return key

    @classmethod
    def copy_of(cls, model: nn.Module) -> PeerTransformer:
        """A peer of the same configuration and vocabularies holding ``model``'s weights
        (on the CPU, in float32: move it where ``model`` is)."""
        return cls(model.config, model.src_vocab_size, model.tgt_vocab_size,
                   model.shared_vocab, model.pad_id).load_from_ours(model)

    @torch.no_grad()
    def load_from_ours(self, model: nn.Module) -> PeerTransformer:
        """Copy every weight of a :class:`tinymt.model.Transformer` of the same shape."""
        state = {}
        for key, value in model.state_dict().items():
            if key.startswith("head_mask_"):  # ours can switch heads off; the peer cannot
                if not bool(value.eq(1).all()):
                    raise TinyMTError(f"this model has pruned heads ({key}); the "
                                      "nn.Transformer peer cannot mask heads")
                continue
            state[self.peer_key(key)] = value
        try:
            missing, unexpected = self.load_state_dict(state, strict=False)
        except RuntimeError as e:  # shapes differ
            first = str(e).strip().splitlines()[-1].strip()[:200]
            raise TinyMTError(f"the peer does not match this model: {first}") from None
        if missing or unexpected:
            raise TinyMTError(
                f"the peer does not match this model: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}"
            )
        return self

    # ----------------------------------------------------------------- helpers
    @staticmethod
    def _no_extras(need_weights: bool, head_gates) -> None:
        if need_weights or head_gates is not None:
            raise TinyMTError("the nn.Transformer peer returns no attention weights and has "
                              "no head gates")

    def _embed_src(self, src: Tensor) -> Tensor:
        return embed(self, src, self.src_embed, self.src_pos, "a source sentence")

    def _embed_tgt(self, tgt_in: Tensor) -> Tensor:
        return embed(self, tgt_in, self.tgt_embed, self.tgt_pos, "a target sentence")

    @staticmethod
    def _causal(T: int, device) -> Tensor:
        """``(T, T)`` bool, True above the diagonal (= may not attend), as torch wants."""
        return torch.ones(T, T, dtype=torch.bool, device=device).triu(1)

    # ----------------------------------------------------------------- model
    def forward(self, src: Tensor, tgt_in: Tensor, src_pad_mask: Tensor | None = None,
                tgt_pad_mask: Tensor | None = None, need_weights: bool = False,
                head_gates=None) -> tuple[Tensor, None]:
        """``(src (B, S), tgt_in (B, T))`` -> ``(logits (B, T, V_tgt), None)``."""
        self._no_extras(need_weights, head_gates)
        if src_pad_mask is None:
            src_pad_mask = src.eq(self.pad_id)  # (B, S)
        if tgt_pad_mask is None:
            tgt_pad_mask = tgt_in.eq(self.pad_id)  # (B, T)
        T = tgt_in.size(1)
        h = self.transformer(
            self._embed_src(src), self._embed_tgt(tgt_in),
            tgt_mask=self._causal(T, tgt_in.device),
            src_key_padding_mask=src_pad_mask,
            tgt_key_padding_mask=tgt_pad_mask,
            memory_key_padding_mask=src_pad_mask,
            tgt_is_causal=True,
        )  # (B, T, d)
        return self.output_proj(h), None  # (B, T, V_tgt)

    def encode(self, src: Tensor, src_pad_mask: Tensor | None = None,
               need_weights: bool = False, head_gates=None) -> tuple[Tensor, None]:
        """Source tokens ``(B, S)`` -> ``(memory (B, S, d), None)``."""
        self._no_extras(need_weights, head_gates)
        if src_pad_mask is None:
            src_pad_mask = src.eq(self.pad_id)
        memory = self.transformer.encoder(self._embed_src(src), src_key_padding_mask=src_pad_mask)
        return memory, None

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor | None,
               tgt_pad_mask: Tensor | None = None, need_weights: bool = False,
               head_gates=None, last_only: bool = False) -> tuple[Tensor, None]:
        """Teacher-forced decoder: ``tgt_in`` ``(B, T)`` -> ``(logits (B, T, V_tgt), None)``.

        ``last_only``: the logits of the last position only, ``(B, V_tgt)``, as decoding
        without a cache needs; ``tgt_pad_mask`` then defaults to none, by the same rule as
        :meth:`tinymt.model.Transformer.decode` (``nn.MultiheadAttention`` keeps its causal
        fast path: the usual ``nn.Transformer`` decoding recipe).
        """
        self._no_extras(need_weights, head_gates)
        if tgt_pad_mask is None and not last_only:
            tgt_pad_mask = tgt_in.eq(self.pad_id)  # (B, T)
        T = tgt_in.size(1)
        hidden = self.transformer.decoder(
            self._embed_tgt(tgt_in), memory,
            tgt_mask=self._causal(T, tgt_in.device),
            tgt_key_padding_mask=tgt_pad_mask,
            memory_key_padding_mask=src_pad_mask,
            tgt_is_causal=True,
        )  # (B, T, d)
        if last_only:
            hidden = hidden[:, -1]  # (B, d)
        return self.output_proj(hidden), None
