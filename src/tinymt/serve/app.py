"""The HTTP routes (Starlette): LibreTranslate's API (read by :mod:`tinymt.serve.api`),
``/attention``, ``/health`` and the page; docs/serve.md has the table of them.

Every error is ``{"error": "<one line>"}`` with its status; no route takes a file path.
``serve(cfg)`` loads and warms up the model before the port opens (``/health`` answers only
at full speed); on SIGTERM or Ctrl-C what is being answered gets :data:`SHUTDOWN_S` (then a
503), what is still arriving or not being read is dropped, and the process exits with 0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import h11
import torch
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from tinymt.errors import TinyMTError
from tinymt.fonts import font_path, sc_font_file
from tinymt.serve.api import (
    ApiError,
    detection,
    read_fields,
    text_items,
    translate_answer,
    translate_request,
)
from tinymt.serve.service import Service, settle
from tinymt.text import LIBRETRANSLATE
from tinymt.translate import load_translator
from tinymt.viewer import STATIC as VIEW_STATIC

STATIC = Path(__file__).resolve().parent / "static"
# the page loads only its own files; view.js draws with inline styles
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; "
                               "style-src 'self' 'unsafe-inline'; font-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
FONT_HEADERS = {"Cache-Control": "public, max-age=86400"}
ATTENTION_SLOTS = 2  # /attention answers computed or being sent at once (~10 MB each at most)
CHUNK = 1 << 16  # an answer is sent in pieces: a client that stops reading holds one
SHUTDOWN_S = 2  # after SIGTERM: what is still running then is answered 503 and dropped
Handler = Callable[[Request], Awaitable[Response]]


def _json_errors(handler: Handler) -> Handler:
    """A route whose every failure is ``{"error": ...}``: ours with their status, the
    model's refusal of its input (a :class:`TinyMTError`) a 400, anything else a 500 (one
    line on stderr, no traceback)."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return JSONResponse({"error": e.message}, status_code=e.status)
        except TinyMTError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it
        except asyncio.CancelledError:  # the shutdown's SHUTDOWN_S ran out: dropped
            return JSONResponse({"error": "the server is shutting down"}, status_code=503)
        except Exception as e:  # noqa: BLE001  (the server stays up)
            print(f"error: {request.url.path}: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)
            return JSONResponse({"error": f"internal error ({type(e).__name__})"}, status_code=500)

    return route


async def _held_answer(slots: asyncio.Semaphore, wait_s: float, work) -> Response:
    """``await work()`` (JSON bytes) holding one of ``slots`` until its answer is sent in
    CHUNK pieces or its client is gone; no slot free within ``wait_s``: 503."""
    try:
        await asyncio.wait_for(slots.acquire(), wait_s)
    except asyncio.TimeoutError:
        raise ApiError(503, "the attention maps of other requests are being drawn; "
                            "try again later") from None
    try:
        body = await work()
    except BaseException:
        slots.release()
        raise

    async def pieces():
        try:
            for start in range(0, len(body), CHUNK):
                yield body[start:start + CHUNK]
        finally:
            slots.release()

    return StreamingResponse(pieces(), media_type="application/json",
                             headers={"Content-Length": str(len(body))})


def _static(path: Path, media_type: str, headers: dict | None = None):
    return lambda request: FileResponse(path, media_type=media_type, headers=headers)


async def _not_found(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404 and "//" in request.url.path:  # //translate: a 308 to
        where = re.sub("/{2,}", "/", request.url.path)  # /translate, as LibreTranslate's Flask
        return RedirectResponse(where + f"?{request.url.query}" * bool(request.url.query), 308)
    return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


def create_app(service: Service) -> Starlette:
    """The routes of the module docstring over ``service``."""

    @_json_errors
    async def translate(request: Request) -> Response:
        with service.batcher.arrival() as arrival:  # a batch being gathered waits for it
            fields = await read_fields(request, service.limits, service.keys)
            req = translate_request(fields, service.limits, service.pair)
            async with service.deadline():
                nbests, kept, detected, doubts = await service.translate(req, arrival)
        return JSONResponse(translate_answer(req, nbests, detected, kept, doubts))

    @_json_errors
    async def detect_language(request: Request) -> Response:  # LibreTranslate's /detect
        fields = await read_fields(request, service.limits, service.keys)
        items, single = text_items(fields, service.limits)
        async with service.deadline():  # each item's language among LibreTranslate's
            read = await service.read(items, among=LIBRETRANSLATE, cut=False)
            found = [[detection(*lang)] for lang in read[4]]
        return JSONResponse(found[0] if single else found)

    slots = asyncio.Semaphore(ATTENTION_SLOTS)  # what /attention holds in memory, in total

    @_json_errors
    async def attention(request: Request) -> Response:
        if not service.attention_items:
            raise ApiError(400, "attention maps are off on this server (they need "
                                "engine=torch and attention_items > 0)")
        fields = await read_fields(request, service.limits, service.keys)
        items, _ = text_items(fields, service.limits, service.attention_items)

        async def work():
            async with service.deadline():
                return await service.attention(items)
        return await _held_answer(slots, service.timeout, work)

    @_json_errors
    async def font(request: Request) -> Response:  # the whole font, built once (2 s; the
        path = await _on_daemon_thread(sc_font_file)  # source's if it cannot be)
        return FileResponse(path or font_path(), media_type="font/otf", headers=FONT_HEADERS)

    routes = [
        Route("/translate", translate, methods=["POST"]),
        Route("/frontend/settings", lambda _: JSONResponse(service.frontend_settings())),
        Route("/languages", lambda _: JSONResponse(service.pair.languages()), methods=["GET"]),
        Route("/detect", detect_language, methods=["POST"]),
        Route("/attention", attention, methods=["POST"]),
        Route("/health", lambda _: JSONResponse(service.health()), methods=["GET"]),
        Route("/", _static(STATIC / "page.html", "text/html; charset=utf-8", PAGE_HEADERS)),
        Route("/page.js", _static(STATIC / "page.js", "text/javascript; charset=utf-8")),
        Route("/view.js", _static(VIEW_STATIC / "view.js", "text/javascript; charset=utf-8")),
        Route("/font.otf", font),
    ]
    # LibreTranslate answers browsers of any origin (web apps, extensions): so do we
    middleware = [Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"],
                             allow_headers=["*"])]
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={HTTPException: _not_found})


