"""Running a script measured (:mod:`tinymt.bench.scale`): its process tree's memory, sampled,
and the steps :data:`DRIVER` marks in it.

``python -c DRIVER <MARK> <prepare|train> <script> <args>`` runs the script as ``python
<script> <args>`` does, with the functions named in it wrapped to print, on stderr, when
they begin and end (the system-wide monotonic clock, as :func:`time.monotonic` reads it
here). :func:`run_measured` reads those marks and samples ``VmRSS`` / ``RssAnon`` of the
process and its descendants every :data:`POLL_S` seconds; :func:`phases` puts each sample in
the step it was taken in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tinymt.errors import TinyMTError

POLL_S = 0.05
PROCESS_TIMEOUT_S = 4 * 3600.0

MARK = "@@scale"
KIB = 1024

# Runs a script as `python <script> <args>` does, marking the steps named below. Prepare:
# the pipeline's build steps; train: the trainer's set-up, then every optimizer step, and
# the process ends (os._exit) when the last one is done: no validation, test or checkpoint.
DRIVER = r"""
import os, runpy, sys, time
MARK = sys.argv[1]
mode, script = sys.argv[2], sys.argv[3]
sys.argv = [script, *sys.argv[4:]]

def mark(*words):
    print(MARK, f"{time.monotonic():.4f}", *words, file=sys.stderr, flush=True)

def wrap(owner, name, label, split_arg=False):
    inner = getattr(owner, name, None)
    if inner is None:  # renamed since: that step is not marked, the script runs all the same
        return
    def wrapped(*a, **k):
        tag = f"{label}:{a[1]}" if split_arg else label
        mark("begin", tag)
        try:
            return inner(*a, **k)
        finally:
            mark("end", tag)
    setattr(owner, name, wrapped)

if mode == "prepare":
    from tinymt.data import pipeline as p
    wrap(p, "_normalise_split", "normalise", split_arg=True)
    wrap(p, "_train_tokenizers", "sentencepiece")
    wrap(p, "_tokenize_split", "tokenize")
    wrap(p, "load_prepared", "load_cache")
else:
    from tinymt.data import prepared
    from tinymt.trainer import loop
    wrap(loop, "prepare", "load_cache")
    wrap(loop, "build_model", "model")
    wrap(prepared.PreparedData, "lengths", "lengths")

    class Sampler(loop.TokenBatchSampler):
        def __init__(self, *a, **k):
            mark("begin", "sampler")
            super().__init__(*a, **k)
            mark("end", "sampler")
    loop.TokenBatchSampler = Sampler
    batches = loop.global_batches

    def global_batches(t):
        mark("begin", "first_batch")
        source = batches(t)
        first = next(source)
        mark("end", "first_batch")
        yield first
        yield from source
    loop.global_batches = global_batches
    train_step, optimizer_step = loop.train_step, loop.optimizer_step

    def timed_step(t, micro):
        mark("step_begin", t.state["step"] + 1)
        mark("begin", "steps")
        loss, tokens = train_step(t, micro)
        mark("tokens", tokens)
        return loss, tokens

    def timed_optimizer_step(t):
        norm = optimizer_step(t)
        mark("end", "steps")
        mark("step_end", t.state["step"])
        if t.state["step"] >= t.cfg.trainer.max_steps:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return norm
    loop.train_step, loop.optimizer_step = timed_step, timed_optimizer_step
runpy.run_path(script, run_name="__main__")
"""


def _children(pid: int) -> list[int]:
    out = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``/proc/<pid>/task/*/children``)."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += _children(p)
    return tree


def _status_kib(pid: int) -> dict[str, int]:
    """``VmRSS``, ``RssAnon``, ``VmHWM`` of ``pid`` in KiB (empty when it is gone)."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


@dataclass
class Run:
    """What :func:`run_measured` saw of one process: its output lines, the driver's marks
    ``(time, words...)``, memory samples ``(time, rss KiB, anon KiB)``."""

    returncode: int = 0
    seconds: float = 0.0
    t0: float = 0.0
    peak_rss_kib: int = 0  # the high-water mark: ru_maxrss of wait4, the largest VmHWM
    lines: list[str] = field(default_factory=list)
    marks: list[tuple[float, list[str]]] = field(default_factory=list)
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def tail(self, n: int = 15) -> str:
        return " | ".join(line for line in self.lines[-n:] if line.strip())


