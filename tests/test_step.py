"""One training step (tinymt.step) against the step written plainly: the mean smoothed
cross-entropy over the real target tokens, its gradient by autograd on that formula, the
global-norm clip by its definition and a plain SGD update."""

import math

import pytest
import torch

from tinymt.batching import collate
from tinymt.config import ModelConfig
from tinymt.model import Transformer
from tinymt.step import train_step, update

PAD = 0


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=16,
                      dropout=0.0, max_positions=16)
    return Transformer(cfg, 12, 12, shared_vocab=True).double()


def plain_loss(model, batch, eps):
    """sum over real target tokens of -sum_v q_v log softmax(z)_v, q = (1-eps) onehot + eps/V,
    divided by their number."""
    hidden, _ = model(batch.src, batch.tgt_in)
    z = model.logits(hidden)[batch.tgt_out != PAD]
    y = batch.tgt_out[batch.tgt_out != PAD]
    logp = z - z.exp().sum(-1, keepdim=True).log()
    q = torch.full_like(z, eps / z.size(-1))
    q[torch.arange(len(y)), y] += 1 - eps
    return -(q * logp).sum() / len(y)


BATCH = collate([[4, 5, 6], [7]], [[8, 9], [10, 11, 4, 5]])  # 3 + 5 target tokens


@pytest.mark.parametrize("eps,clip", [(None, None), (0.1, 0.0), (0.1, 0.05)])
def test_train_step_is_the_plain_step(eps, clip):
    """(None: the defaults, no smoothing and no clipping.)"""
    model = tiny_model().eval()  # train_step switches it to training itself
    ref = tiny_model()
    kw = {} if eps is None else {"label_smoothing": eps, "clip_grad_norm": clip}
    eps, clip = (0.0, 0.0) if eps is None else (eps, clip)
    loss = plain_loss(ref, BATCH, eps)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    norm = math.sqrt(sum(float((g**2).sum()) for g in grads))
    scale = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0  # torch's clip_grad_norm_
    for p in model.parameters():  # stale gradients: must not leak into the step
        p.grad = torch.ones_like(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.1 if s else 1.0)
    got = train_step(model, BATCH, opt, sched, **kw)
    assert model.training
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)  # the schedule stepped after
    assert got == pytest.approx(loss.item(), rel=1e-12)
    with torch.no_grad():
        for (name, p), q, g in zip(model.named_parameters(), ref.parameters(), grads):
            torch.testing.assert_close(p, q - 0.5 * scale * g, msg=name)


def test_update_clips_to_the_global_norm_and_steps_the_schedule():
    w = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(1))
    model = torch.nn.Module()
    model.w, model.b = w, b
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    w.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])  # global norm 5
    norm = update(model, opt, sched, clip_grad_norm=1.0)
    assert norm.item() == pytest.approx(5.0)  # before clipping
    c = 1.0 / (5.0 + 1e-6)
    torch.testing.assert_close(w.detach(), torch.tensor([-3.0 * c, 0.0]))
    torch.testing.assert_close(b.detach(), torch.tensor([-4.0 * c]))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)  # the schedule took one step

    w.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    before = w.detach().clone()
    assert update(model, opt).item() == pytest.approx(5.0)  # default: measure, no clip
    torch.testing.assert_close(w.detach(), before - 0.5 * torch.tensor([3.0, 0.0]))  # unclipped
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)  # no schedule: unchanged
