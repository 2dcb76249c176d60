"""Serving (``--sections serve``): per engine (torch; the run's CTranslate2 export)
``scripts/serve.py`` side by side, *micro-batching* (the defaults) and *one at a time*,
take the same requests (``POST /translate``, a test sentence each) at each level of
closed-loop clients, each client on its own keep-alive connection, in :data:`PASSES`
passes, the servers' order reversed each time."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import httpx2
import numpy as np
import torch
from omegaconf import OmegaConf

from tinymt.bench.measure import REPO_ROOT, log, machine_info, proc_status
from tinymt.config import DataConfig, as_typed
from tinymt.ct2 import export_run
from tinymt.data import prepare, source_language, target_language
from tinymt.errors import TinyMTError
from tinymt.rundir import load_run

HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0  # loading and warming the model before /health answers
PASSES = 4  # a level's requests in this many parts, the servers' order reversed each time
METHODS = {"one_at_a_time": ["batch_sentences=1", "batch_wait_ms=0"],
           "micro_batching": []}  # settings beyond the engine's
SERVE_SCRIPT = REPO_ROOT / "scripts" / "serve.py"


class ServerProcess:
    """``python scripts/serve.py <overrides>`` on a port of its own choosing (``port=0``:
    the one it prints), up once ``/health`` answers there (a bounded wait); its stderr kept
    for the error message."""

    popen = subprocess.Popen  # (the tests start it from a process that has imported torch)

    def __init__(self, overrides: list[str]):
        self.log = tempfile.TemporaryFile()
        self.proc = self.popen(
            [sys.executable, str(SERVE_SCRIPT), *overrides, "port=0", f"host={HOST}",
             "access_log=false"], cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=self.log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        started = time.monotonic()  # until /health answers on the port it printed
        while self.proc.poll() is None and time.monotonic() < started + START_TIMEOUT_S:
            if bound := re.search(rf" on http://{HOST}:(\d+)/", self.stderr()):
                self.port, self.base = int(bound[1]), f"http://{HOST}:{bound[1]}"
                with contextlib.suppress(httpx2.HTTPError, ValueError):
                    self.health()
                    return
            time.sleep(0.2)
        err = self.stop()[1][-1500:].strip().replace("\n", " | ")
        raise TinyMTError(f"serve.py {' '.join(overrides)} did not serve within "
                          f"{START_TIMEOUT_S:g} s: {err}")

    def health(self) -> dict:
        """``GET /health`` (raises until it answers 200; no TLS context: ~40 ms of CPU)."""
        return httpx2.get(f"{self.base}/health", timeout=10, trust_env=False, verify=False
                          ).raise_for_status().json()

    def rss_mib(self) -> float | None:
        """The server's resident memory now (MiB; None where ``/proc`` cannot tell, an
        exited server's included)."""
        kib = proc_status(self.proc.pid).get("VmRSS")
        exited = self.proc.poll() is not None  # (after: a pid is reused only once reaped)
        return None if kib is None or exited else kib / 1024

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        """``(exit status, stderr)`` after ``sig``; killed after 60 s."""
        self.proc.send_signal(sig)  # (none to an exited one: Popen checks)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.stderr()

    def stderr(self) -> str:  # what the server wrote so far (pread: the offset it writes at stays)
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")


