"""One training step: teacher-forced forward pass, loss, backward pass, update.

    hidden = model(src, tgt_in)                 # the decoder's states (B, T, d)
    loss   = sequence_loss(hidden, W_out, tgt_out) / n_tokens
    loss.backward(); clip; optimizer.step(); scheduler.step()

The trainer (:mod:`tinymt.trainer.loop`) runs exactly these pieces, with gradient
accumulation, several processes and the CPU's fused loss (:mod:`tinymt.speed`) around them.
"""

from __future__ import annotations

import torch
from torch import nn

from tinymt.loss import sequence_loss


def update(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler=None,
           clip_grad_norm: float = 0.0) -> torch.Tensor:
    """Clip the gradients' global norm to ``clip_grad_norm`` (0: measure only), step the
    optimizer and the learning-rate schedule; returns the norm before clipping."""
    max_norm = clip_grad_norm if clip_grad_norm > 0 else float("inf")
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return grad_norm  # a tensor: reading it is a device sync


def train_step(model: nn.Module, batch, optimizer: torch.optim.Optimizer, scheduler=None,
               label_smoothing: float = 0.0, clip_grad_norm: float = 0.0) -> float:
    """Train on one :class:`tinymt.batching.Batch`; returns its mean token loss."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    hidden, _ = model(batch.src, batch.tgt_in)  # (B, T, d)
    loss_sum = sequence_loss(hidden, model.output_proj.weight, batch.tgt_out, model.pad_id,
                             label_smoothing)
    loss = loss_sum / batch.n_tgt_tokens  # mean over the real target tokens
    loss.backward()
    update(model, optimizer, scheduler, clip_grad_norm)
    return loss.item()
