"""BPE-dropout (tinymt.tokenizer.bpe_dropout) against the paper's algorithm.

The reference is Algorithm 1 of Provilkov et al. 2020 ("BPE-Dropout"), with the authors'
code (subword-nmt) for what one step applies, written plainly here and *enumerated* rather
than sampled: every outcome of every step's draws, with its probability, gives the exact
distribution of a word's segmentations. Our heap-based sampler is then checked against it:
segmentation frequencies and mean pieces per word within sampling error.

One step of the reference, on the current pieces ``seg``:
  candidates = every adjacent pair (a, b) whose merge a+b is a piece, ranked by the piece's
               score (higher first), leftmost first on ties;
  each candidate is dropped with probability p (for this step only);
  none left -> stop; else the best kept candidate's pair is merged at its position and at
  every other kept position of the same pair, left to right, skipping overlaps.
"""

import itertools
import math
import random
from collections import Counter
from functools import cache

import pytest

import tinymt.corpus as corpus
from tinymt.tokenizer import Tokenizer, bpe_dropout


def _apply(seg: tuple, positions: list[int]) -> tuple:
    """Merge seg[j] + seg[j+1] at each position, left to right; an overlapping one is skipped."""
    out, i = [], 0
    for j in positions:
        if j < i:
            continue
        out += seg[i:j]
        out.append(seg[j] + seg[j + 1])
        i = j + 2
    return tuple(out + list(seg[i:]))


def paper_distribution(word: str, scores: dict[str, float], p: float) -> dict[tuple, float]:
    """{segmentation: probability} of BPE-dropout on ``word``, by enumerating every step."""

    @cache
    def finals(seg: tuple) -> dict[tuple, float]:
        candidates = sorted((-scores[a + b], i) for i, (a, b) in enumerate(zip(seg, seg[1:]))
                            if a + b in scores)
        if not candidates:
            return {seg: 1.0}
        out: Counter = Counter({seg: p ** len(candidates)})  # every candidate dropped
        for k, (_, i) in enumerate(candidates):
            chosen = (1 - p) * p ** k  # the k better ones dropped, this one kept
            pair = seg[i:i + 2]
            later = [j for _, j in candidates[k + 1:] if seg[j:j + 2] == pair]
            for kept in itertools.product((True, False), repeat=len(later)):
                weight = chosen * math.prod((1 - p) if x else p for x in kept)
                merged = _apply(seg, [i] + [j for j, x in zip(later, kept) if x])
                for final, q in finals(merged).items():
                    out[final] += weight * q
        return out

    return {seg: q for seg, q in finals(tuple(word)).items() if q > 0}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Tokenizer:
    """A real BPE model: the built-in corpus' English side, 600 pieces (whole words are
    pieces, reached through long chains of merges)."""
    pairs = corpus.generate_splits(seed=7, train_size=3000, valid_size=10, test_size=10)
    return Tokenizer.train((" ".join(p.en_words) for p in pairs["train"]),
                           tmp_path_factory.mktemp("bpe") / "en.model", vocab_size=600)


def words_of(model: Tokenizer, low: int, high: int) -> list[str]:
    """Every "▁word" of the model's pieces with ``low`` to ``high`` characters."""
    return sorted(w for w in model._sampling_tables()["scores"]
                  if w.startswith("\u2581") and low <= len(w) <= high)


# pairs that repeat and overlap in a word: the "same pair further right" of a step
REPEATS = ({"aa": -1.0, "ab": -2.0, "aaa": -3.0, "aab": -4.0, "aaaa": -5.0, "ba": -6.0},
           ["aaaaa", "aabaab", "abababa"])


def test_without_dropout_the_reference_is_sentencepieces_own_bpe(model):
    """What makes the reference a reference: at p = 0 it is the model's segmentation."""
    scores = model._sampling_tables()["scores"]
    words = words_of(model, 2, 12)
    assert len(words) > 100
    for word in words:
        expected = tuple(model.sp.encode(word[1:], out_type=str))
        assert paper_distribution(word, scores, 0.0) == {expected: 1.0}, word
        assert bpe_dropout(word, scores, 0.0, random.random) == list(expected), word


def _check(word, scores, p, n, seed):
    exact = paper_distribution(word, scores, p)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-9)
    rand = random.Random(seed).random
    drawn = Counter(tuple(bpe_dropout(word, scores, p, rand)) for _ in range(n))
    assert set(drawn) <= set(exact), (word, set(drawn) - set(exact))
    for seg, prob in exact.items():  # every count within 5 standard deviations (+3: rare ones)
        sd = math.sqrt(n * prob * (1 - prob))
        assert abs(drawn[seg] - n * prob) <= 5 * sd + 3, (word, p, seg, drawn[seg], n * prob)
    mean = sum(len(s) * q for s, q in exact.items())
    sd = math.sqrt(sum((len(s) - mean) ** 2 * q for s, q in exact.items()) / n)
    assert abs(sum(len(s) * c for s, c in drawn.items()) / n - mean) <= 5 * sd + 1e-9
    return mean


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_draws_follow_the_papers_distribution(model, p):
    """A real model's words of 5-9 characters, and repeating pairs, 2,000 draws each
    (within 5 standard deviations: a segmentation's probability ~0.06 off is caught)."""
    scores = model._sampling_tables()["scores"]
    words = words_of(model, 5, 9)[::3]
    assert len(words) >= 10
    means = [_check(w, scores, p, 2000, seed=i) for i, w in enumerate(words)]
    # dropout splits words: more pieces than the one each of these words is without it
    assert sum(means) / len(means) > 1 + p
    table, repeats = REPEATS
    for i, word in enumerate(repeats):
        _check(word, table, p, 2000, seed=100 + i)
