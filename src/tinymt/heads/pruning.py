"""Head importance (Michel et al., 2019) and pruning without retraining: the order (least
important first), the BLEU curves, "prunable", and a checkpoint whose pruned heads' ``W_O``
columns are zero."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import takewhile
from pathlib import Path

import numpy as np
import torch

from tinymt import KINDS
from tinymt.batching import eval_batches
from tinymt.checkpoint import TRAINING_STATE
from tinymt.decoding import translate_ids
from tinymt.heads.gates import gated_heads, gates_without, head_shapes, prune_weights
from tinymt.loss import sequence_loss
from tinymt.metrics import score
from tinymt.model import Transformer
from tinymt.runtime import eval_mode, progress_bar

CURVES = ("all", *KINDS)
BLEU_DROP = 1.0  # "prunable" = BLEU within this many points of the unpruned model


def head_importance(model: Transformer, src_ids: Sequence[Sequence[int]],
                    tgt_ids: Sequence[Sequence[int]], batch_tokens: int = 4096, device="cpu",
                    progress: bool = False) -> dict[str, np.ndarray]:
    """Raw importance ``E_x |dL(x)/dxi_h|`` per head: ``{kind: (n_layers, n_heads)}``.

    Every head gets a gate ``xi = 1`` per sentence, so one backward pass gives each
    sentence's own gradient. ``L(x)`` is sentence ``x``'s summed NLL (eval mode, no label
    smoothing); the sum of the absolute gradients is divided by the number of target tokens
    (EOS included). A pruned head (zero ``W_O`` columns) has importance exactly 0.
    """
    shapes = head_shapes(model)
    total = {k: torch.zeros(shape, dtype=torch.float64) for k, shape in shapes.items()}
    n_tokens = 0
    batches = eval_batches(src_ids, tgt_ids, batch_tokens)
    with eval_mode(model):
        for idx, batch in progress_bar(batches, desc="importance", unit="batch",
                                       disable=not progress):
            batch = batch.to(device)
            gates = {k: torch.ones(n_layers, len(idx), n_heads, device=device,
                                   requires_grad=True) for k, (n_layers, n_heads) in shapes.items()}
            with torch.enable_grad(), gated_heads(model, gates):
                hidden, _ = model(batch.src, batch.tgt_in)  # (B, T, d)
                loss = sequence_loss(hidden, model.output_proj.weight, batch.tgt_out, model.pad_id)
                grads = torch.autograd.grad(loss, [gates[k] for k in KINDS])
            for k, g in zip(KINDS, grads):
                total[k] += g.abs().sum(dim=1).cpu().double()  # sum over sentences
            n_tokens += batch.n_tgt_tokens
    return {k: (v / max(n_tokens, 1)).numpy() for k, v in total.items()}


def normalize_importance(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Divide each layer's scores by their L2 norm (Michel et al.); all-zero layers stay 0."""
    out = {}
    for k, v in raw.items():
        norm = np.linalg.norm(v, axis=1, keepdims=True)
        out[k] = np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)
    return out


def prune_order(importance: dict[str, np.ndarray],
                kinds: Sequence[str] = KINDS) -> list[tuple[str, int, int]]:
    """Heads of ``kinds``, least important first (ties: kind, layer, head order)."""
    heads = [(float(importance[k][layer, h]), KINDS.index(k), layer, h)
             for k in kinds for (layer, h) in np.ndindex(importance[k].shape)]
    return [(KINDS[ki], layer, h) for _, ki, layer, h in sorted(heads)]


def prune_counts(n_heads: int, step: float) -> list[int]:
    """Numbers of heads masked at the steps ``0, step, 2 step, ..., 1`` (deduplicated)."""
    n_steps = max(1, math.ceil(1.0 / step - 1e-9))
    counts = [round(min(1.0, i * step) * n_heads) for i in range(n_steps + 1)]
    return sorted(set(counts) | {0, n_heads})


def prunable(points: Sequence[tuple[int, float]], base: float) -> int:
    """Most heads masked (of ``(n_masked, bleu)`` points, in order) before BLEU first falls
    more than :data:`BLEU_DROP` below ``base``."""
    kept = list(takewhile(lambda p: not p[1] < base - BLEU_DROP, sorted(points)))
    return kept[-1][0] if kept else 0


def gated_bleu(model: Transformer, src_ids, refs: Sequence[str], tgt_tokenizer, tgt_lang,
               gates: dict[str, torch.Tensor] | None, batch_tokens: int = 4096,
               device="cpu") -> float:
    """sacreBLEU of the greedy translations of ``src_ids`` with the heads gated by ``gates``."""
    with gated_heads(model, gates):
        outs = translate_ids(model, src_ids, batch_tokens=batch_tokens, device=device)
    return score([tgt_tokenizer.decode(o[0][0]) for o in outs], list(refs), tgt_lang)[0]


def pruning_curves(model: Transformer, src_ids, refs: Sequence[str], tgt_tokenizer, tgt_lang,
                   importance: dict[str, np.ndarray], step: float = 0.1,
                   batch_tokens: int = 4096, device="cpu", progress: bool = False) -> dict:
    """BLEU after masking the least important heads, ``step`` of them at a time.

    Returns ``{"base": bleu, "curves": {curve: [(n_masked, n_total, bleu), ...]},
    "prunable": {curve: n_heads}}`` for the curves ``all`` and each kind.
    """
    cache: dict[frozenset, float] = {}
    plan = []
    for curve in CURVES:
        order = prune_order(importance, KINDS if curve == "all" else (curve,))
        plan += [(curve, n, order) for n in prune_counts(len(order), step)]
    curves: dict[str, list[tuple[int, int, float]]] = {c: [] for c in CURVES}
    for curve, n, order in progress_bar(plan, desc="pruning", unit="step", disable=not progress):
        key = frozenset(order[:n])
        if key not in cache:
            cache[key] = gated_bleu(model, src_ids, refs, tgt_tokenizer, tgt_lang,
                                    gates_without(model, key, device), batch_tokens, device)
        curves[curve].append((n, len(order), cache[key]))
    base = cache[frozenset()]
    return {"base": base, "curves": curves,
            "prunable": {c: prunable([(n, b) for n, _, b in pts], base)
                         for c, pts in curves.items()}}


def pruned_state(saved: dict, heads: Sequence[tuple[str, int, int]], fraction: float,
                 source: Path) -> dict:
    """Checkpoint ``saved`` with ``heads`` switched off (their ``W_O`` columns zeroed),
    without the training state (its ``trainer_state`` kept, as averaging keeps it), and a
    ``"pruned"`` entry saying which heads those are."""
    state = {key: v for key, v in saved.items() if key not in TRAINING_STATE[1:]}
    state["model"] = prune_weights(state["model"], heads, saved["model_config"]["n_heads"])
    state["pruned"] = {"fraction": fraction, "heads": [list(h) for h in heads], "from": str(source)}
    return state
