"""Pruning heads without retraining: the order (least important first), the BLEU curves,
"prunable", and the state of a checkpoint whose persistent head masks prune."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tinymt.decoding import translate_ids
from tinymt.heads.gates import gates_without, progress_bar
from tinymt.metrics import score
from tinymt.model import KINDS, Transformer

CURVES = ("all", *KINDS)
BLEU_DROP = 1.0  # "prunable" = BLEU within this many points of the unpruned model
# what a pruned checkpoint leaves out: it is for translating, not for resuming training
TRAINING_STATE = ("optimizer", "scheduler", "rng", "sampler")


def prune_order(importance: dict[str, np.ndarray],
                kinds: Sequence[str] = KINDS) -> list[tuple[str, int, int]]:
    """Heads of ``kinds``, least important first (ties: kind, layer, head order)."""
    heads = [(float(importance[k][layer, h]), KINDS.index(k), layer, h)
             for k in kinds for layer in range(importance[k].shape[0])
             for h in range(importance[k].shape[1])]
    return [(KINDS[ki], layer, h) for _, ki, layer, h in sorted(heads)]


def prune_counts(n_heads: int, step: float) -> list[int]:
    """Numbers of heads masked at the steps ``0, step, 2 step, ..., 1`` (deduplicated)."""
    n_steps = max(1, math.ceil(1.0 / step - 1e-9))
    counts = [round(min(1.0, i * step) * n_heads) for i in range(n_steps + 1)]
    return sorted(set(counts) | {0, n_heads})


def prunable(points: Sequence[tuple[int, float]], base: float,
             drop: float = BLEU_DROP) -> int:
    """Most heads masked (of ``(n_masked, bleu)`` points, in order) before BLEU first falls
    more than ``drop`` below ``base``."""
    best = 0
    for n, bleu in sorted(points):
        if bleu < base - drop:
            break
        best = n
    return best


def gated_bleu(model: Transformer, src_ids, refs: Sequence[str], tgt_tokenizer, tgt_lang,
               gates: dict[str, torch.Tensor] | None, batch_tokens: int = 4096,
               device="cpu") -> float:
    """sacreBLEU of the greedy translations of ``src_ids`` with ``head_gates=gates``."""
    outs = translate_ids(model, src_ids, batch_tokens=batch_tokens, device=device,
                         head_gates=gates)
    return score([tgt_tokenizer.decode(o[0][0]) for o in outs], list(refs), tgt_lang)[0]


def pruning_curves(model: Transformer, src_ids, refs: Sequence[str], tgt_tokenizer, tgt_lang,
                   importance: dict[str, np.ndarray], step: float = 0.1,
                   batch_tokens: int = 4096, device="cpu", progress: bool = False) -> dict:
    """BLEU after masking the least important heads, ``step`` of them at a time.

    Returns ``{"base": bleu, "curves": {curve: [(n_masked, n_total, bleu), ...]},
    "prunable": {curve: n_heads}}`` for the curves ``all`` and each kind.
    """
    cache: dict[frozenset, float] = {}

    def bleu_without(heads) -> float:
        key = frozenset(heads)
        if key not in cache:
            cache[key] = gated_bleu(model, src_ids, refs, tgt_tokenizer, tgt_lang,
                                    gates_without(model, heads, device), batch_tokens, device)
        return cache[key]

    plan = []
    for curve in CURVES:
        order = prune_order(importance, KINDS if curve == "all" else (curve,))
        plan += [(curve, n, order) for n in prune_counts(len(order), step)]
    curves: dict[str, list[tuple[int, int, float]]] = {c: [] for c in CURVES}
    it = progress_bar(plan, desc="pruning", unit="step") if progress else plan
    for curve, n, order in it:
        curves[curve].append((n, len(order), bleu_without(order[:n])))
    base = cache[frozenset()]
    return {"base": base, "curves": curves,
            "prunable": {c: prunable([(n, b) for n, _, b in pts], base)
                         for c, pts in curves.items()}}


def pruned_state(saved: dict, masks: dict[str, torch.Tensor],
                 heads: Sequence[tuple[str, int, int]], fraction: float,
                 source: Path) -> dict:
    """Checkpoint ``saved`` with its head masks multiplied by ``masks`` (CPU tensors, see
    :func:`~tinymt.heads.gates.gates_without`), without the training state, and a
    ``"pruned"`` entry saying which ``heads`` were masked."""
    state = {key: v for key, v in saved.items() if key not in TRAINING_STATE}
    state["model"] = dict(state["model"])
    for kind in KINDS:
        old = state["model"].get(f"head_mask_{kind}")
        mask = masks[kind] if old is None else masks[kind] * old.float().cpu()
        state["model"][f"head_mask_{kind}"] = mask
    state["pruned"] = {"fraction": fraction, "heads": [list(h) for h in heads],
                       "from": str(source)}
    return state
