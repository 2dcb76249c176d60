"""The token loss, in one place, in two forms that give the same number.

- :func:`token_nll`: the summed (label-smoothed) cross-entropy of logits ``(..., V)``
  against targets; padding counts for nothing. Validation loss, head importance, and the
  reference the other form is tested against.
- :func:`linear_cross_entropy`: the same sum for ``logits = hidden @ weight.T`` without
  ever holding the ``(N, V)`` logits: rows go through in chunks of :data:`CHUNK_ROWS`, and
  each chunk's gradients with respect to ``hidden`` and ``weight`` are computed right there,
  while its logits are still in cache (the softmax's gradient is ``p - q``, no autograd
  graph needed). This is the training loss of a CPU run in fp32: on Multi30k batches it
  makes the output projection and the loss about a quarter cheaper (docs/benchmarks.md).
  Under autocast (bf16), on a GPU or without gradients it is :func:`token_nll` of
  ``F.linear(hidden, weight)``.

Label smoothing is PyTorch's (``F.cross_entropy(label_smoothing=eps)``): the target
distribution is ``q = (1 - eps) * onehot(y) + eps / V``, so a row's loss is
``logsumexp(z) - (1 - eps) * z[y] - eps / V * sum(z)`` and its gradient ``softmax(z) - q``.

>>> import torch
>>> _ = torch.manual_seed(0)
>>> h, w = torch.randn(5, 4, requires_grad=True), torch.randn(7, 4)
>>> y = torch.tensor([1, 0, 6, 2, 2])                 # 0 is padding here
>>> fused = linear_cross_entropy(h, w, y, pad_id=0, label_smoothing=0.1)
>>> plain = token_nll(h @ w.T, y, pad_id=0, label_smoothing=0.1)
>>> torch.allclose(fused, plain)
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ROWS = 512  # rows per chunk: a 512 x 8,000 fp32 chunk of logits is 16 MB


def token_nll(logits: Tensor, targets: Tensor, pad_id: int,
              label_smoothing: float = 0.0) -> Tensor:
    """Summed cross-entropy of ``logits`` ``(B, T, V)`` (or ``(N, V)``) against ``targets``
    ``(B, T)`` (or ``(N,)``).

    Padding positions (``targets == pad_id``) count for nothing. Computed in at least
    float32, also when the logits come out of bf16 autocast. Divide by the number of target tokens
    for a mean.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=pad_id, label_smoothing=label_smoothing,
                           reduction="sum")


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, pad_id: int,
                         label_smoothing: float = 0.0) -> Tensor:
    """Summed cross-entropy of ``hidden @ weight.T`` against ``targets``: the same number
    as ``token_nll(F.linear(hidden, weight), targets, pad_id, label_smoothing)``.

    Args:
        hidden: ``(B, T, d)`` (or ``(N, d)``) the decoder's final states.
        weight: ``(V, d)`` the output projection.
        targets: ``(B, T)`` (or ``(N,)``) target ids; ``pad_id`` positions count for nothing.
        label_smoothing: as in :func:`token_nll`.

    Returns a scalar. Chunked and fused over the non-padding positions (see the module
    docstring) when that pays: on a CPU, outside autocast, with a gradient to compute.
    Otherwise :func:`token_nll` of the logits, whose shapes do not depend on the padding
    (what ``torch.compile`` on a GPU wants).
    """
    fused = (hidden.device.type == "cpu" and torch.is_grad_enabled()
             and (hidden.requires_grad or weight.requires_grad)
             and not torch.is_autocast_enabled("cpu")
             and hidden.dtype == weight.dtype and hidden.dtype in (torch.float32, torch.float64))
    if not fused:
        return token_nll(F.linear(hidden, weight), targets, pad_id, label_smoothing)
    counts = targets.ne(pad_id)  # (B, T)
    return _LinearCrossEntropy.apply(hidden[counts], weight, targets[counts],
                                     float(label_smoothing))  # hidden[counts]: (N, d)


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and both gradients, chunk by chunk; backward scales them."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, eps: float) -> Tensor:
        V = weight.size(0)
        grad_hidden = torch.empty_like(hidden)  # (N, d)
        grad_weight = torch.zeros_like(weight)  # (V, d)
        total = hidden.new_zeros(())
        for start in range(0, hidden.size(0), CHUNK_ROWS):
            h = hidden[start : start + CHUNK_ROWS]  # (n, d)
            y = targets[start : start + CHUNK_ROWS, None]  # (n, 1)
            z = h @ weight.T  # (n, V) logits
            lse = torch.logsumexp(z, dim=1, keepdim=True)  # (n, 1)
            total += lse.sum() - (1 - eps) * z.gather(1, y).sum() - (eps / V) * z.sum()
            # z becomes dloss/dz = softmax(z) - q, in place
            z.sub_(lse).exp_().sub_(eps / V)
            z.scatter_add_(1, y, z.new_full(y.shape, eps - 1))
            torch.mm(z, weight, out=grad_hidden[start : start + CHUNK_ROWS])  # (n, d)
            grad_weight.addmm_(z.T, h)  # (V, d)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_total: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_total, grad_weight * grad_total, None, None
