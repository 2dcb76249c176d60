"""A loaded model behind the micro-batcher: what the HTTP routes call.

:class:`Service` turns text into source ids and searches as ``translate.py`` does
(:func:`tinymt.translate.source_ids`, :func:`tinymt.translate.search` with the server's
``decode`` settings), on the worker thread, the answer awaited up to the request timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from html import escape
from types import SimpleNamespace

from tinymt.ct2 import LoadedExport
from tinymt.data import read_lines, source_language, target_language
from tinymt.errors import TinyMTError
from tinymt.rundir import LoadedRun
from tinymt.serve.api import ApiError, Pair, distinct
from tinymt.serve.batcher import Busy, Closed, Job, MicroBatcher
from tinymt.text import assemble, html_parts, plan
from tinymt.translate import (
    attention_documents,
    copy_spans,
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

    # ------------------------------------------------------------------ the worker's side
    def _decode(self, ids: list[list[int]], nbest: int):
        return search(self.run, ids, SimpleNamespace(**{**self.decode, "nbest": nbest}),
                      self.device)

    def _attention(self, item: str, masked, ids: list[int]
                   ) -> tuple[str, list[tuple[dict, bytes]]]:
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
            self.batcher.run_now(Job(fn=lambda: self._attention("warm-up", ("", []), sample)))
        plan(["warm-up. 热身。"], self.pair.source)  # loads the segmenter and py3langid (0.6 s)

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
    async def translate(self, items: list[str], nbest: int, arrival: object = None,
                        html: bool = False) -> tuple[list[list[str]], int]:
        """Each item's ``nbest`` translations, best first, its sentences translated as one
        batch (:mod:`tinymt.text`: the k-th of an item is each sentence's k-th; ``html``:
        the text between its markup, the markup kept), and how many segments were kept as
        they were (no word of the source language). A sentence longer than the model takes
        is cut to fit, as ``translate.py`` does; ``arrival``: the request's."""
        def prepare():  # (~1 ms a paragraph: a long text off the event loop)
            units = [html_parts(t) if html else [(True, t)] for t in items]
            return units, plan([s for parts in units for is_text, s in parts if is_text],
                               self.pair.source, self.text)
        small = sum(map(len, items)) < 2000  # ~0.1 ms: a thread's hop would cost more
        units, (sents, plans, kept) = prepare() if small else await asyncio.to_thread(prepare)
        masked, ids = source_ids(self.run, sents, copy=self.text)
        hyps = await self._wait(Job(ids, nbest), arrival)
        texts = [distinct(t) or [""] for t in await self._texts(masked, ids, hyps)]
        kth = [[t[min(k, len(t) - 1)] for t in texts] for k in range(nbest)]  # k-th best each
        # (a sentence with fewer: its last, so no alternative loses a sentence)

        def text(node: list, k: int) -> str:  # a text node's k-th translation
            joined = assemble(node, kth[k], self.pair.target)
            return escape(joined, quote=False) if html else joined
        plans, out = iter(plans), []
        for parts in units:
            nodes = [next(plans) if is_text else s for is_text, s in parts]  # a plan, or markup
            n = max((len(texts[i]) for p in nodes if isinstance(p, list) for i in p
                     if isinstance(i, int)), default=1)  # (the n-best may be shorter)
            out.append(["".join(p if isinstance(p, str) else text(p, k) for p in nodes)
                        for k in range(n)])
        return out, kept

    async def attention(self, items: list[str]) -> bytes:
        """``{"translatedText": [...], "view": <view data of inline_data>}`` as JSON: the
        items' sentences (:mod:`tinymt.text`), the first ``attention_items`` with their maps,
        one task a sentence (sentences to translate go in between), the rest translated."""
        sents, plans, _ = await asyncio.to_thread(plan, items, self.pair.source, self.text)
        masked, ids = source_ids(self.run, sents, copy=self.text)
        drawn = min(len(ids), self.attention_items)
        done = [await self._wait(Job(fn=functools.partial(self._attention, *args)))
                for args in zip(sents, masked, ids[:drawn])]
        rest = await self._wait(Job(ids[drawn:], 1)) if len(ids) > drawn else []
        rest = await self._texts(masked[drawn:], ids[drawn:], rest)
        texts = [t for t, _ in done] + [t[0] if t else "" for t in rest]
        items = [assemble(parts, texts, self.pair.target) for parts in plans]
        return self._attention_json(items, done)  # (joins megabytes of JSON: ~10 ms)

    async def _texts(self, masked: list, ids: list[list[int]], hyps: list) -> list[list[str]]:
        """:func:`tinymt.translate.hypothesis_texts`: on the worker if the model runs (spans)."""
        fn = functools.partial(hypothesis_texts, self.run, masked, ids, hyps, self.device)
        return await self._wait(Job(fn=fn)) if any(spans for _, spans in masked) else fn()

    async def _wait(self, job: Job, arrival: object = None):
        future = asyncio.get_running_loop().create_future()
        job.on_done = functools.partial(settle, future.get_loop(), future)
        try:
            self.batcher.submit(job, arrival)
        except Busy:
            raise ApiError(429, f"Too many requests: {self.batcher.queued:,} sentences are "
                                "waiting; try again later") from None
        except Closed:
            raise ApiError(503, "the server is shutting down") from None
        try:
            result = await asyncio.wait_for(future, self.timeout)
        except asyncio.CancelledError:  # dropped at shutdown: the worker skips it
            job.cancelled = True
            raise
        except asyncio.TimeoutError:
            job.cancelled = True
            raise ApiError(503, f"no answer within {self.timeout:g} s: the server is busy; "
                                "try again later") from None
        if isinstance(result, Exception):
            raise result  # the route's answer: a TinyMTError a 400, any other a 500
        return result

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
