"""The heads of a model as ``(kind, layer, head)``, gates that scale or switch some off (a
forward pre-hook on each attention's ``out_proj``: the core is unchanged), what a pruned
head is (zero ``W_O`` columns: the same as a gate of 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from tinymt.model import Transformer


def attention_modules(model: Transformer) -> dict[str, list[torch.nn.Module]]:
    """``{kind: [MultiHeadAttention of layer 0, 1, ...]}``."""
    return {"encoder_self": [layer.self_attn for layer in model.encoder_layers],
            "decoder_self": [layer.self_attn for layer in model.decoder_layers],
            "cross": [layer.cross_attn for layer in model.decoder_layers]}


def head_shapes(model: Transformer) -> dict[str, tuple[int, int]]:
    """``{kind: (n_layers, n_heads)}``."""
    return {k: (len(mods), model.n_heads) for k, mods in attention_modules(model).items()}


def all_heads(model: Transformer) -> list[tuple[str, int, int]]:
    """Every head as ``(kind, layer, head)``."""
    return [(k, layer, h) for k, (n_layers, n_heads) in head_shapes(model).items()
            for layer in range(n_layers) for h in range(n_heads)]


def gates_without(model: Transformer, heads: Sequence[tuple[str, int, int]],
                  device=None) -> dict[str, torch.Tensor]:
    """Gates of ones with a 0 at each of ``heads``: ``{kind: (n_layers, n_heads)}``."""
    device = device or model.output_proj.weight.device
    gates = {k: torch.ones(shape, device=device) for k, shape in head_shapes(model).items()}
    for kind, layer, h in heads:
        gates[kind][layer, h] = 0.0
    return gates


@contextlib.contextmanager
def gated_heads(model: Transformer, gates: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """Inside the block, head ``i`` of layer ``l`` of ``kind`` has its context multiplied by
    ``gates[kind][l, i]`` (gates ``(n_layers, h)``, or ``(n_layers, B, h)``: one per
    sentence). Differentiable: head importance is ``|d loss / d gate|``."""
    hooks = []

    def hook_for(gate: torch.Tensor):
        def scale(module, args):
            ctx = args[0]  # (B, T, h * d_head): the heads, concatenated
            B, T, d = ctx.shape
            g = gate if gate.dim() == 1 else gate[:, None, :]  # (h,) or (B, 1, h)
            heads = ctx.view(B, T, model.n_heads, d // model.n_heads)  # (B, T, h, d_head)
            return ((heads * g[..., None].to(ctx.dtype)).view(B, T, d),)
        return scale

    try:
        for kind, mods in attention_modules(model).items():
            if gates is not None and kind in gates:
                for layer, mha in enumerate(mods):
                    hooks.append(mha.out_proj.register_forward_pre_hook(
                        hook_for(gates[kind][layer])))
        yield
    finally:
        for h in hooks:
            h.remove()


def prune_weights(model_state: dict, heads: Sequence[tuple[str, int, int]], n_heads: int) -> dict:
    """A copy of the state dict ``model_state`` with the ``W_O`` columns of ``heads``
    zeroed: those heads then contribute nothing, exactly as a gate of 0."""
    model = dict(model_state)
    for kind, layer, h in heads:
        stack = "encoder" if kind == "encoder_self" else "decoder"
        name = f"{stack}_layers.{layer}.{kind.split('_')[-1]}_attn.out_proj.weight"  # W_O
        w = model[name] = model[name].clone()  # (d, h * d_head)
        w.view(w.size(0), n_heads, -1)[:, h] = 0.0
    return model