async def _load(base: str, payloads: list[dict], clients: int) -> dict:
    """``payloads`` sent by ``clients`` closed-loop clients after one untimed request each:
    the timed seconds, each answer (None: failed), the latencies (ms), the errors."""
    limits = httpx2.Limits(max_connections=clients, max_keepalive_connections=clients)
    answers: list[str | None] = [None] * len(payloads)
    latencies, errors = [], []
    async with httpx2.AsyncClient(base_url=base, limits=limits, timeout=120,
                                  trust_env=False, verify=False) as http:
        async def ask(payload: dict) -> str | None:
            try:
                r = await http.post("/translate", json=payload)
                if r.status_code == 200:
                    return r.json()["translatedText"]
                errors.append(f"{r.status_code}: {r.text[:200]}")
            except (httpx2.HTTPError, ValueError, KeyError) as e:
                errors.append(f"{type(e).__name__}: {e}")
            return None

        todo = iter(range(len(payloads)))  # shared: each client takes the next request

        async def client() -> None:
            for i in todo:
                t0 = time.perf_counter()
                answers[i] = await ask(payloads[i])
                latencies.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(ask(payloads[k % len(payloads)]) for k in range(clients)))
        errors.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "answers": answers, "latencies": latencies, "errors": errors}


def _level(servers: dict[str, ServerProcess], payload: list[dict], clients: int) -> dict[str, dict]:
    """``payload`` sent by ``clients`` clients to each server in :data:`PASSES` passes, the
    servers' order reversed each time (a drift weighs alike): a row a server (sentences/s:
    the median pass, one noisy pass is outvoted; latencies over all)."""
    parts, order = {method: [] for method in servers}, list(servers)
    cuts = [len(payload) * k // PASSES for k in range(PASSES + 1)]
    for k, (a, b) in enumerate(zip(cuts, cuts[1:])):
        for method in order[::-1] if k % 2 else order:
            before = servers[method].health()
            part = asyncio.run(_load(servers[method].base, payload[a:b], clients))
            after = servers[method].health()
            part.update({key: after.get(key, 0) - before.get(key, 0)
                         for key in ("batches", "sentences")})
            parts[method].append(part)
    rows = {}
    for method, ps in parts.items():
        latencies, errors = ([x for p in ps for x in p[key]] for key in ("latencies", "errors"))
        batches = sum(p["batches"] for p in ps)
        p50, p99 = np.percentile(latencies, [50, 99])  # linear between ranks
        rows[method] = {
            "requests": len(payload), "seconds": sum(p["seconds"] for p in ps),
            "sentences_per_s": statistics.median(
                (len(p["answers"]) - len(p["errors"])) / p["seconds"] for p in ps),
            "p50_ms": float(p50), "p99_ms": float(p99),
            "errors": len(errors), "first_error": errors[0] if errors else None,
            "clients": clients, "server_rss_mib": servers[method].rss_mib(),
            "mean_batch": sum(p["sentences"] for p in ps) / batches if batches else None}
    return rows


def _bench_engine(engine: str, overrides: list[str], payloads: list[dict],
                  levels: dict[int, int]) -> list[dict]:
    """The servers of one engine, level by level in turn."""
    rows, servers = [], {}
    with contextlib.ExitStack() as stack:
        for method in METHODS:
            servers[method] = ServerProcess([*overrides, *METHODS[method]])
            stack.callback(servers[method].stop)
        for clients, n in levels.items():
            level = _level(servers, [payloads[i % len(payloads)] for i in range(n)], clients)
            for method, row in level.items():
                rows.append({"engine": engine, "method": method, **row})
                log(f"[serve {engine}] {method:<14} {clients:>3} clients: "
                    f"{row['sentences_per_s']:7.1f} sentences/s, p50 {row['p50_ms']:.0f} ms, "
                    f"p99 {row['p99_ms']:.0f} ms, {row['errors']} errors")
    return rows


def bench_serve(args: argparse.Namespace, device: torch.device, argv: list[str]) -> dict:
    """The serve section: ``{"machine", "settings", "rows", "skipped", "hostile"}``."""
    run = load_run(args.run, args.checkpoint, "cpu")
    levels = {c: max(args.serve_requests, c) if args.serve_requests else max(40, 4 * c)
              for c in args.serve_clients}
    # the run's own test split, prepared as the trainer prepared it (normally a cache hit)
    test = prepare(as_typed(DataConfig, run.config["data"]),
                   log=lambda msg: log(f"  {msg}")).splits["test"]  # (never empty: prepare)
    texts = list(test["src"][:max(levels.values())])
    data = run.config.get("data", {})
    pair = {"source": source_language(data), "target": target_language(data)}
    payloads = [{"q": t, **pair} for t in texts]
    common = [f"device={device.type}", f"threads={torch.get_num_threads()}"]
    engines = {"torch": [f"run={run.run_dir}", f"checkpoint={run.checkpoint}"]}
    rows, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="tinymt-bench-serve-") as tmp:
        try:  # (export_run refuses first where the ct2 extra is missing)
            engines["ct2"] = ["engine=ct2", f"model_dir={export_run(run, Path(tmp) / 'ct2')}"]
        except TinyMTError as e:
            skipped["ct2"] = str(e)
            log(f"serve: no CTranslate2 rows ({e})")
        for engine, overrides in engines.items():
            rows += _bench_engine(engine, [*overrides, *common], payloads, levels)
    hostile = args.hostile_seconds and hostile_row(
        [*engines["torch"], *common], args.hostile_seconds, texts[0], pair)
    defaults = OmegaConf.load(REPO_ROOT / "configs" / "serve.yaml")
    return {"machine": machine_info(device, argv), "settings": {
        "quick": args.quick, "run": os.path.relpath(run.run_dir, REPO_ROOT),
        "checkpoint": run.checkpoint.name,
        "pair": pair, "sentences": len(texts), "requests": {str(c): n for c, n in levels.items()},
        "threads": torch.get_num_threads(), "beam": defaults.decode.beam,
        "batch_sentences": defaults.batch_sentences, "batch_wait_ms": defaults.batch_wait_ms},
        "rows": rows, "skipped": skipped, "hostile": hostile or None}


