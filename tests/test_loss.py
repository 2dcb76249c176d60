"""The token loss (tinymt.loss) against the loss written plainly from its definition, and
its fused, chunked form (tinymt.speed.linear_cross_entropy) against both."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tinymt import speed as loss_mod
from tinymt.config import ModelConfig
from tinymt.loss import sequence_loss, token_nll
from tinymt.model import Transformer
from tinymt.speed import linear_cross_entropy

PAD = 0


def smoothed_nll_by_definition(logits: torch.Tensor, targets: torch.Tensor, eps: float):
    """sum over non-pad rows of -sum_c q_c log softmax(z)_c, q = (1 - eps) onehot(y) + eps / V,
    written out without F.cross_entropy."""
    z = logits[targets != PAD]  # (N, V)
    y = targets[targets != PAD]  # (N,)
    V = z.size(1)
    logp = z - z.exp().sum(dim=1, keepdim=True).log()
    q = torch.full_like(z, eps / V)
    q[torch.arange(len(y)), y] += 1 - eps
    return -(q * logp).sum()


def _case(seed: int, B=5, T=9, d=6, V=11, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, d, generator=g, dtype=dtype)
    weight = torch.randn(V, d, generator=g, dtype=dtype)
    targets = torch.randint(1, V, (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    targets[torch.arange(T)[None, :] >= lengths[:, None]] = PAD  # right padding
    return hidden, weight, targets


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 7, 512])
def test_fused_loss_and_gradients_match_the_definition(monkeypatch, eps, chunk):
    """Value and both gradients (hidden, weight) under an upstream gradient != 1, with
    padding, with chunk boundaries inside the rows (1, 7) and one chunk (512)."""
    monkeypatch.setattr(loss_mod, "CHUNK_ROWS", chunk)
    for seed in range(3):
        hidden, weight, targets = _case(seed)
        h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        fused = linear_cross_entropy(h1, w1, targets, PAD, eps)
        (fused * 2.5).backward()
        h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        ref = smoothed_nll_by_definition(h2 @ w2.T, targets, eps)
        (ref * 2.5).backward()
        torch.testing.assert_close(fused, ref)
        torch.testing.assert_close(h1.grad, h2.grad)
        torch.testing.assert_close(w1.grad, w2.grad)
        assert h1.grad[targets == PAD].abs().max() == 0  # padding gets no gradient
        # and the plain form gives the same number
        torch.testing.assert_close(token_nll(hidden @ weight.T, targets, PAD, eps), ref)


def test_fused_loss_float32_and_tied_weight():
    """fp32 (the training dtype) within float rounding, and a weight also used elsewhere
    (tied embeddings): the fused gradient adds to the other use's gradient."""
    hidden, weight, targets = _case(4, B=16, T=30, d=32, V=500, dtype=torch.float32)
    results = []
    for fused in (True, False):
        w = weight.clone().requires_grad_()
        h = (hidden + w[:30].sum(0)).requires_grad_()  # another use of w
        if fused:
            loss = linear_cross_entropy(h, w, targets, PAD, 0.1)
        else:
            loss = token_nll(F.linear(h, w), targets, PAD, 0.1)
        loss.backward()
        results.append((loss.detach(), w.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-5)


def test_without_gradients_it_is_the_plain_loss():
    hidden, weight, targets = _case(5)
    with torch.no_grad():
        got = linear_cross_entropy(hidden, weight, targets, PAD, 0.1)
    torch.testing.assert_close(got, smoothed_nll_by_definition(hidden @ weight.T, targets, 0.1))


def test_all_padding_is_zero_loss_and_zero_gradient():
    hidden, weight, _ = _case(6)
    targets = torch.zeros(hidden.shape[:2], dtype=torch.long)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = linear_cross_entropy(h, w, targets, PAD, 0.1)
    loss.backward()
    assert loss.item() == 0 and h.grad.abs().max() == 0 and w.grad.abs().max() == 0


def test_the_training_step_fused_loss_equals_the_core_loss():
    """The trainer's fused loss on the model's hidden states: the same loss and the same
    gradient for every parameter as the core's ``sequence_loss`` (float64, no dropout, tied
    embeddings)."""
    cfg = ModelConfig(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32,
                      dropout=0.0, max_positions=32)
    torch.manual_seed(0)
    model = Transformer(cfg, 40, 40, shared_vocab=True).double().train()
    src = torch.randint(4, 40, (6, 7))
    src[0, 5:] = PAD
    tgt = torch.randint(4, 40, (6, 9))
    tgt[1, 3:] = PAD
    tgt[4, 6:] = PAD
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    grads = []
    for fused in (True, False):
        model.zero_grad()
        hidden, _ = model(src, tgt_in)
        loss = (linear_cross_entropy if fused else sequence_loss)(
            hidden, model.output_proj.weight, tgt_out, PAD, 0.1)
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    assert grads[0][1].keys() == grads[1][1].keys()
    for name in grads[0][1]:
        torch.testing.assert_close(grads[0][1][name], grads[1][1][name], msg=name)


def test_the_core_loss_is_the_definition_and_smooths_only_when_asked():
    hidden, weight, targets = _case(7)
    logits = hidden @ weight.T
    torch.testing.assert_close(sequence_loss(hidden, weight, targets, PAD),  # default: no smoothing
                               smoothed_nll_by_definition(logits, targets, 0.0))
    torch.testing.assert_close(token_nll(logits, targets, PAD),
                               smoothed_nll_by_definition(logits, targets, 0.0))
    torch.testing.assert_close(sequence_loss(hidden, weight, targets, PAD, 0.1),
                               smoothed_nll_by_definition(logits, targets, 0.1))


def test_bfloat16_logits_are_scored_in_float32():
    hidden, weight, targets = _case(8, dtype=torch.float32)
    logits = (hidden @ weight.T).to(torch.bfloat16)
    got = token_nll(logits, targets, PAD, 0.1)
    assert got.dtype == torch.float32  # not rounded to bf16's 8 bits of mantissa
    want = smoothed_nll_by_definition(logits.double(), targets, 0.1)
    assert abs(got.item() - want.item()) < 1e-4 * want.item()
