"""The heads of a model as ``(kind, layer, head)``, and gates that switch some off.

Also the progress bar the analysis steps share.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
from tqdm import tqdm

from tinymt.model import KINDS, Transformer

SELF_KINDS = ("encoder_self", "decoder_self")


def progress_bar(it, **kw):
    """``tqdm`` on stderr, redrawn at most once a second."""
    return tqdm(it, file=sys.stderr, dynamic_ncols=True, mininterval=1.0, **kw)


def head_shapes(model: Transformer) -> dict[str, tuple[int, int]]:
    """``{kind: (n_layers, n_heads)}``."""
    return {k: tuple(model.head_mask(k).shape) for k in KINDS}


def all_heads(model: Transformer) -> list[tuple[str, int, int]]:
    """Every head as ``(kind, layer, head)``."""
    return [(k, layer, h) for k, (n_layers, n_heads) in head_shapes(model).items()
            for layer in range(n_layers) for h in range(n_heads)]


def gates_without(model: Transformer, heads: Sequence[tuple[str, int, int]],
                  device=None) -> dict[str, torch.Tensor]:
    """Gates of ones with a 0 at each of ``heads``: ``{kind: (n_layers, n_heads)}``."""
    device = device or model.head_mask("cross").device
    gates = {k: torch.ones(shape, device=device) for k, shape in head_shapes(model).items()}
    for kind, layer, h in heads:
        gates[kind][layer, h] = 0.0
    return gates