# ----------------------------------------------------------------------------- hostile load
# long: the load's kinds of client side by side, each a few lines, and the probes beside
async def hostile_load(port: int, seconds: float, rss: Callable[[], float], *, fonts: int,
                       stalled: int, slowloris: int, font_path: str = "/font.otf",
                       probe: tuple[str, str, bytes] = ("POST", "/translate", b""),
                       texts: int = 0, text_requests: list[tuple[str, bytes]] = ()) -> dict:
    """On loopback for ``seconds``, side by side: ``fonts`` clients cutting distinct
    4,096-character fonts, ``stalled`` POSTing the largest ``/attention`` unread, ``slowloris``
    (a header byte a second), ``texts`` sending ``text_requests`` (head, body) in turn; each
    second ``probe`` (method, path, body) and ``/health`` on new connections. Returns their
    ms (None: no 2xx in 10 s), answers by status, slow connections dropped, ``rss()`` MiB."""
    end = time.monotonic() + seconds
    out = {"fonts": {}, "texts": {}, "probes_ms": [], "rss_mib": [rss()], "dropped": 0}
    draw, cjk = random.Random(0), [chr(c) for c in range(0x4E00, 0x9FA5)]
    cuts = [(f"GET {font_path}?text={urllib.parse.quote(''.join(draw.sample(cjk, 4096)))}",
             b"") for _ in range(64)]  # more than the cache keeps

    async def ask(head: str, body: bytes = b"", read: bool = True) -> int | None:
        reader, writer = await asyncio.open_connection(HOST, port)
        try:  # (a client that does not read lets the kernel's buffers fill, then stalls)
            writer.write(f"{head} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                         + body)
            while not read and time.monotonic() < end:
                await asyncio.sleep(0.5)
            if not read:
                return None
            line = await reader.readline()
            await reader.read()
            return int(line.split()[1])
        finally:
            writer.close()

    async def client(k: int, step: int, requests: list, counts: dict) -> None:
        while time.monotonic() < end:
            k += step  # (the clients' requests in turn)
            with contextlib.suppress(OSError, ValueError, IndexError, asyncio.TimeoutError):
                status = await asyncio.wait_for(  # (a cut under way when the load ends: left)
                    ask(*requests[k % len(requests)]), end - time.monotonic())
                counts[str(status)] = counts.get(str(status), 0) + 1
                await asyncio.sleep(0.05 if status != 200 else 0)  # (spares the machine)

    async def loris() -> None:
        while time.monotonic() < end:
            try:
                _, writer = await asyncio.open_connection(HOST, port)
                writer.write(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
                while time.monotonic() < end:
                    await asyncio.sleep(1)
                    writer.write(b"X")
                    await writer.drain()  # OSError once the server dropped it
            except OSError:
                out["dropped"] += 1
                await asyncio.sleep(1)

    def probe_once(method: str, path: str, body: bytes) -> float | None:  # on a thread: the
        t0 = time.perf_counter()  # load's own loop does not delay it
        with contextlib.suppress(httpx2.HTTPError):
            r = httpx2.request(method, f"http://{HOST}:{port}{path}", content=body,
                               headers={"Content-Type": "application/json"}, timeout=10,
                               trust_env=False, verify=False)
            return (time.perf_counter() - t0) * 1000 if r.is_success else None
        return None

    async def watch() -> None:  # a probe a second, each on its own thread and connection
        probes = []
        while time.monotonic() < end:
            await asyncio.sleep(1)
            out["rss_mib"].append(rss())
            probes += [asyncio.create_task(asyncio.to_thread(probe_once, *p))
                       for p in (probe, ("GET", "/health", b""))]
        done = await asyncio.gather(*probes)
        out["probes_ms"], out["health_ms"] = done[::2], done[1::2]

    big = json.dumps({"q": ["我请李雷帮我订了去北京的机票。" * 333] * 8}).encode()
    stall = [ask("POST /attention", big, read=False) for _ in range(stalled)]
    await asyncio.gather(*(client(k, fonts, cuts, out["fonts"]) for k in range(fonts)),
                         *(client(k, texts, text_requests, out["texts"]) for k in range(texts)),
                         *(loris() for _ in range(slowloris)), *stall, watch(),
                         return_exceptions=True)
    known = None not in out["rss_mib"]  # (None: /proc cannot tell)
    return {**out, "rss_start_mib": out["rss_mib"][0],
            "rss_peak_mib": max(out["rss_mib"]) if known else None}


def hostile_row(overrides: list[str], seconds: float, probe_text: str, pair: dict) -> dict:
    """:func:`hostile_load` (40 stalled, 200 slowloris, 8 sending text:
    too many sentences, markup read in quadratic time, 50,000 characters to identify, bad
    fields) on a server of the defaults, then SIGTERM: the probes, the memory, the stop."""
    server = ServerProcess(overrides)
    bad = [("POST /translate", {"q": ["猫\n" * 2500] * 2}),
           ("POST /detect", {"q": [probe_text * (5000 // len(probe_text))] * 10}),
           ("POST /translate", {"q": [("<a " * 1667)[:5000]] * 8, "format": "html"}),
           ("POST /translate", {"q": "\ud800猫", "alternatives": "³"})]
    try:
        body = json.dumps({"q": probe_text, **pair}).encode()
        load = asyncio.run(hostile_load(
            server.port, seconds, server.rss_mib, fonts=0, stalled=40, slowloris=200,
            probe=("POST", "/translate", body), texts=8,
            text_requests=[(h, json.dumps({**b, **pair}).encode()) for h, b in bad]))
    finally:
        t0 = time.monotonic()
        status, err = server.stop(signal.SIGTERM)
    log(f"[serve hostile] probes (ms): {load['probes_ms']}; exit {status}")
    return {**load, "seconds": seconds, "stop_s": time.monotonic() - t0, "exit": status,
            "stderr_lines": len(err.splitlines()), "stderr_tail": err.splitlines()[-8:],
            "traceback": "Traceback" in err}
