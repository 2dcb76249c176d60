"""Subword regularization: the train split re-segmented every epoch.

With ``data.sampling_alpha > 0`` each training epoch sees a fresh segmentation of every
train sentence (:meth:`tinymt.tokenizer.Tokenizer.encode_sampled`), a function of
``(seed, epoch)`` alone: every rank of a DDP run, and a killed run resumed, get the same
pieces. Only the train split samples (valid, test, probes and translation never do). The
next epoch is encoded ahead, in a background thread, while this one trains. A sampled
sentence longer than ``max_len`` pieces keeps its deterministic segmentation.

>>> segments = TrainSegments(data, alpha=0.1, nbest_size=16, seed=1, max_len=255)
>>> src_ids, tgt_ids = segments.ids(epoch=3)   # the same lists for (seed 1, epoch 3) anywhere
>>> src_lens, tgt_lens = segments.lengths(3)   # what the batches of epoch 3 are cut by
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from tinymt.data.prepared import PreparedData

Ids = list[list[int]]


class TrainSegments:
    """The train split's ids for each epoch: sampled when ``alpha > 0``, else the cached
    deterministic ids (the same lists every epoch)."""

    def __init__(self, data: PreparedData, alpha: float, nbest_size: int, seed: int, max_len: int):
        self.data, self.alpha, self.nbest_size = data, float(alpha), int(nbest_size)
        self.seed, self.max_len = int(seed), int(max_len)
        self.sampling = self.alpha > 0
        self._fixed = data.ids("train")
        self._ready: dict[int, tuple[Ids, Ids]] = {}  # at most this epoch and the next
        self._ahead: dict[int, Future] = {}
        self._pool = None
        if self.sampling:  # the texts are read here, not in the background thread
            train = data.splits["train"]
            self._texts = (train["src"][:], train["tgt"][:])
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinymt-segments")

    def ids(self, epoch: int) -> tuple[Ids, Ids]:
        """``(src_ids, tgt_ids)`` of the train split in ``epoch``; starts drawing the next."""
        if not self.sampling:
            return self._fixed
        if epoch not in self._ready:
            ahead = self._ahead.pop(epoch, None)
            self._ready[epoch] = ahead.result() if ahead is not None else self._draw(epoch)
        for old in [e for e in self._ready if e not in (epoch, epoch + 1)]:
            del self._ready[old]
        if epoch + 1 not in self._ready and epoch + 1 not in self._ahead:
            self._ahead = {epoch + 1: self._pool.submit(self._draw, epoch + 1)}
        return self._ready[epoch]

    def lengths(self, epoch: int) -> tuple[list[int], list[int]]:
        """Token counts (no bos/eos) per pair in ``epoch``: what its batches are cut by."""
        src, tgt = self.ids(epoch)
        return [len(s) for s in src], [len(t) for t in tgt]

    def _draw(self, epoch: int) -> tuple[Ids, Ids]:
        sides = []
        for side, tok in enumerate((self.data.src_tokenizer, self.data.tgt_tokenizer)):
            # the seed of one side's (0 source, 1 target) draw in one epoch: a 32-bit hash
            seed = int(np.random.SeedSequence([self.seed, epoch, side]).generate_state(1)[0])
            drawn = tok.encode_sampled(self._texts[side], self.alpha, self.nbest_size, seed)
            sides.append([d if len(d) <= self.max_len else f
                          for d, f in zip(drawn, self._fixed[side])])
        return sides[0], sides[1]

    def close(self) -> None:
        """Stop the background thread (a drawing in progress finishes first)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
