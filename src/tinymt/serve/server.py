"""``serve(cfg)``: load the model once, warm it up, listen, and stop cleanly.

The model is loaded and warmed before the port is opened (``/health`` answers only when a
request would be served at full speed). uvicorn serves the app of :mod:`tinymt.serve.app`;
on SIGTERM or Ctrl-C it stops accepting connections, lets every accepted request get its
answer, then the worker stops and the process exits with status 0.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
from collections.abc import Iterator

import torch
import uvicorn

from tinymt.config import check_serve
from tinymt.errors import TinyMTError
from tinymt.serve.app import create_app
from tinymt.serve.service import Service
from tinymt.translate import load_translator


def serve(cfg) -> dict:
    """Serve until stopped; returns the worker's counts (batches, sentences, ...)."""
    check_serve(cfg)
    if cfg.threads and cfg.engine == "torch":
        torch.set_num_threads(cfg.threads)
    sock = _listen(cfg.host, cfg.port)  # a taken port fails before the model loads
    service = None
    try:
        run, device = load_translator(cfg, threads=cfg.threads)
        service = Service(run, device, cfg)
        service.start()
        server = uvicorn.Server(uvicorn.Config(
            create_app(service), log_level="warning", access_log=cfg.access_log,
            limit_concurrency=cfg.max_connections, lifespan="on", server_header=False,
            timeout_graceful_shutdown=cfg.timeout_s + 5))
        host, port = sock.getsockname()[:2]
        search = "greedy" if cfg.decode.beam == 1 else f"beam {cfg.decode.beam}"
        _say(f"serving {service.name} ({cfg.engine}, {service.pair.source}→"
             f"{service.pair.target}, {search}) on http://{_url_host(host)}:{port}/ "
             "(the page; API: /translate, /languages). Ctrl-C stops.")
        with _signals_end_normally():
            server.run(sockets=[sock])
    finally:
        if service is not None:
            service.close()
        sock.close()
    stats = service.batcher.stats
    _say(f"stopped: {stats['sentences']:,} sentences in {stats['batches']:,} batches")
    return dict(stats)


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


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _signals_end_normally() -> Iterator[None]:
    """uvicorn raises the signal that stopped it again once it has shut down; with these
    handlers in place that ends the process normally (exit 0), not killed by the signal."""
    old = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
