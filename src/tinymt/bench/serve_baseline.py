"""The serving benchmark's baseline: one ``scripts/translate.py`` process per request.

What serving without a server costs: every request starts Python, imports torch, loads
the run and translates one sentence. ``clients`` threads each run the next process when
their last one has exited (a closed loop, as the HTTP clients); a request's latency is its
process's wall time. Each process is reaped with ``os.wait4``, which gives that process's
own peak resident memory; levels of more than ``MAX_PROCESS_CLIENTS`` clients are not run
(that many torch processes at once would need that many times this memory) and their row
says so with the measured number.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from tinymt.bench.machine import REPO_ROOT
from tinymt.bench.measure import log
from tinymt.bench.serve_load import LoadResult, summarize
from tinymt.rundir import LoadedRun

MAX_PROCESS_CLIENTS = 8  # more translate.py processes at once are not started
METHOD = "translate_py"


def process_requests(clients: int, requests: int | None) -> int:
    """Processes of a level: ``--serve-process-requests`` (at least one per client), by
    default ``max(6, 2 × clients)``."""
    return max(requests, clients) if requests else max(6, 2 * clients)


def one_process(cmd: list[str]) -> tuple[float, str | None, float]:
    """``(wall ms, its stdout without the final newline or None on failure, its peak
    RSS in MiB)`` of one process."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err)
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        ms = (time.perf_counter() - t0) * 1000
        if proc.returncode != 0:
            err.seek(0)
            log(f"  translate.py failed ({proc.returncode}): "
                f"{err.read().decode(errors='replace')[-300:].strip()}")
            return ms, None, usage.ru_maxrss / 1024
    return ms, out.decode().rstrip("\n"), usage.ru_maxrss / 1024  # ru_maxrss: KiB (Linux)


def _process_level(cmd: list[str], texts: list[str], n: int, clients: int
                   ) -> tuple[LoadResult, float]:
    """``n`` requests by ``clients`` concurrent process runners; and the largest peak RSS."""
    jobs = [[*cmd, texts[i % len(texts)]] for i in range(n)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        done = list(pool.map(one_process, jobs))
    result = LoadResult(time.perf_counter() - t0, [ms for ms, _, _ in done],
                        [text for _, text, _ in done])
    result.errors = sum(text is None for _, text, _ in done)
    return result, max(rss for _, _, rss in done)


def bench_processes(run: LoadedRun, args: argparse.Namespace, device: torch.device,
                    texts: list[str], reference: list[str | None]) -> list[dict]:
    """The baseline's rows (engine torch, method ``translate_py``) at each of
    ``args.serve_client_list``; none with ``--serve-process-requests 0``."""
    if args.serve_process_requests == 0:
        return []
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "translate.py"), f"run={run.run_dir}",
           f"checkpoint={run.checkpoint}", f"device={device.type}", "--"]
    _, _, peak = one_process([*cmd, texts[0]])  # warm-up (file cache), untimed
    rows = []
    for clients in args.serve_client_list:
        row = {"engine": "torch", "method": METHOD, "clients": clients}
        if clients > MAX_PROCESS_CLIENTS:
            rows.append({**row, "not_run": f"not run: {clients} processes at once would hold about "
                         f"{clients} × {peak:,.0f} MiB = {clients * peak / 1024:,.1f} GiB "
                         "(one translate.py process's peak RSS)",
                         "process_peak_rss_mib": peak})
            continue
        n = process_requests(clients, args.serve_process_requests)
        result, level_peak = _process_level(cmd, texts, n, clients)
        peak = max(peak, level_peak)
        stats = summarize(result)
        equal = sum(a is not None and a == reference[i % len(reference)]
                    for i, a in enumerate(result.answers))
        rows.append({**row, **stats, "equal_to_one_at_a_time": equal,
                     "process_peak_rss_mib": level_peak})
        log(f"[serve translate.py] {clients:>3} clients: {stats['sentences_per_s']:7.2f} "
            f"sentences/s, p50 {stats['p50_ms']:.0f} ms, p99 {stats['p99_ms']:.0f} ms, "
            f"{stats['errors']} errors, {equal}/{n} equal")
    return rows
