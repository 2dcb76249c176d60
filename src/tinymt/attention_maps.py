"""Every head's attention map of one sentence: collected from the model, drawn as figures.

The trainer draws these for TensorBoard at every validation, ``translate.py attention=``
writes them as PNGs, and both go through the same two functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from matplotlib.figure import Figure

from tinymt import KINDS
from tinymt.batching import collate
from tinymt.model import Transformer
from tinymt.plotting import attention_grid
from tinymt.runtime import eval_mode
from tinymt.tokenizer import Tokenizer


def collect_attention(model: Transformer, src_ids: Sequence[int], out_ids: Sequence[int],
                      device="cpu") -> dict[str, list[np.ndarray]]:
    """Every head's attention for one sentence and its translation (teacher-forced).

    Returns ``{kind: [layer -> (heads, T_query, T_key) array]}``. Source positions are
    ``src_ids + [eos]``; decoder positions are ``[bos] + out_ids`` (queries) whose
    predictions are ``out_ids + [eos]``.
    """
    batch = collate([list(src_ids)], [list(out_ids)]).to(device)
    with eval_mode(model, inference=True):
        _, attn = model(batch.src, batch.tgt_in, need_weights=True)
        return {k: [w[0].float().cpu().numpy() for w in attn[k]] for k in KINDS}


def attention_figures(attn: dict[str, list[np.ndarray]], src_tok: Tokenizer, tgt_tok: Tokenizer,
                      src_ids: Sequence[int], out_ids: Sequence[int],
                      kinds: Sequence[str] = ("cross",), title: str = ""
                      ) -> Iterator[tuple[str, Figure]]:
    """Yield ``("<kind>/layer_<l>", figure)``: rows = the token each query position
    predicts (decoder) or reads (encoder), columns = the tokens it attends to."""
    src_labels = src_tok.pieces(list(src_ids)) + ["</s>"]
    dec_in = ["<s>"] + tgt_tok.pieces(list(out_ids))
    dec_out = tgt_tok.pieces(list(out_ids)) + ["</s>"]
    axes = {"encoder_self": (src_labels, src_labels), "decoder_self": (dec_out, dec_in),
            "cross": (dec_out, src_labels)}
    for kind in kinds:
        rows, cols = axes[kind]
        for layer, w in enumerate(attn[kind]):
            name = f"{kind} / layer {layer}" + (f" — {title}" if title else "")
            yield f"{kind}/layer_{layer}", attention_grid(w, rows, cols, title=name)
