"""Head importance (Michel et al., 2019): ``I_h = E_x |dL(x)/dxi_h|`` for a gate ``xi_h = 1``
on every head, then normalised per layer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tinymt.batching import eval_batches
from tinymt.heads.gates import head_shapes, progress_bar
from tinymt.loss import token_nll
from tinymt.model import KINDS, Transformer


def head_importance(model: Transformer, src_ids: Sequence[Sequence[int]],
                    tgt_ids: Sequence[Sequence[int]], batch_tokens: int = 4096, device="cpu",
                    progress: bool = False) -> dict[str, np.ndarray]:
    """Raw importance ``E_x |dL(x)/dxi_h|`` per head: ``{kind: (n_layers, n_heads)}``.

    ``L(x)`` is sentence ``x``'s summed NLL; the result is divided by the number of target
    tokens (EOS included). The model's persistent masks still apply (a masked head's
    effective gate is ``0 * xi``, so its importance is exactly 0).
    """
    was_training = model.training
    model.eval()
    shapes = head_shapes(model)
    total = {k: torch.zeros(shape, dtype=torch.float64) for k, shape in shapes.items()}
    n_tokens = 0
    batches = eval_batches(src_ids, tgt_ids, batch_tokens)
    it = progress_bar(batches, desc="importance", unit="batch") if progress else batches
    try:
        for idx, batch in it:
            batch = batch.to(device)
            B = len(idx)
            gates = {k: torch.ones(n_layers, B, n_heads, device=device, requires_grad=True)
                     for k, (n_layers, n_heads) in shapes.items()}  # one gate per sentence
            with torch.enable_grad():
                logits, _ = model(batch.src, batch.tgt_in, head_gates=gates)
                loss = token_nll(logits, batch.tgt_out, model.pad_id)
                grads = torch.autograd.grad(loss, [gates[k] for k in KINDS], allow_unused=True)
            for k, g in zip(KINDS, grads):
                if g is not None:
                    total[k] += g.abs().sum(dim=1).cpu().double()  # sum over sentences
            n_tokens += batch.n_tgt_tokens
    finally:
        model.train(was_training)
    return {k: (v / max(n_tokens, 1)).numpy() for k, v in total.items()}


def normalize_importance(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Divide each layer's scores by their L2 norm (Michel et al.); all-zero layers stay 0."""
    out = {}
    for k, v in raw.items():
        norm = np.linalg.norm(v, axis=1, keepdims=True)
        out[k] = np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)
    return out
