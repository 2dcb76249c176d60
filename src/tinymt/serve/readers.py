"""Client text read off the event loop: processes that cut, identify and parse one item at
a time (:func:`tinymt.text.read_item`), one of them kept for items of at most
:data:`SHORT` characters. Processes, not threads: the parsers are pure Python (on a thread
they would hold the GIL from the event loop), and each item's time
(:func:`tinymt.text.within`: a signal, which only a process's main thread gets) stops a
pathological text, a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tinymt.serve.api import ApiError
from tinymt.text import SHORT, read_item, start_reader


class Readers:
    """``n`` reader processes (spawned: no fork of a threaded server) for ``source`` text."""

    def __init__(self, source: str, n: int = 2):
        self.source, self.n = source, n
        self._pool = self._start()
        self._free = asyncio.Semaphore(n)  # processes
        self._long = asyncio.Semaphore(n - 1)  # ...that long items may take

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.n, multiprocessing.get_context("spawn"),
                                   initializer=start_reader, initargs=(self.source,))

    def ready(self) -> None:
        """Wait until every process has started (a server's port opens after this)."""
        for started in [self._pool.submit(int) for _ in range(self.n)]:
            started.result()

    def close(self) -> None:  # waits for what runs (ended by its time): a pool thread
        self._pool.shutdown(cancel_futures=True)  # still ending races Python's exit hook

    async def read(self, item: str, *args) -> tuple:
        """``read_item(item, *args)`` on a process, awaited."""
        async with self._long if len(item) > SHORT else contextlib.nullcontext(), self._free:
            try:
                return await asyncio.wrap_future(self._pool.submit(read_item, item, *args))
            except BrokenProcessPool:  # a reader died (killed, out of memory): new ones
                self._pool = self._start()
                raise ApiError(503, "the text could not be read; try again") from None
