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
    assert len(batches) == len(s.batches(0))
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
    assert len(a.batches(1)) == len(a.batches(0))
    a.load_state_dict({"epoch": 5, "position": 0})
    assert list(a) == b.batches(5)


def test_epochs_advance_by_themselves(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=1000, seed=1)
    first, second = list(s), list(s)
    assert first == s.batches(0) and second == s.batches(1)
    assert s.state_dict() == {"epoch": 2, "position": 0}
    it = iter(s)  # the state is the next epoch's as soon as an epoch's last batch is out
    for _ in s.batches(2):
        assert s.state_dict()["epoch"] == 2
        next(it)
    assert s.state_dict() == {"epoch": 3, "position": 0}


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
    ref.load_state_dict({"epoch": 2, "position": 0})
    expected = list(ref) + list(ref)  # rest of epoch 2, all of epoch 3

    run = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    run.load_state_dict({"epoch": 2, "position": 0})
    it = iter(run)
    seen = [next(it) for _ in range(stop)]
    state = run.state_dict()
    assert state == {"epoch": 2, "position": stop}

    resumed = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    resumed.load_state_dict(state)
    assert seen + list(resumed) + list(resumed) == expected


def test_resume_at_epoch_end(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    n = len(s.batches(0))
    r = TokenBatchSampler(src, tgt, max_tokens=800, seed=9)
    r.load_state_dict({"epoch": 0, "position": n})  # all of epoch 0 yielded: epoch 1 next
    assert r.state_dict() == {"epoch": 1, "position": 0}
    assert list(r) == s.batches(1)


def test_collate_shapes_and_masks():
    b = collate([[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14]])
    assert b.src.tolist() == [[5, 6, 7, 3], [8, 3, 0, 0]]
    assert b.tgt_in.tolist() == [[2, 9, 10, 0, 0], [2, 11, 12, 13, 14]]
    assert b.tgt_out.tolist() == [[9, 10, 3, 0, 0], [11, 12, 13, 14, 3]]
    assert b.src.dtype == torch.long and b.src_pad_mask.dtype == torch.bool
    assert b.src_pad_mask.tolist() == [[False] * 4, [False, False, True, True]]
    assert b.tgt_pad_mask.tolist() == [[False, False, False, True, True], [False] * 5]
    assert b.n_tgt_tokens == 3 + 5
    moved = b.to("cpu")
    assert torch.equal(moved.tgt_out, b.tgt_out)


def test_collate_respects_budget_of_sampler(lens):
    src, tgt = lens
    s = TokenBatchSampler(src, tgt, max_tokens=500, seed=0)
    for idx in list(s)[:20]:
        b = collate([[4] * src[i] for i in idx], [[4] * tgt[i] for i in idx])
        assert b.src.numel() <= 500 and b.tgt_in.numel() <= 500


# ----------------------------------------------------- batch composition, by brute force
def reference_batches(src, tgt, max_tokens):
    """The documented rule written plainly: pairs sorted by (longer side, source, target,
    index), cut greedily; a batch of n pairs whose longest side is L costs n * (L + 1) and
    must stay within max_tokens (a pair alone always makes a batch)."""
    order = sorted(range(len(src)), key=lambda i: (max(src[i], tgt[i]), src[i], tgt[i], i))
    batches, cur = [], []
    for i in order:
        longest = max([max(src[j], tgt[j]) for j in cur + [i]])
        if cur and (len(cur) + 1) * (longest + 1) > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    return batches + ([cur] if cur else [])


def _signature(batch, src, tgt):
    return sorted((src[i], tgt[i]) for i in batch)


@pytest.mark.parametrize("max_tokens", [1, 12, 30, 61])
def test_batches_are_exactly_the_greedy_cut_of_the_sorted_pairs(max_tokens):
    rng = np.random.default_rng(max_tokens)
    src = rng.integers(1, 9, size=60).tolist()
    tgt = rng.integers(1, 9, size=60).tolist()
    src[7], tgt[7] = 20, 3  # over budget alone: a batch of its own
    want = reference_batches(src, tgt, max_tokens)
    evaluation = TokenBatchSampler(src, tgt, max_tokens=max_tokens, shuffle=False)
    assert evaluation.batches() == want == list(evaluation)
    # training: ties shuffled and the batches in another order, the same compositions
    training = TokenBatchSampler(src, tgt, max_tokens=max_tokens, seed=5)
    got = training.batches(3)
    assert sorted(_signature(b, src, tgt) for b in got) == sorted(
        _signature(b, src, tgt) for b in want)
    assert len(got) == len(want)


def test_an_exactly_full_batch_is_kept_whole():
    # 3 pairs of longest side 3 cost 3 * 4 = 12 tokens: within 12, one batch
    s = TokenBatchSampler([3, 1, 2], [1, 3, 2], max_tokens=12, shuffle=False)
    assert s.batches() == [[2, 1, 0]]  # by (longer side, source): (2, 2), (1, 3), (3, 1)
    assert TokenBatchSampler([3, 1, 2], [1, 3, 2], max_tokens=11, shuffle=False).batches() == [
        [2, 1], [0]]


def test_lengths_per_epoch_cut_each_epoch_by_its_own_lengths():
    base = [4, 4, 4, 4]
    by_epoch = {0: ([1, 1, 5, 5], [1, 1, 5, 5]), 1: ([5, 1, 5, 1], [5, 1, 5, 1])}
    s = TokenBatchSampler(base, base, max_tokens=12, shuffle=False,
                          lengths_of=lambda e: by_epoch[e])
    assert s.batches(0) == [[0, 1], [2, 3]] == reference_batches(*by_epoch[0], 12)
    assert s.batches(1) == [[1, 3], [0, 2]] == reference_batches(*by_epoch[1], 12)
    shuffled = TokenBatchSampler(base, base, max_tokens=12, seed=2, lengths_of=lambda e: by_epoch[e])
    assert sorted(sorted(b) for b in shuffled.batches(1)) == [[0, 2], [1, 3]]


def test_length_batches_and_eval_batches():
    from tinymt.batching import eval_batches, length_batches

    lengths = [5, 2, 9, 2, 5, 1]
    assert length_batches(lengths, 18) == [[5, 1, 3], [0, 4], [2]]  # 3*3=9, 2*6=12, 1*10
    assert length_batches([0, 0, 0], 3) == [[0, 1, 2]]  # empty sources: 3 * (0 + 1) tokens
    src = [[4] * n for n in lengths]
    tgt = [[4] * n for n in [1, 1, 1, 1, 1, 6]]
    got = eval_batches(src, tgt, 18)
    assert [idx for idx, _ in got] == reference_batches(lengths, [1, 1, 1, 1, 1, 6], 18)
    for idx, batch in got:
        assert torch.equal(batch.src, collate([src[i] for i in idx], [tgt[i] for i in idx]).src)
        assert batch.tgt_out.tolist() == collate([src[i] for i in idx],
                                                 [tgt[i] for i in idx]).tgt_out.tolist()


def test_a_batch_moved_to_a_device_keeps_its_padding():
    b = collate([[5, 6], [7]], [[8], [9, 10, 11]]).to("cpu")
    assert b.n_tgt_tokens == 2 + 4
    assert b.src_pad_mask.tolist() == [[False, False, False], [False, False, True]]
    assert b.tgt_pad_mask.tolist() == [[False, False, True, True], [False] * 4]


def test_the_default_seed_is_zero(lens):
    src, tgt = lens
    default = TokenBatchSampler(src, tgt, max_tokens=1000)
    assert default.batches(1) == TokenBatchSampler(src, tgt, max_tokens=1000, seed=0).batches(1)
    assert default.batches(1) != TokenBatchSampler(src, tgt, max_tokens=1000, seed=1).batches(1)
