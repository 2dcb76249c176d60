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
        N, V = hidden.size(0), weight.size(0)
        z_buf = hidden.new_empty(min(N, CHUNK_ROWS), V)  # a chunk's logits, reused
        g_buf = torch.empty_like(z_buf)  # its log-softmax, then its dloss/dz
        w_sum = weight.sum(0)  # (d,): a row's sum of logits is h @ w_sum, no pass over z
        grad_hidden = torch.empty_like(hidden)  # (N, d)
        grad_weight = torch.zeros_like(weight) if N == 0 else torch.empty_like(weight)
        total = hidden.new_zeros(())
        for start in range(0, N, CHUNK_ROWS):
            h = hidden[start : start + CHUNK_ROWS]  # (n, d)
            n = h.size(0)
            y = targets[start : start + CHUNK_ROWS, None]  # (n, 1)
            z = torch.mm(h, weight.T, out=z_buf[:n])  # (n, V) logits
            g = torch.log_softmax(z, 1, out=g_buf[:n])  # (n, V) z - lse
            g_y = g.gather(1, y)  # (n, 1) log p(y)
            lse = z.gather(1, y) - g_y  # (n, 1)
            # loss = -sum_v q_v log p_v, q = (1 - eps) onehot(y) + eps / V, and
            # sum_v log p_v = sum_v z_v - V lse
            total -= (1 - eps) * g_y.sum() + (eps / V) * ((h @ w_sum).sum() - V * lse.sum())
            # g becomes dloss/dz + eps / V = softmax(z) - (1 - eps) onehot(y), in place; the
            # uniform -eps / V is added to both gradients after the loop, as rank-one terms
            g.exp_().scatter_add_(1, y, g.new_full(y.shape, eps - 1))
            torch.mm(g, weight, out=grad_hidden[start : start + n])  # (n, d)
            if start == 0:
                torch.mm(g.T, h, out=grad_weight)  # (V, d)
            else:
                grad_weight.addmm_(g.T, h)
        grad_hidden.sub_(w_sum, alpha=eps / V)  # sum_v (eps / V) W_v, every row
        grad_weight.sub_(hidden.sum(0), alpha=eps / V)  # sum_n (eps / V) h_n, every row
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_total: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_total, grad_weight * grad_total, None, None
