"""Token-budget sampler (determinism, budget, exact resume) and collate (shapes, masks)."""

import numpy as np
import pytest
import torch

from tinymt.batching import TokenBatchSampler, collate


@pytest.fixture(scope="module")
def lens():
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60, size=2000)
    tgt = np.clip(src + rng.integers(-5, 6, size=2000), 1, None)
    return src.tolist(), tgt.tolist()


def _cost(batch, src, tgt):
    return len(batch) * (max(max(src[i], tgt[i]) for i in batch) + 1)


def test_every_index_once_and_within_budget(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=1000, seed=3)
    batches = list(s)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(src)))
    assert len(batches) == len(s)
    assert all(_cost(b, src, tgt) <= 1000 for b in batches)
    # length bucketing: padding is small
    real = sum(src) + len(src)
    padded = sum(len(b) * (max(src[i] for i in b) + 1) for b in batches)
    assert padded < 1.1 * real


def test_same_seed_and_epoch_same_batches_other_epoch_other_order(lens):
    src, tgt = lens
    a = TokenBatchSampler(src, tgt, max_tokens=1000, seed=3)
    b = TokenBatchSampler(src, tgt, max_tokens=1000, seed=3)
    assert a.batches(0) == b.batches(0)
    assert a.batches(0) != a.batches(1)
    assert a.batches(0) != TokenBatchSampler(src, tgt, max_tokens=1000, seed=4).batches(0)
    assert len(a.batches(1)) == len(a)
    a.set_epoch(5)
    assert list(a) == b.batches(5)


def test_epochs_advance_by_themselves(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=1000, seed=1)
    first, second = list(s), list(s)
    assert first == s.batches(0) and second == s.batches(1)
    assert s.state_dict() == {"epoch": 2, "position": 0}
    s.set_epoch(2)  # the trainer's explicit call for the epoch we are in changes nothing
    assert s.state_dict() == {"epoch": 2, "position": 0}


def test_over_long_pair_is_its_own_batch():
    src, tgt = [3, 4, 500, 5, 2], [3, 4, 20, 600, 2]
    batches = list(TokenBatchSampler(src, tgt, max_tokens=64, seed=0))
    assert [2] in batches and [3] in batches
    assert sorted(i for b in batches for i in b) == list(range(5))
    for b in batches:
        assert len(b) == 1 or _cost(b, src, tgt) <= 64


def test_eval_order_is_sorted_and_fixed(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=1000, shuffle=False)
    batches = list(s)
    assert batches == list(s)  # the same batches every time it is iterated
    flat = [i for b in batches for i in b]
    keys = [(max(src[i], tgt[i]), src[i], tgt[i], i) for i in flat]
    assert keys == sorted(keys)


@pytest.mark.parametrize("stop", [0, 1, 17])
def test_resume_mid_epoch_is_exact(lens, stop):
    src, tgt = lens
    ref = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    ref.set_epoch(2)
    expected = list(ref) + list(ref)  # rest of epoch 2, all of epoch 3

    run = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    run.set_epoch(2)
    it = iter(run)
    seen = [next(it) for _ in range(stop)]
    state = run.state_dict()
    assert state == {"epoch": 2, "position": stop}

    resumed = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # as the trainer does; must not restart the epoch
    assert seen + list(resumed) + list(resumed) == expected


def test_resume_at_epoch_end(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    n = len(s)
    r = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    r.load_state_dict({"epoch": 0, "position": n})
    assert list(r) == []
    assert list(r) == s.batches(1)
    with pytest.raises(ValueError):
        r.load_state_dict({"epoch": 0, "position": n + 1})


def test_collate_shapes_and_masks():
    b = collate([[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14]])
    assert b.src.tolist() == [[5, 6, 7, 3], [8, 3, 0, 0]]
    assert b.tgt_in.tolist() == [[2, 9, 10, 0, 0], [2, 11, 12, 13, 14]]
    assert b.tgt_out.tolist() == [[9, 10, 3, 0, 0], [11, 12, 13, 14, 3]]
    assert b.src.dtype == torch.long and b.src_pad_mask.dtype == torch.bool
    assert b.src_pad_mask.tolist() == [[False] * 4, [False, False, True, True]]
    assert b.tgt_pad_mask.tolist() == [[False, False, False, True, True], [False] * 5]
    assert b.n_tgt_tokens == 3 + 5
    assert len(b) == 2
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_out, b.tgt_out)


def test_collate_respects_budget_of_sampler(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=500, seed=0)
    for idx in list(s)[:20]:
        b = collate([[4] * src[i] for i in idx], [[4] * tgt[i] for i in idx])
        assert b.src.numel() <= 500 and b.tgt_in.numel() <= 500


def test_collate_errors():
    with pytest.raises(ValueError):
        collate([[1]], [])
