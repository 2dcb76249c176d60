"""A loaded model behind the micro-batcher: what the HTTP routes call.

:class:`Service` turns text into source ids and searches as ``translate.py`` does
(:func:`tinymt.translate.source_ids`, :func:`tinymt.translate.search` with the server's
``decode`` settings), on the worker thread; the text read on the reader processes
(:mod:`tinymt.serve.readers`); all of it within the request's time (:meth:`Service.deadline`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Callable
from html import escape
from types import SimpleNamespace

from tinymt.ct2 import LoadedExport
from tinymt.data import read_lines, source_language, target_language
from tinymt.errors import TinyMTError
from tinymt.rundir import LoadedRun
from tinymt.serve.api import MAX_SENTENCES, ApiError, Pair, TranslateRequest, detection, distinct
from tinymt.serve.batcher import Busy, Closed, Job, MicroBatcher
from tinymt.serve.readers import Readers
from tinymt.text import CONFIDENT, LIBRETRANSLATE, SHORT, assemble, one_pass, read_item, unsure
from tinymt.translate import (
    SHORT_INPUT,
    attention_documents,
    copy_spans,
    doubt,
    hypothesis_texts,
    search,
    source_ids,
    view_name,
)
from tinymt.viewer.document import document_json
from tinymt.viewer.html import inline_data


def read_keys(path: str) -> frozenset[str]:
    """The API keys of ``api_keys=``: one a line; blank lines and ``#`` comments skipped."""
    keys = frozenset(k.strip() for k in read_lines(path) if k.strip()
                     and not k.lstrip().startswith("#"))
    if not keys:
        raise TinyMTError(f"api_keys={path} holds no key (one a line)")
    return keys


