"""Fast paths of the CPU training step, beside the core and tested equal to it.

* :func:`linear_cross_entropy`: the same sum as :func:`tinymt.loss.sequence_loss` without
  ever holding the ``(N, V)`` logits: rows go through in chunks of :data:`CHUNK_ROWS`, and
  each chunk's gradients with respect to ``hidden`` and ``weight`` are computed right
  there, while its logits are still in cache (the softmax's gradient is ``p - q``, no
  autograd graph needed), over the non-padding positions only. Under autocast (bf16), on a
  GPU or without gradients it is ``sequence_loss`` itself.
* :class:`BitDropout`: ``nn.Dropout`` with the CPU mask drawn from 16 random bits per
  element (about 3x cheaper than ``torch.bernoulli_``); :func:`use_bit_dropout` swaps it
  into a model.

The label-smoothed row loss is ``logsumexp(z) - (1 - eps) * z[y] - eps / V * sum(z)`` and
its gradient ``softmax(z) - q``.

>>> import torch
>>> from tinymt.loss import sequence_loss
>>> _ = torch.manual_seed(0)
>>> h, w = torch.randn(5, 4, requires_grad=True), torch.randn(7, 4)
>>> y = torch.tensor([1, 0, 6, 2, 2])                 # 0 is padding here
>>> fused = linear_cross_entropy(h, w, y, pad_id=0, label_smoothing=0.1)
>>> torch.allclose(fused, sequence_loss(h, w, y, pad_id=0, label_smoothing=0.1))
True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tinymt.loss import sequence_loss

CHUNK_ROWS = 512  # rows per chunk: a 512 x 8,000 fp32 chunk of logits is 16 MB


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, pad_id: int,
                         label_smoothing: float = 0.0) -> Tensor:
    """:func:`tinymt.loss.sequence_loss` of ``hidden`` ``(B, T, d)``, ``weight`` ``(V, d)``
    and ``targets`` ``(B, T)``, chunked and fused (module docstring) where that pays: on a
    CPU, outside autocast, with a gradient to compute. Otherwise ``sequence_loss`` itself,
    whose shapes do not depend on the padding (what ``torch.compile`` on a GPU wants)."""
    fused = (hidden.device.type == "cpu" and torch.is_grad_enabled()
             and (hidden.requires_grad or weight.requires_grad)
             and not torch.is_autocast_enabled("cpu")
             and hidden.dtype == weight.dtype and hidden.dtype in (torch.float32, torch.float64))
    if not fused:
        return sequence_loss(hidden, weight, targets, pad_id, label_smoothing)
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


class BitDropout(nn.Module):
    """``nn.Dropout(p)`` whose CPU mask comes from 16 random bits per element (``int64``
    draws viewed as four ``int16``): an element is kept when its bits are at least
    ``round(p * 2^16)``, so ``p`` is rounded to a multiple of 2^-16 and the scale uses the
    rounded value (the expectation stays exact). Elsewhere it is ``F.dropout``.

    >>> _ = torch.manual_seed(0)
    >>> drop = BitDropout(0.25)
    >>> y = drop(torch.ones(10_000))
    >>> sorted(set(y.tolist()))
    [0.0, 1.3333333730697632]
    >>> round(float(y.eq(0).float().mean()), 2)
    0.25
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p >= 1.0:
            return F.dropout(x, self.p, True)
        cut = round(self.p * 65536)  # drop when the 16 bits, read unsigned, are below this
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        keep = bits.view(torch.int16)[:n].view(x.shape) >= cut - 32768  # signed view
        scale = 65536 / (65536 - cut)
        return x * torch.where(keep, scale, 0.0).to(x.dtype)


def use_bit_dropout(model: nn.Module) -> nn.Module:
    """Replace every ``nn.Dropout`` of ``model`` by a :class:`BitDropout` of the same ``p``
    (no parameters change); returns ``model``."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, BitDropout(child.p).train(child.training))
    return model
