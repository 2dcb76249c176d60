"""The learning-rate schedule (tinymt.trainer.optim.lr_factor) against its formulas written
plainly: the paper's warm-up then inverse square root (Vaswani et al. 2017, 5.3), cosine
decay to ``min_ratio``, and constant; every value below worked out by hand."""

import math

import pytest

from tinymt.trainer.optim import lr_factor


def paper_lrate(step: int, warmup: int) -> float:
    """The paper's ``d^-0.5 * min(step^-0.5, step * warmup^-1.5)`` without the ``d^-0.5``,
    over its peak ``warmup^-0.5``: the multiplier of the peak learning rate."""
    return min(step**-0.5, step * warmup**-1.5) / warmup**-0.5


@pytest.mark.parametrize("step", [1, 2, 7, 10, 11, 40, 1000])
def test_inverse_sqrt_is_the_papers_formula(step):
    assert lr_factor(step, 10, "inverse_sqrt", 100, 0.0) == pytest.approx(paper_lrate(step, 10))


def test_warmup_is_linear_from_the_first_step():
    assert lr_factor(1, 4, "constant", 100, 0.0) == pytest.approx(0.25)
    assert lr_factor(3, 4, "cosine", 100, 0.0) == pytest.approx(0.75)


def test_without_warmup():
    assert lr_factor(1, 0, "inverse_sqrt", 100, 0.0) == pytest.approx(1.0)
    assert lr_factor(4, 0, "inverse_sqrt", 100, 0.0) == pytest.approx(0.5)  # 1 / sqrt(4)
    assert lr_factor(1, 0, "constant", 100, 0.0) == 1.0
    # cosine from step 0 over 8 steps: step 2 is a quarter of the way, cos(pi/4)
    assert lr_factor(2, 0, "cosine", 8, 0.0) == pytest.approx(0.5 * (1 + math.sqrt(0.5)))


def test_cosine_decays_from_one_to_min_ratio_and_stays_there():
    w, n, m = 10, 110, 0.2  # 100 decay steps after the warm-up
    assert lr_factor(10, w, "cosine", n, m) == pytest.approx(1.0)
    assert lr_factor(35, w, "cosine", n, m) == pytest.approx(m + (1 - m) * 0.5 * (1 + math.sqrt(0.5)))
    assert lr_factor(60, w, "cosine", n, m) == pytest.approx(0.6)  # half way: (1 + m) / 2
    assert lr_factor(85, w, "cosine", n, m) == pytest.approx(m + (1 - m) * 0.5 * (1 - math.sqrt(0.5)))
    assert lr_factor(110, w, "cosine", n, m) == pytest.approx(m)
    assert lr_factor(500, w, "cosine", n, m) == pytest.approx(m)  # past max_steps: the floor
    # one decay step, or none: the floor right after the warm-up
    assert lr_factor(11, w, "cosine", 11, m) == pytest.approx(m)
    assert lr_factor(12, w, "cosine", 5, m) == pytest.approx(m)


def test_constant_after_warmup():
    assert lr_factor(11, 10, "constant", 100, 0.3) == 1.0
    assert lr_factor(10**6, 10, "constant", 100, 0.3) == 1.0