class Service:
    """The model (a run or an export), its limits and its worker, for the routes."""

    def __init__(self, run: LoadedRun | LoadedExport, device, cfg):
        self.run, self.device = run, device
        self.decode = cfg.decode
        data = run.config.get("data", {})
        self.pair = Pair(source_language(data), target_language(data))
        self.limits = cfg  # a request's: its max_chars, max_items, max_body_bytes
        self.keys = read_keys(cfg.api_keys) if cfg.api_keys else None
        self.attention_items = cfg.attention_items if isinstance(run, LoadedRun) else 0
        self.text = cfg.text  # False: an item is one sentence, as given
        self.timeout = cfg.timeout_s
        self.engine = cfg.engine
        self.name = view_name(run) if isinstance(run, LoadedRun) else run.path.name
        self.batcher = MicroBatcher(self._decode, cfg.batch_sentences,
                                    cfg.batch_wait_ms / 1000, cfg.max_queue)
        self.readers = Readers(self.pair.source)  # client text is read there

    # ------------------------------------------------------------------ the worker's side
    def _decode(self, ids: list[list[int]], nbest: int):
        return search(self.run, ids, SimpleNamespace(**{**self.decode, "nbest": nbest}),
                      self.device)

    def _attention(self, item: str, masked, ids: list[int]) -> tuple[str, list[tuple[dict, bytes]]]:
        """A sentence's translation and its view documents (none if empty), each with its
        JSON (:func:`~tinymt.viewer.document.document_json`), all on the worker."""
        out = [h[0][0] if h else [] for h in self._decode([ids], 1)][0]
        docs = attention_documents(self.run, [item], [ids], [out], self.device)
        return copy_spans(self.run, masked, ids, out, self.device), \
            [(d, document_json(d)) for d in docs]

    def _attention_json(self, texts: list[str],
                        done: list[tuple[str, list[tuple[dict, bytes]]]]) -> bytes:
        """The answer around the documents' JSON: ASCII, parsing as ``json.dumps`` of it."""
        pairs = [pair for _, pairs in done for pair in pairs]
        view = inline_data(self.name, [{**d, "kinds": {}} for d, _ in pairs])
        docs = b",".join(json.dumps(k).encode() + b":" + j
                         for k, (_, j) in zip(view.pop("docs"), pairs))
        head = json.dumps({"translatedText": texts, "view": {**view, "docs": {}}},
                          separators=(",", ":")).encode()
        return head[:-3] + docs + b"}}}"  # head ends with "docs":{}}}

    def start(self) -> None:
        """Start the worker and warm the model up (the first request is then not slower)."""
        self.batcher.start()
        sample = list(range(4, min(12, self.run.src_tokenizer.vocab_size)))
        for n in (1, 4):
            self.batcher.run_now(Job([sample] * n, 1))
        if self.attention_items:
            self.batcher.run_now(Job(fn=lambda: self._attention("warm-up", ("", [], []), sample)))
        self.readers.ready()
        read_item("warm-up. 热身。", 1, self.pair.source, False, True, None)  # (short ones: here)

    def close(self, timeout: float | None = None) -> None:
        """Stop the readers (what they read ends in its time) and the worker (after its
        batch, within ``timeout``)."""
        self.readers.close()
        self.batcher.close(timeout)

    def frontend_settings(self) -> dict:
        """``GET /frontend/settings``: LibreTranslate's defaults (no file translation, no
        suggestions), this server's limit and keys, its one pair."""
        names = {c["code"]: c["name"] for c in self.pair.languages()}
        return {"charLimit": self.limits.max_chars, "frontendTimeout": 500,
                "apiKeys": self.keys is not None, "keyRequired": self.keys is not None,
                "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
                "language": {side: {"code": code, "name": names[code]} for side, code in
                             (("source", self.pair.source), ("target", self.pair.target))}}

    # ------------------------------------------------------------------ the routes' side
    @contextlib.asynccontextmanager
    async def deadline(self):
        """A request's work, all of it (reading, queue, search), within ``timeout_s``:
        then a 503, and what is left of it is dropped (the worker skips it)."""
        try:
            async with asyncio.timeout(self.timeout):
                yield
        except TimeoutError:
            raise ApiError(503, f"no answer within {self.timeout:g} s: the server is busy; "
                                "try again later") from None

    async def read(self, items: list[str], html: bool = False, among=None, cut=None):
        """``(units, sentences, plans, kept, detected)`` of the items read one after the
        other on the reader processes (:func:`tinymt.text.read_item`; ``units``: each
        item's parts and tags, ``plans``: each text part's, indexing ``sentences``), here if
        they are short and :func:`~tinymt.text.one_pass`; more sentences than a request may
        have is a 400 as soon as they are found."""
        limit = min(MAX_SENTENCES, self.batcher.max_queue)
        units, sents, plans, kept, detected = [], [], [], 0, []
        here = not html and sum(map(len, items)) <= SHORT  # read here: no round trip (~0.5
        # ms: a fifth of the throughput at 64 clients) where every step is linear (one_pass)
        for n, item in enumerate(items, 1):
            args = item, n, self.pair.source, html, self.text if cut is None else cut, among
            read = read_item(*args) if here and one_pass(item) else await self.readers.read(*args)
            parts, found, item_plans, item_kept, lang = read
            units.append(parts)
            plans += [[i + len(sents) if isinstance(i, int) else i for i in p] for p in item_plans]
            sents += found
            kept += item_kept
            detected.append(lang)
            if len(sents) > limit:
                raise ApiError(400, f"Invalid request: q holds more than {limit:,} sentences")
        return units, sents, plans, kept, detected

    async def translate(self, req: TranslateRequest, arrival: object = None
                        ) -> tuple[list[list[str]], int, list | None, list[bool]]:
        """Each item's n-best translations, best first (``alternatives`` + 1 as far as the
        beam has them), its sentences one batch (:mod:`tinymt.text`: the k-th of an item is
        each sentence's k-th; ``html``: the text between its block markup, the markup kept,
        an inline element's tags around the words that translate its own); the
        segments kept as they were (no word of the source language); with ``source=auto``
        each item's language (confidently another one: a 400 before any search). A sentence
        longer than the model takes is cut to fit, as ``translate.py`` does; whether each
        item's translation is in doubt (:func:`tinymt.translate.doubt`)."""
        nbest = min(req.alternatives, self.decode.beam - 1) + 1
        units, sents, plans, kept, langs = await self.read(
            req.items, req.html, LIBRETRANSLATE if req.auto else None)
        detected = [detection(*lang) for lang in langs] if req.auto else None
        for d in detected or []:  # confidently another language: that pair's 400 (never a
            if d["confidence"] >= 100 * CONFIDENT:  # translation made up)
                self.pair.check(d["language"], self.pair.target)
        masked, ids = await self._source_ids(sents)
        hyps = await self._search(ids, nbest, arrival)
        texts = [distinct(t) or [""] for t in await self._texts(masked, ids, hyps)]
        kth = [[t[min(k, len(t) - 1)] for t in texts] for k in range(nbest)]  # k-th best each
        # (a sentence with fewer: its last, so no alternative loses a sentence)

        def text(node: list, k: int) -> str:  # a text node's k-th translation
            joined = assemble(node, kth[k], self.pair.target)
            return escape(joined, quote=False) if req.html else joined
        plans, out, short = iter(plans), [], {}
        for item, (parts, tags) in enumerate(units):
            nodes = [next(plans) if is_text else s for is_text, s in parts]  # a plan, or markup
            mine = [i for p in nodes if isinstance(p, list) for i in p if isinstance(i, int)]
            if len(mine) == 1 and 0 < len(ids[mine[0]]) <= SHORT_INPUT and hyps[mine[0]] \
                    and unsure(sents[mine[0]], self.pair.source):
                short[item] = mine[0]  # one short sentence of unsure language: made up?
            n = max((len(texts[i]) for i in mine), default=1)  # (the n-best may be shorter)
            out.append(["".join(p if isinstance(p, str) else text(p, k) for p in nodes)
                        .translate(tags) for k in range(n)])
        doubts = (await self._wait([Job(fn=lambda: {item: doubt(
            self.run, sents[i], ids[i], hyps[i][0][0], self.device) is not None
            for item, i in short.items()})]))[0] if short else {}
        return out, kept, detected, [doubts.get(item, False) for item in range(len(units))]

    async def attention(self, items: list[str]) -> bytes:
        """``{"translatedText": [...], "view": <view data of inline_data>}`` as JSON: the
        items' sentences (:mod:`tinymt.text`), the first ``attention_items`` with their maps,
        one task a sentence (sentences to translate go in between), the rest translated."""
        _, sents, plans, _, _ = await self.read(items)
        masked, ids = await self._source_ids(sents)
        drawn = min(len(ids), self.attention_items)
        done = await self._wait([Job(fn=functools.partial(self._attention, *args))
                                 for args in zip(sents, masked, ids[:drawn])])
        rest = await self._texts(masked[drawn:], ids[drawn:], await self._search(ids[drawn:], 1))
        texts = [t for t, _ in done] + [t[0] if t else "" for t in rest]
        items = [assemble(parts, texts, self.pair.target) for parts in plans]
        return self._attention_json(items, done)  # (joins megabytes of JSON: ~10 ms)

    async def _source_ids(self, sents: list[str]) -> tuple[list, list[list[int]]]:
        """:func:`tinymt.translate.source_ids`, on the worker (a task a batch) but for short text."""
        if sum(map(len, sents)) <= SHORT:  # (here: no round trip)
            return source_ids(self.run, sents, copy=self.text)
        parts = await self._in_tasks(lambda s: source_ids(self.run, s, copy=self.text), sents)
        return [m for p in parts for m in p[0]], [x for p in parts for x in p[1]]

    async def _search(self, ids: list[list[int]], nbest: int, arrival: object = None):
        """The n-bests of ``ids``, in jobs of a batch at most (a request given up leaves the
        worker at most one batch of its sentences: the rest is skipped)."""
        size = self.batcher.max_sentences
        return [h for part in await self._wait([Job(ids[i:i + size], nbest) for i in
                                                range(0, len(ids), size)], arrival)
                for h in part]

    async def _texts(self, masked: list, ids: list[list[int]], hyps: list) -> list[list[str]]:
        """:func:`tinymt.translate.hypothesis_texts`: on the worker if the model runs
        (spans), a task a batch of sentences."""
        if not any(spans or marks for _, spans, marks in masked):
            return hypothesis_texts(self.run, masked, ids, hyps, self.device)
        return [t for part in await self._in_tasks(lambda *a: hypothesis_texts(
            self.run, *a, self.device), masked, ids, hyps) for t in part]

    async def _in_tasks(self, fn: Callable, *lists: list) -> list:
        """``fn`` of the sentences' ``lists`` cut into batches, a worker task each: each result."""
        size = self.batcher.max_sentences
        return await self._wait([Job(fn=functools.partial(fn, *(x[i:i + size] for x in lists)))
                                 for i in range(0, len(lists[0]), size)])

    async def _wait(self, jobs: list[Job], arrival: object = None) -> list:
        """Each job's result, the jobs queued together (429 when they do not fit)."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in jobs]
        for job, future in zip(jobs, futures):
            job.on_done = functools.partial(settle, loop, future)
        try:
            self.batcher.submit(jobs, arrival)
        except Busy:
            raise ApiError(429, f"Too many requests: {self.batcher.queued:,} sentences are "
                                "waiting; try again later") from None
        except Closed:
            raise ApiError(503, "the server is shutting down") from None
        try:
            results = await asyncio.gather(*futures)
        except asyncio.CancelledError:  # out of time, or dropped at shutdown: skipped
            for job in jobs:
                job.cancelled = True
            raise
        for result in results:
            if isinstance(result, Exception):
                raise result  # the route's answer: a TinyMTError a 400, any other a 500
        return results

    def health(self) -> dict:
        return {"status": "ok", "model": self.name, "engine": self.engine,
                "source": self.pair.source, "target": self.pair.target,
                "beam": self.decode.beam, "attention": bool(self.attention_items),
                "attention_items": self.attention_items, "api_keys": self.keys is not None,
                "max_items": self.limits.max_items, "max_chars": self.limits.max_chars,
                "queued": self.batcher.queued, **self.batcher.stats}


def settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result) -> None:
    """From another thread: ``future``'s result, unless it is done (cancelled: its request
    gave up) or its loop is gone."""
    def done():
        if not future.done():
            future.set_result(result)
    with contextlib.suppress(RuntimeError):  # the loop is closed
        loop.call_soon_threadsafe(done)
