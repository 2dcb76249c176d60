"""Micro-batching: the sentences of requests that arrive together are decoded as one batch
(docs/serve.md, "Micro-batching"): one worker thread owns the model; requests put *jobs* on
a queue bounded in sentences (full: :class:`Busy`, a 429); a *task* (other work on the
model, e.g. the page's attention maps) runs alone, when no sentences wait;
:meth:`MicroBatcher.close` refuses new jobs (:class:`Closed`, a 503) and drops the
queued ones.

    >>> b = MicroBatcher(lambda ids, nbest: [[(s[::-1], 0.0)] for s in ids], 8, 0.0, 100)
    >>> b.start(); b.run_now(Job([[1, 2, 3]], 1))
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
    """Work for the worker thread: sentences (id lists, no EOS) to translate with ``nbest``
    hypotheses each, or, given ``fn``, a *task*: ``fn()`` run alone (it may use the model),
    counting for one sentence in the queue. ``on_done`` is called from the worker
    thread with the result or the exception raised; a job whose caller gave up is
    ``cancelled``: the worker skips it if it has not started it."""

    ids: list[list[int]] = field(default_factory=list)
    nbest: int = 1
    fn: Callable[[], object] | None = None
    on_done: Callable[[object], None] = lambda result: None
    cancelled: bool = False

    @property
    def size(self) -> int:
        """The sentences it counts for in the queue."""
        return len(self.ids) if self.fn is None else 1


class MicroBatcher:
    """The worker thread and its queue (module docstring). ``stats``: batches decoded,
    sentences decoded, the largest batch, tasks run."""

    def __init__(self, decode: Decode, max_sentences: int, wait_s: float, max_queue: int):
        self.decode, self.max_sentences, self.wait_s = decode, max_sentences, wait_s
        self.max_queue = max_queue
        self.stats = {"batches": 0, "sentences": 0, "largest_batch": 0, "tasks": 0}
        self._queue: deque[Job] = deque()
        self.queued = 0  # sentences in the queue (written under the lock only)
        self._cond = threading.Condition()
        self._closing = False
        self._arriving: set[object] = set()  # requests inside the server, not yet queued
        self._last_jobs = 0  # requests in the last batch
        self._thread = threading.Thread(target=self._work, name="tinymt-decode", daemon=True)

    # ------------------------------------------------------------------ callers' side
    def start(self) -> None:
        self._thread.start()

    @contextlib.contextmanager
    def arrival(self) -> Iterator[object]:
        """Around a request, from its first byte until its job is queued (``submit(job,
        arrival)``) or it fails: the worker waits for arriving requests to join a batch."""
        arrival = object()
        with self._cond:
            self._arriving.add(arrival)
        try:
            yield arrival
        finally:
            with self._cond:
                self._arriving.discard(arrival)
                self._cond.notify_all()

    def submit(self, jobs: list[Job], arrival: object = None) -> None:
        """Queue ``jobs``, all or none (``arrival``: the request they came with has
        arrived); :class:`Busy` when they do not fit, :class:`Closed` when closing."""
        size = sum(job.size for job in jobs)
        with self._cond:
            if self._closing:
                raise Closed
            if self.queued + size > self.max_queue:
                raise Busy
            self._queue.extend(jobs)
            self.queued += size
            self._arriving.discard(arrival)
            self._cond.notify_all()

    def run_now(self, job: Job) -> object:
        """Submit ``job`` and wait for its result (for threads that may block: warm-up,
        tests); its exception is raised here."""
        done = threading.Event()
        box: list[object] = []
        job.on_done = lambda result: (box.append(result), done.set())
        self.submit([job])
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def close(self, timeout: float | None = None) -> None:
        """Take no new jobs, drop the queued ones (their requests were answered or dropped:
        the server is stopping), stop the worker after its batch."""
        with self._cond:
            self._closing = True
            for job in self._queue:
                job.cancelled = True
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
            # sentences to translate go before tasks (a task can take a second)
            first = next((j for j in self._queue if j.fn is None), self._queue[0])
            self._queue.remove(first)
            batch, n = [first], first.size
            if first.fn is None:
                deadline = time.monotonic() + self.wait_s
                while n < self.max_sentences:
                    if self._queue:
                        nxt = self._queue[0]
                        if nxt.fn is not None or n + nxt.size > self.max_sentences:
                            break
                        batch.append(self._queue.popleft())
                        n += nxt.size
                        continue
                    left = deadline - time.monotonic()
                    expected = self._arriving or len(batch) < self._last_jobs
                    if left <= 0 or self._closing or not expected:
                        break
                    self._cond.wait(left)
            self.queued -= sum(j.size for j in batch)
            self._last_jobs = len(batch)
            return batch

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            live = [j for j in batch if not j.cancelled]
            if live and live[0].fn is not None:
                self.stats["tasks"] += 1
                try:
                    result = live[0].fn()
                except Exception as e:  # noqa: BLE001  (handed to the waiting request)
                    result = e
                live[0].on_done(result)
            elif live:
                self._translate(live)

    def _translate(self, jobs: list[Job]) -> None:
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
                    j.on_done(e)
                continue
            start = 0
            for j in group:
                j.on_done(hyps[start:start + j.size])
                start += j.size
