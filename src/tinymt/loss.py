"""The training loss: label-smoothed cross-entropy of the next target token (section 5.4).

Label smoothing is PyTorch's (``F.cross_entropy(label_smoothing=eps)``): the target
distribution is ``q = (1 - eps) * onehot(y) + eps / V``, so a token's loss is
``-sum_v q_v log softmax(z)_v``. Padding positions count for nothing. The sums are returned
(not means): divide by the number of target tokens.

:func:`tinymt.speed.linear_cross_entropy` computes the same sum as :func:`sequence_loss`
faster on a CPU (the CPU training step uses it; tested equal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def token_nll(logits: Tensor, targets: Tensor, pad_id: int,
              label_smoothing: float = 0.0) -> Tensor:
    """Summed cross-entropy of ``logits`` ``(B, T, V)`` (or ``(N, V)``) against ``targets``
    ``(B, T)`` (or ``(N,)``), in at least float32 (also under bf16 autocast)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=pad_id, label_smoothing=label_smoothing,
                           reduction="sum")


def sequence_loss(hidden: Tensor, weight: Tensor, targets: Tensor, pad_id: int,
                  label_smoothing: float = 0.0) -> Tensor:
    """The summed loss of the decoder's hidden states ``(B, T, d)`` through the output
    projection ``weight`` ``(V, d)`` against ``targets`` ``(B, T)`` (``tgt_out``)."""
    return token_nll(F.linear(hidden, weight), targets, pad_id, label_smoothing)  # (B, T, V)
