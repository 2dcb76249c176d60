"""Micro-batching: the sentences of requests that arrive together are decoded as one batch.

One worker thread owns the model. Requests put *jobs* on a bounded queue (bounded in
sentences: a full queue is :class:`Busy`, the server's 429) and wait for their answers;
the worker takes the first job waiting, then every job already queued, and waits up to
``wait_s`` for more while requests are *arriving* (inside the server, being read, not yet
queued: :meth:`MicroBatcher.arrival`) or the batch has fewer requests than the last one (the
clients answered together come back together), while the batch holds at most
``max_sentences`` sentences; a lone client is never held back, decodes them with one ``decode(ids, nbest)``
call per n-best size, and hands each job its own slice. ``decode`` batches by length and pads with masks, so a sentence's answer does not
depend on its neighbours (tests/test_serve.py checks it against each sentence alone).

A *task* (any other work on the model, e.g. the page's attention maps) runs alone, in
queue order. :meth:`MicroBatcher.close` refuses new jobs (:class:`Closed`, the server's
503), lets the worker finish every job already queued, and waits for it.

    >>> b = MicroBatcher(lambda ids, nbest: [[(s[::-1], 0.0)] for s in ids], 8, 0.0, 100)
    >>> b.start(); b.run_now(TranslateJob([[1, 2, 3]], 1))
    [[([3, 2, 1], 0.0)]]
    >>> b.close()
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

Hyps = list[tuple[list[int], float]]  # one sentence's n-best: (ids, score), best first
Decode = Callable[[list[list[int]], int], list[Hyps]]  # (id lists, nbest) -> their n-bests


class Busy(Exception):
    """The queue holds too many sentences to take this job now."""


class Closed(Exception):
    """The batcher is shutting down and takes no new jobs."""


@dataclass(eq=False)
class Job:
    """Work waiting for the worker; ``on_done`` is called from the worker thread with the
    result or the exception raised. A job whose caller gave up is ``cancelled``: the
    worker skips it if it has not started it."""

    on_done: Callable[[object], None] | None = field(default=None, kw_only=True)
    cancelled: bool = field(default=False, kw_only=True)
    size = 1  # sentences it counts for in the queue

    def finish(self, result: object) -> None:
        if self.on_done is not None:
            self.on_done(result)


@dataclass(eq=False)
class TranslateJob(Job):
    """Sentences (id lists, no EOS) to translate with ``nbest`` hypotheses each."""

    ids: list[list[int]]
    nbest: int = 1

    @property
    def size(self) -> int:
        return len(self.ids)


@dataclass(eq=False)
class Task(Job):
    """``fn()`` run alone on the worker thread (it may use the model)."""

    fn: Callable[[], object]
    weight: int = 1  # sentences it counts for in the queue

    @property
    def size(self) -> int:
        return self.weight


class Arrival:
    """One request counted as arriving until it leaves (queued, or failed), once."""

    def __init__(self, batcher: MicroBatcher):
        self.batcher, self.counted = batcher, True

    def leave(self, locked: bool = False) -> None:
        if not self.counted:
            return
        self.counted = False
        b = self.batcher
        with contextlib.nullcontext() if locked else b._cond:
            b._arriving -= 1
            b._cond.notify_all()


class MicroBatcher:
    """The worker thread and its queue (module docstring). ``stats``: batches decoded,
    sentences decoded, the largest batch, tasks run."""

    def __init__(self, decode: Decode, max_sentences: int, wait_s: float, max_queue: int):
        self.decode, self.max_sentences, self.wait_s = decode, max_sentences, wait_s
        self.max_queue = max_queue
        self.stats = {"batches": 0, "sentences": 0, "largest_batch": 0, "tasks": 0}
        self._queue: deque[Job] = deque()
        self._queued = 0  # sentences in the queue
        self._cond = threading.Condition()
        self._closing = False
        self._arriving = 0  # requests inside the server, not yet queued
        self._last_jobs = 0  # requests in the last batch
        self._thread = threading.Thread(target=self._work, name="tinymt-decode", daemon=True)

    # ------------------------------------------------------------------ callers' side
    def start(self) -> None:
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._queued

    @contextlib.contextmanager
    def arrival(self) -> Iterator[Arrival]:
        """Around a request, from its first byte until its job is queued (``submit(job,
        arrival)``) or it fails: the worker waits for arriving requests to join a batch."""
        arrival = Arrival(self)
        with self._cond:
            self._arriving += 1
        try:
            yield arrival
        finally:
            arrival.leave()

    def submit(self, job: Job, arrival: Arrival | None = None) -> None:
        """Queue ``job`` (``arrival``: the request it came with has arrived); :class:`Busy`
        when it does not fit, :class:`Closed` when closing."""
        size = job.size
        with self._cond:
            if self._closing:
                raise Closed
            if self._queued and self._queued + size > self.max_queue:
                raise Busy  # a job alone is always taken: the limits on a request bound it
            self._queue.append(job)
            self._queued += size
            if arrival is not None:
                arrival.leave(locked=True)
            self._cond.notify_all()

    def run_now(self, job: Job, timeout: float | None = None) -> object:
        """Submit ``job`` and wait for its result (for threads that may block: warm-up,
        tests); its exception is raised here."""
        done = threading.Event()
        box: list[object] = []
        job.on_done = lambda result: (box.append(result), done.set())
        self.submit(job)
        if not done.wait(timeout):
            job.cancelled = True
            raise TimeoutError(f"no result within {timeout} s")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def close(self, timeout: float | None = None) -> None:
        """Take no new jobs, finish the queued ones, stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the worker
    def _take(self) -> list[Job] | None:
        """The next batch: jobs to decode together, or one task; None: closed and empty."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
            first = self._queue.popleft()
            batch, n = [first], first.size
            if isinstance(first, TranslateJob):
                deadline = time.monotonic() + self.wait_s
                while n < self.max_sentences:
                    if self._queue:
                        nxt = self._queue[0]
                        if not isinstance(nxt, TranslateJob) or n + nxt.size > self.max_sentences:
                            break
                        batch.append(self._queue.popleft())
                        n += nxt.size
                        continue
                    left = deadline - time.monotonic()
                    expected = self._arriving or len(batch) < self._last_jobs
                    if left <= 0 or self._closing or not expected:
                        break
                    self._cond.wait(left)
            self._queued -= sum(j.size for j in batch)
            self._last_jobs = len(batch)
            return batch

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            live = [j for j in batch if not j.cancelled]
            if live and isinstance(live[0], Task):
                self.stats["tasks"] += 1
                _finish(live[0], live[0].fn)
            elif live:
                self._translate(live)

    def _translate(self, jobs: list[TranslateJob]) -> None:
        """One ``decode`` call per n-best size among ``jobs``; each job gets its slice."""
        for nbest in sorted({j.nbest for j in jobs}):
            group = [j for j in jobs if j.nbest == nbest]
            ids = [s for j in group for s in j.ids]
            self.stats["batches"] += 1
            self.stats["sentences"] += len(ids)
            self.stats["largest_batch"] = max(self.stats["largest_batch"], len(ids))
            try:
                hyps = self.decode(ids, nbest)
            except Exception as e:  # noqa: BLE001  (handed to each waiting request)
                for j in group:
                    j.finish(e)
                continue
            start = 0
            for j in group:
                j.finish(hyps[start:start + j.size])
                start += j.size


def _finish(job: Job, fn: Callable[[], object]) -> None:
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001  (handed to the waiting request)
        result = e
    job.finish(result)
