"""AdamW and the learning-rate schedule (warm-up, then inverse-sqrt, cosine or constant)."""

from __future__ import annotations

import math

import torch
from omegaconf import DictConfig


def lr_factor(step: int, warmup: int, schedule: str, max_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (1-based)."""
    if step <= warmup:
        return step / warmup
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / step)
    if schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0  # constant (the config allows these three)


def build_optimizer(model: torch.nn.Module, oc: DictConfig, max_steps: int, device: torch.device):
    """AdamW (the fused kernel on a CPU or CUDA when ``optim.fused``) and its ``LambdaLR``
    schedule."""
    fused = oc.fused and device.type in ("cpu", "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=oc.lr, betas=tuple(oc.betas),
                                  eps=oc.eps, weight_decay=oc.weight_decay, fused=fused or None)
    min_ratio = oc.min_lr / oc.lr  # (the config keeps lr > 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s + 1, oc.warmup_steps, oc.schedule, max_steps, min_ratio))
    return optimizer, scheduler