def _read_output(proc: subprocess.Popen, run: Run) -> None:
    for line in proc.stdout:  # a mark may follow a progress bar's text on its line
        line, _, marked = line.rstrip("\n").partition(MARK)
        words = marked.split()
        if len(words) >= 2:
            run.marks.append((float(words[0]), words[1:]))
        if line.strip():
            run.lines.append(line)


def _sample(pid: int, run: Run) -> int:
    """One memory sample of ``pid``'s tree; returns the largest ``VmHWM`` sum seen."""
    rss = anon = hwm = 0
    for p in process_tree(pid):
        status = _status_kib(p)
        rss += status.get("VmRSS", 0)
        anon += status.get("RssAnon", 0)
        hwm += status.get("VmHWM", 0)
    if rss:
        run.samples.append((time.monotonic(), rss, anon))
    return hwm


def run_measured(mode: str, script: str, overrides: list[str], cwd: Path,
                 timeout: float = PROCESS_TIMEOUT_S) -> Run:
    """``python <script> <overrides>`` under :data:`DRIVER` (``mode``: prepare | train),
    measured (see the module docstring); its output is kept in :attr:`Run.lines`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    run = Run(t0=time.monotonic())
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, MARK, mode, script, *overrides],
                            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    reader = threading.Thread(target=_read_output, args=(proc, run), daemon=True)
    reader.start()
    hwm = 0
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = run.returncode = os.waitstatus_to_exitcode(status)
                run.seconds = time.monotonic() - run.t0
                run.peak_rss_kib = max(hwm, usage.ru_maxrss)
                break
            hwm = max(hwm, _sample(proc.pid, run))
            if time.monotonic() - run.t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(POLL_S)
    finally:
        if proc.returncode is None:  # interrupted: leave no process behind
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=30)
    return run


def phases(run: Run) -> dict[str, dict]:
    """Each marked step (``begin`` / ``end`` marks; repeated ones summed): its seconds and
    the largest RSS / anonymous MiB sampled in it; samples outside every step go to
    ``other``. A sample belongs to the innermost step open at its time."""
    spans, open_ = [], {}
    for t, words in run.marks:
        if words[0] == "begin":
            open_[words[1]] = t
        elif words[0] == "end" and words[1] in open_:
            spans.append((open_.pop(words[1]), t, words[1]))
    out: dict[str, dict] = {}

    def entry(name: str) -> dict:
        return out.setdefault(name, {"seconds": 0.0, "peak_rss_mib": 0.0, "peak_anon_mib": 0.0})

    for begin, end, name in spans:
        entry(name)["seconds"] += end - begin
    for t, rss, anon in run.samples:
        inside = [s for s in spans if s[0] <= t <= s[1]]
        e = entry(max(inside)[2] if inside else "other")
        e["peak_rss_mib"] = max(e["peak_rss_mib"], rss / KIB)
        e["peak_anon_mib"] = max(e["peak_anon_mib"], anon / KIB)
    return out


def peaks(run: Run) -> dict:
    """Peak RSS (the high-water mark), peak anonymous memory (sampled), the step where
    each was largest."""
    ph = phases(run)
    return {"peak_rss_mib": run.peak_rss_kib / KIB,
            "sampled_peak_rss_mib": max((s[1] for s in run.samples), default=0) / KIB,
            "peak_anon_mib": max((s[2] for s in run.samples), default=0) / KIB,
            "peak_rss_phase": max(ph, key=lambda k: ph[k]["peak_rss_mib"]) if ph else None,
            "peak_anon_phase": max(ph, key=lambda k: ph[k]["peak_anon_mib"]) if ph else None,
            "phases": ph, "samples": len(run.samples)}


def check(run: Run, what: str) -> None:
    if run.returncode != 0:
        raise TinyMTError(f"{what} exited with status {run.returncode}: {run.tail()}")
