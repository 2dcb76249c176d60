"""The benchmark's peer: our translator built from ``torch.nn.Transformer``.

A copy of one of our models: its embeddings, positions and output projection (tied as in
ours) around ``nn.Transformer`` of the same shape, which takes our layers' weights: the
same parameters one for one. It speaks our model's interface (``encode``, ``decode``,
``logits``), so the core's plain greedy loop (:func:`tinymt.decoding.greedy_decode`)
translates with it, recomputing the prefix every step: the usual ``nn.Transformer`` recipe.
"""

from __future__ import annotations

import copy
import functools
import re

import torch
from torch import Tensor, nn

from tinymt.model import Transformer

RENAMES = (  # (pattern, replacement) on our layers' parameter names
    (r"^(en|de)coder_(layers|norm)\.", r"\1coder.\2."),
    (r"\.cross_attn\.", ".multihead_attn."),
    (r"_attn\.in_proj\.(weight|bias)$", r"_attn.in_proj_\1"),
    (r"\.ff\.linear", ".linear"),
)


class PeerTransformer(nn.Module):
    """Encoder-decoder on ``nn.Transformer`` holding a copy of ``model``'s weights."""

    def __init__(self, model: Transformer):
        super().__init__()
        cfg, d = model.config, model.d_model
        for name in ("pad_id", "max_positions", "embed_scale"):  # what our methods read
            setattr(self, name, getattr(model, name))
        memo: dict = {}  # one deep copy for all: the copies of tied matrices stay tied
        for name in ("src_embed", "tgt_embed", "src_pos", "tgt_pos", "dropout", "output_proj"):
            setattr(self, name, copy.deepcopy(getattr(model, name), memo))
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
                                                 cfg.n_decoder_layers, norm=final()),
        ).to(model.output_proj.weight)  # ours' device and dtype
        for module in self.transformer.modules():  # attention dropout apart, as ours
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = cfg.attention_dropout
        self.transformer.load_state_dict({  # strict: every name, every shape
            functools.reduce(lambda k, rename: re.sub(*rename, k), RENAMES, key): value
            for key, value in model.state_dict().items() if re.match(r"(en|de)coder_", key)})

    # ours, word for word (forward: encode, then decode)
    padding_mask, embed, logits = Transformer.padding_mask, Transformer.embed, Transformer.logits
    forward = Transformer.forward

    def encode(self, src: Tensor, src_mask: Tensor, need_weights: bool = False
               ) -> tuple[Tensor, None]:
        """``(B, S)`` tokens and their mask -> ``(memory (B, S, d), None)``: no weights."""
        x = self.embed(src, self.src_embed, self.src_pos, "a source sentence")  # (B, S, d)
        return self.transformer.encoder(x, src_key_padding_mask=~src_mask[:, 0, 0]), None

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               need_weights: bool = False) -> tuple[Tensor, None]:
        """``(B, T)`` target tokens -> ``(hidden (B, T, d), None)``. Decoding's prefixes
        have no padding: there no target mask is passed (torch's causal fast path); a
        training step passes it unread, so that it does not wait for a GPU."""
        T = tgt_in.size(1)
        pad = tgt_in.eq(self.pad_id)  # (B, T)
        hidden = self.transformer.decoder(
            self.embed(tgt_in, self.tgt_embed, self.tgt_pos, "a target sentence"), memory,
            tgt_mask=torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1),
            tgt_key_padding_mask=pad if self.training or bool(pad.any()) else None,
            memory_key_padding_mask=~src_mask[:, 0, 0], tgt_is_causal=True)
        return hidden, None  # (B, T, d)
