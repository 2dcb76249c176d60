"""The benchmark's peer: our translator built from ``torch.nn.Transformer``.

Our model's embeddings, positions and output projection, built by the same helpers, around
``nn.Transformer`` of the same shape: the same parameters one for one. It speaks our model's
interface, so :mod:`tinymt.decoding` drives it with ``use_cache=False``: every step recomputes
the prefix, the usual ``nn.Transformer`` recipe.
"""

from __future__ import annotations

import functools
import re

import torch
from torch import Tensor, nn

from tinymt.errors import TinyMTError
from tinymt.model import Transformer, add_embeddings, embed, init_weights

RENAMES = (  # (pattern, replacement) on our parameter names
    (r"^(en|de)coder_(layers|norm)\.", r"transformer.\1coder.\2."),
    (r"\.cross_attn\.", ".multihead_attn."),
    (r"_attn\.in_proj\.(weight|bias)$", r"_attn.in_proj_\1"),
    (r"\.ff\.linear", ".linear"),
)


class PeerTransformer(nn.Module):
    """Encoder-decoder on ``nn.Transformer``; arguments as :class:`tinymt.model.Transformer`."""

    def __init__(self, cfg, src_vocab_size: int, tgt_vocab_size: int, shared_vocab: bool,
                 pad_id: int = 0):
        super().__init__()
        add_embeddings(self, cfg, src_vocab_size, tgt_vocab_size, shared_vocab, pad_id)
        d = cfg.d_model
        layer = {"d_model": d, "nhead": cfg.n_heads, "dim_feedforward": cfg.d_ff,
                 "dropout": cfg.dropout, "activation": cfg.activation, "batch_first": True,
                 "norm_first": cfg.norm_first}
        # built by hand only so that post-LN gets no final norms (as ours)
        final = (lambda: nn.LayerNorm(d)) if cfg.norm_first else (lambda: None)
        self.transformer = nn.Transformer(
            d_model=d, nhead=cfg.n_heads, batch_first=True, norm_first=cfg.norm_first,
            custom_encoder=nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer),
                                                 cfg.n_encoder_layers, norm=final(),
                                                 enable_nested_tensor=False),
            custom_decoder=nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer),
                                                 cfg.n_decoder_layers, norm=final()))
        for module in self.transformer.modules():  # attention dropout apart, as ours
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = cfg.attention_dropout
        self.output_proj = nn.Linear(d, tgt_vocab_size, bias=False)
        init_weights(self)

    @classmethod
    def copy_of(cls, model: nn.Module) -> PeerTransformer:
        """A peer holding ``model``'s weights (on the CPU, float32)."""
        return cls(model.config, model.src_vocab_size, model.tgt_vocab_size,
                   model.shared_vocab, model.pad_id).load_from_ours(model)

    @torch.no_grad()
    def load_from_ours(self, model: nn.Module) -> PeerTransformer:
        """Copy every weight of one of our models of the same shape."""
        state = {functools.reduce(lambda k, rename: re.sub(*rename, k), RENAMES, key): value
                 for key, value in model.state_dict().items()}  # our names -> the peer's
        try:
            missing, unexpected = self.load_state_dict(state, strict=False)
        except RuntimeError as e:  # shapes differ
            first = str(e).strip().splitlines()[-1].strip()[:200]
            raise TinyMTError(f"the peer does not match this model: {first}") from None
        if missing or unexpected:
            raise TinyMTError(f"the peer does not match this model: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
        return self

    # ours, word for word (forward: encode, then decode; weights are refused by both)
    padding_mask, logits = Transformer.padding_mask, Transformer.logits
    forward = Transformer.forward

    @staticmethod
    def _no_weights(need_weights: bool) -> None:  # nn.Transformer does not return them
        if need_weights:
            raise TinyMTError("the nn.Transformer peer returns no attention weights")

    def encode(self, src: Tensor, src_mask: Tensor | None = None, need_weights: bool = False
               ) -> tuple[Tensor, None]:
        """``(B, S)`` tokens -> ``(memory (B, S, d), None)``."""
        self._no_weights(need_weights)
        if src_mask is None:
            src_mask = self.padding_mask(src)
        x = embed(self, src, self.src_embed, self.src_pos, "a source sentence")  # (B, S, d)
        return self.transformer.encoder(x, src_key_padding_mask=~src_mask[:, 0, 0]), None

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               need_weights: bool = False) -> tuple[Tensor, None]:
        """``(B, T)`` target tokens -> ``(hidden (B, T, d), None)``. Without padding in
        ``tgt_in`` (decoding's prefixes) no target mask is passed: torch's causal fast path."""
        self._no_weights(need_weights)
        T = tgt_in.size(1)
        pad = tgt_in.eq(self.pad_id)  # (B, T)
        hidden = self.transformer.decoder(
            embed(self, tgt_in, self.tgt_embed, self.tgt_pos, "a target sentence"), memory,
            tgt_mask=torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1),
            tgt_key_padding_mask=pad if bool(pad.any()) else None,
            memory_key_padding_mask=~src_mask[:, 0, 0], tgt_is_causal=True)
        return hidden, None  # (B, T, d)
