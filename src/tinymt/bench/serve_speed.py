"""The serving benchmark (``--sections serve``): ``scripts/serve.py`` under load.

For each engine (the run's checkpoint on torch; its CTranslate2 export when the ``ct2``
extra is installed) two servers run side by side, each a ``scripts/serve.py`` process on a
loopback port: *micro-batching* (the server's defaults) and *one at a time*
(``batch_sentences=1 batch_wait_ms=0``). At every load level (``--serve-clients``) the two
are measured one after the other with the same requests by the closed-loop clients of
:mod:`tinymt.bench.serve_load`: sentences/s, p50 / p99 latency, errors, the server's
resident memory, and how many answers equal the one-at-a-time server's answer to the same
sentence alone (the reference pass: every sentence once, one client). Beside them
(:mod:`tinymt.bench.serve_baseline`), one ``translate.py`` process per request.

The sentences are the source side of the run's own test split (the run's data config,
prepared as the trainer prepared it; normally a cache hit), the first of them in order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tinymt.bench.machine import REPO_ROOT, machine_info
from tinymt.bench.measure import log
from tinymt.bench.serve_baseline import bench_processes
from tinymt.bench.serve_load import run_load, summarize
from tinymt.config import DataConfig
from tinymt.ct2 import export_run, require_ct2
from tinymt.data import prepare, source_language, target_language
from tinymt.errors import TinyMTError
from tinymt.rundir import LoadedRun, load_run

HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0  # loading and warming the model before /health answers
SERVE_METHODS = {  # method -> the server's settings beyond the engine's
    "one_at_a_time": ["batch_sentences=1", "batch_wait_ms=0"],
    "micro_batching": [],  # configs/serve.yaml's batch_sentences, batch_wait_ms
}


def requests_at(clients: int, requests: int | None) -> int:
    """Timed requests of a level: ``--serve-requests`` (at least one per client), by default
    ``max(40, 4 × clients)``."""
    return max(requests, clients) if requests else max(40, 4 * clients)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python scripts/serve.py <overrides>`` on a free loopback port, up once ``/health``
    answers 200 (a bounded wait); its stderr kept for the error message."""

    def __init__(self, overrides: list[str]):
        self.port = free_port()
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "scripts" / "serve.py"), *overrides,
             f"port={self.port}", f"host={HOST}", "access_log=false"],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self.log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError, ValueError):
                self.health()
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                tail = self.log.read()[-1500:].strip().replace("\n", " | ")
                raise TinyMTError(f"serve.py {' '.join(overrides)} did not serve within "
                                  f"{START_TIMEOUT_S:g} s: {tail}")
            time.sleep(0.2)

    def health(self) -> dict:
        """``GET /health`` (raises until the server answers 200)."""
        with urllib.request.urlopen(f"{self.base}/health", timeout=10) as r:
            return json.loads(r.read())

    def rss_mib(self) -> float | None:
        """The server's resident memory now (``VmRSS``, /proc); None where unreadable."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        match = re.search(r"VmRSS:\s+(\d+)", status)
        return int(match.group(1)) / 1024 if match else None

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        """``(exit status, stderr)`` after ``sig`` (SIGTERM: the server finishes what it
        accepted); killed after 60 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        err = ""
        if not self.log.closed:
            self.log.seek(0)
            err = self.log.read()
            self.log.close()
        return self.proc.returncode, err

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_sentences(run: LoadedRun, n: int) -> tuple[list[str], str]:
    """The first ``n`` source sentences of the run's test split (all of it when shorter:
    the requests then cycle through them), and where they come from."""
    data_cfg = run.config.get("data") if isinstance(run.config, dict) else None
    if not data_cfg:
        raise TinyMTError(f"{run.checkpoint} holds no data config: the serve section reads "
                          "its sentences from the run's test split")
    cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), data_cfg)
    data = prepare(cfg, log=lambda msg: log(f"  {msg}"))
    test = data.splits["test"]
    texts = list(test["src"][:min(n, len(test))])
    if not texts:
        raise TinyMTError(f"{run.run_dir}: the run's test split is empty")
    return texts, f"the first {len(texts):,} source sentences of the run's test split " \
                  f"(data `{cfg.name}`)"


def repo_relative(path: Path) -> str:
    """``path`` relative to the checkout when inside it (as the report names files)."""
    rel = os.path.relpath(Path(path).resolve(), REPO_ROOT)
    return str(path) if rel.startswith("..") else rel


