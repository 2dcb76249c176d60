"""tinymt.speed.BitDropout: the CPU mask from 16 random bits per element, checked for what
dropout is (keep rate, scale, independence, gradient) within sampling error."""

from __future__ import annotations

import math

import pytest
import torch

from tinymt.speed import BitDropout, use_bit_dropout

N = 400_000  # elements per draw


def _sigmas(count: float, n: int, prob: float) -> float:
    """How many binomial standard deviations ``count`` is from ``n * prob``."""
    return abs(count - n * prob) / math.sqrt(n * prob * (1 - prob))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_scale_and_lanes(p):
    """Every one of the four 16-bit lanes of a 64-bit draw keeps 1 - p of its elements (a
    lane with a fixed bit, e.g. a sign bit never set, would keep far more or fewer); kept
    elements are scaled so the mean stays the input's."""
    torch.manual_seed(1)
    x = torch.ones(N)
    y = BitDropout(p).train()(x)
    kept = y.ne(0)
    scale = y[kept].unique()
    assert len(scale) == 1
    p_used = 1 - 1 / scale.item()  # the scale is 1 / (1 - p rounded to 2^-16)
    assert abs(p_used - p) <= 2**-16
    for lane in range(4):
        lane_kept = kept[lane::4]
        assert _sigmas(lane_kept.sum().item(), lane_kept.numel(), 1 - p_used) < 5, lane
    assert abs(y.mean().item() - 1) < 5 * math.sqrt(p / (1 - p) / N)


def test_neighbours_are_independent():
    """Pairs of neighbouring elements (in the same 64-bit draw and across draws) are both
    kept with probability (1 - p)^2."""
    torch.manual_seed(2)
    p = 0.3
    kept = BitDropout(p).train()(torch.ones(N)).ne(0)
    for offset in (1, 3, 4):
        both = (kept[:-offset] & kept[offset:]).sum().item()
        assert _sigmas(both, N - offset, (1 - p) ** 2) < 5, offset


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(3)
    x = torch.randn(64, 33, requires_grad=True)
    y = BitDropout(0.2).train()(x)
    g = torch.randn_like(y)
    y.backward(g)
    mask = y.detach() / x.detach()  # 0 or the scale, element by element
    torch.testing.assert_close(x.grad, g * mask)


def test_eval_zero_one_seed_and_dtype():
    x = torch.randn(5, 7)
    assert BitDropout(0.3).eval()(x) is x
    assert BitDropout(0.0).train()(x) is x
    assert BitDropout(1.0).train()(x).abs().max() == 0
    torch.manual_seed(4)
    a = BitDropout(0.3).train()(x)
    torch.manual_seed(4)
    b = BitDropout(0.3).train()(x)
    assert a.equal(b)  # seeded by torch's generator: resume and ranks draw the same
    assert BitDropout(0.3).train()(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert BitDropout(0.3).train()(x.double()).dtype == torch.float64


def test_use_bit_dropout_swaps_every_dropout_and_nothing_else():
    from tinymt.config import ModelConfig
    from tinymt.model import Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.2), 30, 30, True)
    n_before = sum(isinstance(m, torch.nn.Dropout) for m in model.modules())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    use_bit_dropout(model)
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    assert sum(isinstance(m, BitDropout) and m.p == 0.2 for m in model.modules()) == n_before > 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
