"""Our checkpoint -> a CTranslate2 ``TransformerSpec``, built with CTranslate2's spec API.

Every weight is copied from our modules as it is; nothing goes through another toolkit's
checkpoint format. How each option maps: docs/architecture.md ("Deploying"); each converts
exactly (tests/test_export.py compares the float32 export with our decoder token for
token). Every value :class:`tinymt.config.ModelConfig` allows converts; the checkpoint's
loader refuses any other (an unknown key too) in one line naming it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tinymt.errors import TinyMTError
from tinymt.model import Transformer
from tinymt.tokenizer import Tokenizer

INSTALL = "CTranslate2 is not installed: pip install -e '.[ct2]'"
QUANTIZATIONS = {"none": None, "int8": "int8"}  # quantization= -> CTranslate2's name


def require_ct2():
    """The ``ctranslate2`` module, imported here so that tinymt works without the extra."""
    try:
        import ctranslate2
    except ImportError:
        raise TinyMTError(INSTALL) from None
    return ctranslate2


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).contiguous().numpy().copy()


def _linear(spec, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _attention(spec, mha, norm: nn.LayerNorm, self_attention: bool) -> None:
    """Our fused ``in_proj`` and ``W_O``, and the layer's ``norm`` around them."""
    w, b, d = mha.in_proj.weight, mha.in_proj.bias, mha.d_model
    if self_attention:
        _linear(spec.linear[0], w, b)  # [W_Q; W_K; W_V], CTranslate2's fused layout too
    else:
        _linear(spec.linear[0], w[:d], None if b is None else b[:d])  # W_Q
        _linear(spec.linear[1], w[d:], None if b is None else b[d:])  # [W_K; W_V]
    _linear(spec.linear[-1], mha.out_proj.weight, mha.out_proj.bias)  # W_O
    _norm(spec.layer_norm, norm)


def _ffn(spec, ff, norm: nn.LayerNorm) -> None:
    _norm(spec.layer_norm, norm)
    _linear(spec.linear_0, ff.linear1.weight, ff.linear1.bias)
    _linear(spec.linear_1, ff.linear2.weight, ff.linear2.bias)


def _inputs(spec, embedding: nn.Embedding, positions: nn.Module, max_positions: int) -> None:
    emb = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    emb.weight = _np(embedding.weight)
    spec.scale_embeddings = True  # times sqrt(d_model), as tinymt.model.embed
    spec.position_encodings.encodings = _np(positions(max_positions))  # (P, d), ours


def build_spec(model: Transformer, src_tok: Tokenizer, tgt_tok: Tokenizer,
               quantization: str = "none"):
    """The ``TransformerSpec`` of ``model``, vocabularies registered, validated and optimized
    as exported (after :func:`require_ct2`)."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.config
    act = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers), cfg.n_heads, pre_norm=cfg.norm_first,
        activation=act[cfg.activation], alignment_heads=cfg.n_heads)  # (the last layer's)
    enc, dec = spec.encoder, spec.decoder
    _inputs(enc, model.src_embed, model.src_pos, model.max_positions)
    _inputs(dec, model.tgt_embed, model.tgt_pos, model.max_positions)
    for ls, layer in zip(enc.layer, model.encoder_layers):
        _attention(ls.self_attention, layer.self_attn, layer.norm1, True)
        _ffn(ls.ffn, layer.ff, layer.norm2)
    for ls, layer in zip(dec.layer, model.decoder_layers):
        _attention(ls.self_attention, layer.self_attn, layer.norm1, True)
        _attention(ls.attention, layer.cross_attn, layer.norm2, False)
        _ffn(ls.ffn, layer.ff, layer.norm3)
    if cfg.norm_first:
        _norm(enc.layer_norm, model.encoder_norm)
        _norm(dec.layer_norm, model.decoder_norm)
    _linear(dec.projection, model.output_proj.weight)  # no bias
    spec.register_source_vocabulary(src_tok.pieces(range(src_tok.vocab_size)))
    spec.register_target_vocabulary(tgt_tok.pieces(range(tgt_tok.vocab_size)))
    spec.config.add_source_eos = True  # our encoder reads x + [eos]
    spec.config.layer_norm_epsilon = float(model.encoder_layers[0].norm1.eps)
    spec.validate()
    spec.optimize(quantization=QUANTIZATIONS[quantization])  # (equal arrays stored once)
    return spec