def _level(server: ServerProcess, payloads: list[dict], clients: int,
           reference: list[str | None]) -> dict:
    """One load level on one server: its numbers, how many answers equal the reference,
    the server's memory and batching afterwards."""
    before = server.health()
    result = run_load(HOST, server.port, payloads, clients)
    row, answers = summarize(result), result.answers
    after = server.health()
    batches = after.get("batches", 0) - before.get("batches", 0)
    sentences = after.get("sentences", 0) - before.get("sentences", 0)
    row.update({
        "clients": clients,
        "equal_to_one_at_a_time": sum(a is not None and a == reference[i % len(reference)]
                                      for i, a in enumerate(answers)),
        "server_rss_mib": server.rss_mib(),
        "mean_batch": sentences / batches if batches else None,
        "largest_batch": after.get("largest_batch"),
    })
    return row


def _bench_engine(engine: str, overrides: list[str], payloads: list[dict],
                  levels: dict[int, int]) -> tuple[list[dict], list[str | None]]:
    """Both methods of one engine, level by level, alternating; and the reference answers
    (the one-at-a-time server, each sentence alone, untimed)."""
    rows = []
    with contextlib.ExitStack() as stack:
        servers = {m: stack.enter_context(ServerProcess([*overrides, *extra]))
                   for m, extra in SERVE_METHODS.items()}
        alone = servers["one_at_a_time"]
        ref = run_load(HOST, alone.port, payloads, 1)
        reference = ref.answers
        if ref.errors:
            raise TinyMTError(f"serve benchmark, {engine}: {ref.errors} of the reference "
                              f"requests failed ({ref.first_error})")
        for clients, n in levels.items():
            for method, server in servers.items():
                row = _level(server, [payloads[i % len(payloads)] for i in range(n)],
                             clients, reference)
                rows.append({"engine": engine, "method": method, **row})
                log(f"[serve {engine}] {method:<14} {clients:>3} clients: "
                    f"{row['sentences_per_s']:7.1f} sentences/s, p50 {row['p50_ms']:.0f} ms, "
                    f"p99 {row['p99_ms']:.0f} ms, {row['errors']} errors, "
                    f"{row['equal_to_one_at_a_time']}/{n} equal")
    return rows, reference


@contextlib.contextmanager
def _engines(run: LoadedRun, device: torch.device, skipped: dict
             ) -> Iterator[list[tuple[str, list[str]]]]:
    """``[(engine, serve.py overrides)]``: torch on the run's checkpoint; ct2 on its export
    (float32) in a temporary folder, unless the extra is missing (said in ``skipped``)."""
    engines = [("torch", [f"run={run.run_dir}", f"checkpoint={run.checkpoint}"])]
    with tempfile.TemporaryDirectory(prefix="tinymt-bench-serve-") as tmp:
        try:
            require_ct2()
        except TinyMTError as e:
            skipped["ct2"] = str(e)
            log(f"serve: no CTranslate2 rows ({e})")
        else:
            folder = export_run(run, Path(tmp) / "ct2", "none")
            engines.append(("ct2", ["engine=ct2", f"model_dir={folder}"]))
        yield engines


def bench_serve(args: argparse.Namespace, device: torch.device, argv: list[str]) -> dict:
    """The serve section of a device's results: settings, rows, ratios, and which command
    measured it (``machine``)."""
    t_start = time.monotonic()
    run = load_run(args.run, args.checkpoint, "cpu")
    levels = {c: requests_at(c, args.serve_requests) for c in args.serve_client_list}
    texts, origin = run_sentences(run, max(levels.values()))
    data = run.config.get("data", {})
    pair = {"source": source_language(data), "target": target_language(data)}
    payloads = [{"q": t, **pair} for t in texts]
    threads = torch.get_num_threads()
    common = [f"device={device.type}", f"threads={threads}"]
    rows, skipped, refs = [], {}, {}
    log(f"serve benchmark: {run.run_dir}, clients {','.join(map(str, levels))}, "
        f"{threads} threads")
    with _engines(run, device, skipped) as engines:
        for engine, overrides in engines:
            engine_rows, refs[engine] = _bench_engine(engine, [*overrides, *common],
                                                      payloads, levels)
            rows += engine_rows
    rows += bench_processes(run, args, device, texts, refs["torch"])
    defaults = OmegaConf.load(REPO_ROOT / "configs" / "serve.yaml")
    return {
        "machine": machine_info(device, argv),
        "settings": {
            "run": repo_relative(run.run_dir), "checkpoint": run.checkpoint.name,
            "pair": pair,
            "sentences": len(texts), "sentence_source": origin,
            "requests": {str(c): n for c, n in levels.items()},
            "threads": threads, "device": device.type, "beam": defaults.decode.beam,
            "batch_sentences": defaults.batch_sentences,
            "batch_wait_ms": defaults.batch_wait_ms,
        },
        "rows": rows,
        "skipped": skipped,
        "ct2_equal_to_torch": (sum(a == b for a, b in zip(refs["ct2"], refs["torch"]))
                               if "ct2" in refs else None),
        "wall_seconds": round(time.monotonic() - t_start, 1),
    }

