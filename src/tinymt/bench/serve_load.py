"""The serving benchmark's load: ``clients`` concurrent HTTP/1.1 clients in one asyncio loop.

Each client holds one keep-alive connection and runs a closed loop: it sends its next
request when the answer to the previous one has arrived (LibreTranslate's
``POST /translate``, one sentence a request). The client is deliberately small -- a request
written by hand, the status line, headers and a ``Content-Length`` body read back -- so
that the load it puts on the CPU stays small beside the server's.

    >>> percentile([30.0, 10.0, 20.0], 0.5)
    20.0
    >>> percentile([10.0, 20.0], 0.99)
    19.9
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 120.0  # longer than the server's own request timeout (60 s)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, interpolated linearly between ranks (numpy's
    default); NaN for no values."""
    if not values:
        return float("nan")
    xs = sorted(values)
    rank = q * (len(xs) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


class HttpError(Exception):
    """An answer this client cannot read (no status line, a chunked body, a cut one)."""


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers with lower-case names, body)`` of one HTTP/1.1 response whose
    body has a ``Content-Length`` (what uvicorn sends for a JSON answer)."""
    status_line = await reader.readline()
    parts = status_line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise HttpError("connection closed inside the headers")
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" not in headers:
        raise HttpError(f"no Content-Length (transfer-encoding "
                        f"{headers.get('transfer-encoding', 'none')})")
    body = await reader.readexactly(int(headers["content-length"]))
    return int(parts[1]), headers, body


def post_request(host: str, port: int, path: str, payload: dict) -> bytes:
    """A minimal ``POST`` with a JSON body, the connection kept alive."""
    body = json.dumps(payload, ensure_ascii=False).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


class Connection:
    """One keep-alive connection, reopened after a failure or a ``Connection: close``."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: dict) -> tuple[int, object]:
        """``(status, the parsed JSON answer)``; raises on a broken connection."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), CONNECT_TIMEOUT_S)
        try:
            self.writer.write(post_request(self.host, self.port, path, payload))
            await self.writer.drain()
            status, headers, body = await asyncio.wait_for(read_response(self.reader),
                                                           ANSWER_TIMEOUT_S)
        except BaseException:
            await self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, json.loads(body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None


@dataclass
class LoadResult:
    """One load level: every timed request's latency and answer (None: an error)."""

    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)  # by request index
    errors: int = 0
    first_error: str | None = None


async def _load(host: str, port: int, payloads: list[dict], clients: int,
                warmup: list[dict]) -> LoadResult:
    conns = [Connection(host, port) for _ in range(clients)]
    result = LoadResult(0.0, answers=[None] * len(payloads))
    next_index = 0

    async def ask(conn: Connection, payload: dict) -> str | None:
        try:
            status, answer = await conn.post("/translate", payload)
        except (OSError, HttpError, asyncio.IncompleteReadError, asyncio.TimeoutError,
                ValueError) as e:
            answer, status = f"{type(e).__name__}: {e}", None
        if status == 200 and isinstance(answer, dict) and "translatedText" in answer:
            return answer["translatedText"]
        result.errors += 1
        result.first_error = result.first_error or f"{status}: {str(answer)[:200]}"
        return None

    async def client(conn: Connection) -> None:
        nonlocal next_index
        while next_index < len(payloads):
            i = next_index
            next_index += 1
            t0 = time.perf_counter()
            result.answers[i] = await ask(conn, payloads[i])
            result.latencies_ms.append((time.perf_counter() - t0) * 1000)

    # warm-up, untimed: every client opens its connection and is answered once
    await asyncio.gather(*(ask(c, warmup[k % len(warmup)]) for k, c in enumerate(conns)))
    result.errors, result.first_error = 0, None
    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    result.seconds = time.perf_counter() - t0
    await asyncio.gather(*(c.close() for c in conns))
    return result


def run_load(host: str, port: int, payloads: list[dict], clients: int) -> LoadResult:
    """``payloads`` (``/translate`` bodies) sent by ``clients`` closed-loop clients, in
    order of the request index, after an untimed warm-up request per client."""
    return asyncio.run(_load(host, port, payloads, clients, payloads[:clients]))


def summarize(result: LoadResult) -> dict:
    """The numbers of a level: sentences/s (answered requests ÷ wall time), p50 and p99
    latency in ms, errors."""
    n = len(result.answers)
    return {"requests": n, "seconds": result.seconds,
            "sentences_per_s": (n - result.errors) / result.seconds if result.seconds else 0.0,
            "p50_ms": percentile(result.latencies_ms, 0.50),
            "p99_ms": percentile(result.latencies_ms, 0.99),
            "errors": result.errors, "first_error": result.first_error}