def serve(cfg) -> dict:
    """Serve ``cfg`` (checked: :func:`tinymt.config.check_serve`) until stopped; the worker
    then ends the batch it holds. Returns its counts (batches, sentences, ...)."""
    if cfg.threads and cfg.engine == "torch":
        torch.set_num_threads(cfg.threads)
    sock = _listen(cfg.host, cfg.port)  # a taken port fails before the model loads
    service, old_handlers = None, {}
    try:
        # on a thread that ends (an OpenMP team here beside the worker's: its search 3x slower)
        with concurrent.futures.ThreadPoolExecutor(1) as loader:
            run, device = loader.submit(load_translator, cfg, cfg.threads).result()
        service = Service(run, device, cfg)
        service.start()
        connection = type("Connection", (Connection,), {
            "read_timeout_s": cfg.read_timeout_s, "send_timeout_s": cfg.send_timeout_s})
        server = uvicorn.Server(uvicorn.Config(
            create_app(service), http=connection, log_level="warning",
            access_log=cfg.access_log, limit_concurrency=cfg.max_connections,
            server_header=False, timeout_graceful_shutdown=SHUTDOWN_S,
            h11_max_incomplete_event_size=1 << 16))  # a /translate?q=... request line
        host, port = sock.getsockname()[:2]
        search = "greedy" if cfg.decode.beam == 1 else f"beam {cfg.decode.beam}"
        print(f"serving {service.name} ({cfg.engine}, {service.pair.source}→"
              f"{service.pair.target}, {search}) on http://{f'[{host}]' if ':' in host else host}"
              f":{port}/ (the page; API: /translate, /languages). Ctrl-C stops.",
              file=sys.stderr, flush=True)
        # uvicorn raises the signal that stopped it again once it has shut down: with these
        # handlers that ends the process normally (exit 0), not killed by the signal
        old_handlers = {sig: signal.signal(sig, lambda *_: None)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
        server.run(sockets=[sock])
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        if service is not None:
            service.close(timeout=1.0)  # (SIGTERM: the process ends within 5 s)
        sock.close()
    stats = service.batcher.stats
    print(f"stopped: {stats['sentences']:,} sentences in {stats['batches']:,} batches",
          file=sys.stderr, flush=True)
    return dict(stats)


async def _on_daemon_thread(fn: Callable, *args):
    """``fn(*args)`` on a daemon thread of its own, awaited (not ``asyncio.to_thread``: its
    executor's threads are joined at exit, so a font cut would hold up a stop)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def work():
        try:
            result = fn(*args)
        except Exception as e:  # noqa: BLE001  (raised in the route)
            result = e
        settle(loop, future, result)

    threading.Thread(target=work, daemon=True).start()
    if isinstance(result := await future, Exception):
        raise result
    return result


READING = (h11.IDLE, h11.SEND_BODY)  # a client's request not yet whole (then DONE, or
# MUST_CLOSE where it said Connection: close or spoke HTTP/1.0)


class Connection(H11Protocol):
    """uvicorn's HTTP/1.1 connection with the deadlines it lacks: a request must arrive
    whole (headers and body) within ``read_timeout_s`` of its start (slowloris), an answer
    nobody reads for ``send_timeout_s`` is dropped with the bytes it holds, and a shutdown
    drops at once what is still arriving or not being read."""

    read_timeout_s = send_timeout_s = 10.0  # serve() sets the server's

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._send_timer = None
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._drop_if_reading)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state not in READING:  # the whole request is in
            self._read_timer.cancel()

    def on_response_complete(self) -> None:
        self._read_timer.cancel()  # the next request's clock (kept alive, or pipelined)
        self._read_timer = self.loop.call_later(self.read_timeout_s, self._drop_if_reading)
        super().on_response_complete()

    def _drop_if_reading(self) -> None:
        if self.conn.their_state in READING:
            self.transport.abort()

    def pause_writing(self) -> None:  # the client's buffers are full: it stopped reading
        super().pause_writing()
        self._send_timer = self.loop.call_later(self.send_timeout_s, self.transport.abort)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_timer is not None:
            self._send_timer.cancel()

    def connection_lost(self, exc) -> None:
        self._read_timer.cancel()
        if self._send_timer is not None:
            self._send_timer.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        busy = self.cycle is not None and not self.cycle.response_complete
        if busy and (self.conn.their_state is h11.SEND_BODY or self.flow.write_paused):
            self.transport.abort()  # a body still arriving, or an answer nobody reads
        else:
            super().shutdown()  # idle: closed; answering: closed once answered


def _listen(host: str, port: int) -> socket.socket:
    """The bound socket (uvicorn listens on it); a taken port or an unknown host is one
    line, before the model is warmed."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        # proto = TCP: asyncio then sets TCP_NODELAY on each connection (without it a kept-
        # alive request's body waits ~40 ms for the ACK of its headers: Nagle's algorithm)
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise TinyMTError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock
