"""The Attention tab's server under many steps and probes (``--sections viewer``).

For each model size (``--viewer-sizes``: its layers and heads from
``configs/model/<size>.yaml``) and each logdir shape (``--viewer-logs``, ``<steps>x<probes>``)
a synthetic logdir is written into a temporary folder: one run, ``probe_<k>`` tags, a
record per probe per step, as the trainer writes them (:func:`tinymt.viewer.document.
build_document`, :func:`tinymt.viewer.summary.probe_summary`, TensorBoard's own
``EventFileWriter``, steps 50, 100, ... as ``trainer.probe_every=50`` logs them). The
sentences have :data:`SOURCE_TOKENS` source pieces and about as many target pieces; the
weights are seeded random softmax rows (logits ``N(0, SIGMA²)``, about as peaked as a
trained model's: 1.5 nats a row), causal in the decoder's self-attention.

Then ``tensorboard --logdir <it>`` is started as a user starts it (its default
``--load_fast``: the Rust data server where installed), waited for until ``/runs`` lists every
probe and ``/steps`` every step, and measured: latency (median, p90) of ``/runs``,
``/steps``, ``/step`` (random probes and steps, each asked once -- *cold* -- then the same
again) and ``/trend`` where the plugin has that route; the bytes of the answers (JSON as
sent with gzip, and inflated); the bytes a frame takes in the event file; the resident and
peak memory (``VmRSS`` / ``VmHWM``, summed over TensorBoard and its data server) idle after
the load and after the requests. Every ``/step`` answer is checked against the document
written for that probe and step.

:func:`bench_viewer` is the section of the results; :func:`measure_logdir` one row;
:func:`synthetic_document` the document of one probe at one step (what the test compares
the served weights with).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tinymt.bench.machine import machine_info
from tinymt.bench.measure import log
from tinymt.bench.serve_load import percentile
from tinymt.bench.serve_speed import HOST, free_port
from tinymt.bench.workload import model_config
from tinymt.errors import TinyMTError
from tinymt.viewer.document import Probe, build_document
from tinymt.viewer.metadata import PLUGIN_NAME
from tinymt.viewer.summary import probe_summary

SOURCE_TOKENS = 40  # source pieces of every probe sentence (+ </s>)
TARGET_TOKENS = (36, 44)  # target pieces of a probe: drawn in this range, fixed per probe
SIGMA = 3.0  # logits N(0, SIGMA²) -> softmax rows of ~1.5 nats (a trained tiny run: 0.5-1.8)
STEP_EVERY = 50  # steps 50, 100, ...: trainer.probe_every's default
SEED = 0
RUN = "run"  # the one run of the synthetic logdir
ROUTE = f"/data/plugin/{PLUGIN_NAME}"
READY_TIMEOUT_S = 600.0  # start + load of the largest logdir
FRAMING = 16  # bytes of a TFRecord around an event: length (8), its CRC (4), data CRC (4)
MIB = 2**20
# source pieces: CJK characters (a zh->en run's; JSON escapes them \uXXXX), target: words
_HAN, _WORDS = 0x4E00, ("the", "a", "of", "to", "in", "and", "ticket", "Beijing", "asked",
                        "me", "book", "for", "flight", "was", "he", "she", "it", "on")


@dataclass(frozen=True)
class Shape:
    """The attention a model of one size logs: layers of each stack, heads a layer."""

    size: str
    encoder_layers: int
    decoder_layers: int
    heads: int

    @classmethod
    def of(cls, size: str) -> Shape:
        cfg = model_config(size)
        return cls(size, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.n_heads)


def parse_logs(value: str) -> list[tuple[int, int]]:
    """``"10x1,100x10"`` -> ``[(10, 1), (100, 10)]`` (steps, probes); ``ValueError``."""
    out = []
    for part in (p.strip() for p in value.split(",")):
        match = re.fullmatch(r"(\d+)\s*[x×]\s*(\d+)", part)
        if not match or not all(0 < int(g) <= 100_000 for g in match.groups()):
            raise ValueError(f"{part!r} is not <steps>x<probes>, both positive")
        out.append((int(match[1]), int(match[2])))
    return out


def steps_of(n: int) -> list[int]:
    return [STEP_EVERY * (i + 1) for i in range(n)]


# --------------------------------------------------------------------------- the logdir
def _probe_text(probe: int, seed: int) -> tuple[list[str], list[str]]:
    """The source and target pieces of probe ``probe`` (the same at every step)."""
    rng = np.random.default_rng([seed, probe])
    src = [("▁" if i % 3 == 0 else "") + chr(_HAN + int(c))
           for i, c in enumerate(rng.integers(0, 3000, SOURCE_TOKENS))]
    n_tgt = int(rng.integers(TARGET_TOKENS[0], TARGET_TOKENS[1] + 1))
    tgt = ["▁" + _WORDS[int(w)] for w in rng.integers(0, len(_WORDS), n_tgt - 1)] + ["."]
    return src, tgt


def softmax_rows(rng: np.random.Generator, shape: tuple[int, ...], causal: bool) -> np.ndarray:
    logits = rng.standard_normal(shape) * SIGMA
    if causal:  # a query sees itself and what precedes it
        t_q, t_k = shape[-2:]
        logits = np.where(np.tril(np.ones((t_q, t_k), bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def synthetic_document(shape: Shape, probe: int, step: int, seed: int = SEED) -> dict:
    """The view document of ``probe`` at ``step`` (:func:`build_document`, weights as
    uint8): seeded by ``(seed, probe, step)``, so the same call gives the same weights."""
    src, tgt = _probe_text(probe, seed)
    s, t = len(src) + 1, len(tgt) + 1  # + </s>; <s> + target
    rng = np.random.default_rng([seed, probe, step])
    h = shape.heads
    attn = {"encoder_self": [softmax_rows(rng, (h, s, s), False)
                             for _ in range(shape.encoder_layers)],
            "decoder_self": [softmax_rows(rng, (h, t, t), True)
                             for _ in range(shape.decoder_layers)],
            "cross": [softmax_rows(rng, (h, t, s), False) for _ in range(shape.decoder_layers)]}
    reference = " ".join(p.lstrip("▁") for p in tgt)
    sentence = "".join(p.lstrip("▁") for p in src)
    return build_document(attn, src, tgt, Probe(sentence, reference), reference, step,
                          forced_reference=True)


def write_logdir(folder: Path, shape: Shape, steps: int, probes: int, seed: int = SEED) -> dict:
    """``folder/run/events.out.tfevents.*``: every probe at every step, step by step, as the
    trainer logs them (a ``probe_summary`` per probe, through TensorBoard's own
    ``EventFileWriter``). Returns what the records take: per frame, the record (the packed
    document) and the event with its TFRecord framing; the event file."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    run = folder / RUN
    run.mkdir(parents=True)
    writer = EventFileWriter(str(run))
    record_bytes, event_bytes, weights = [], [], 0
    t0 = time.perf_counter()
    for step in steps_of(steps):
        for p in range(probes):
            doc = synthetic_document(shape, p, step, seed)
            summary = probe_summary(f"probe_{p}", doc, doc["sentence"], doc["reference"])
            event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
            writer.add_event(event)
            record_bytes.append(len(summary.value[0].tensor.string_val[0]))
            event_bytes.append(event.ByteSize() + FRAMING)
            weights += sum(v["weights"].size for v in doc["kinds"].values())
    writer.close()
    files = list(run.glob("events.out.tfevents.*"))
    return {"frames": len(record_bytes), "weights_per_frame": weights / len(record_bytes),
            "record_bytes_per_frame": float(np.mean(record_bytes)),
            "event_bytes_per_frame": float(np.mean(event_bytes)),
            "event_file_bytes": sum(f.stat().st_size for f in files),
            "write_seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------- the server
def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (TensorBoard and its data server)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return [pid, *(p for c in children for p in process_tree(c))]


def memory_mib(pids: list[int]) -> dict[str, float] | None:
    """``{"rss", "hwm"}``: VmRSS and VmHWM summed over ``pids``, MiB (None: unreadable)."""
    total = {"rss": 0, "hwm": 0}
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        for key, field in (("rss", "VmRSS"), ("hwm", "VmHWM")):
            match = re.search(rf"{field}:\s+(\d+) kB", status)
            if not match:
                return None
            total[key] += int(match[1])
    return {k: v / 1024 for k, v in total.items()}


def reset_peaks(pids: list[int]) -> bool:
    """Start a new VmHWM at the present VmRSS (``clear_refs`` 5); False where refused."""
    try:
        for pid in pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def http_get(url: str, gzip_ok: bool = True, timeout: float = 120
             ) -> tuple[int, bytes, int, float]:
    """``(status, body inflated, bytes received, seconds)`` of one GET on a new connection,
    asking for gzip as a browser does; seconds from sending to the last byte."""
    headers = {"Accept-Encoding": "gzip"} if gzip_ok else {}
    request = urllib.request.Request(url, headers=headers)
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            status, body, encoding = r.status, r.read(), r.headers.get("Content-Encoding")
    except urllib.error.HTTPError as e:
        status, body, encoding = e.code, e.read(), e.headers.get("Content-Encoding")
    seconds = time.perf_counter() - t0
    sent = len(body)
    return status, gzip.decompress(body) if encoding == "gzip" else body, sent, seconds


@contextlib.contextmanager
def tensorboard(logdir: Path, ready: Callable[[str], bool], *flags: str
                ) -> Iterator[tuple[str, subprocess.Popen, float]]:
    """``tensorboard --logdir <logdir>`` as a user starts it (its defaults, then ``flags``;
    the Attention tab found through its entry point) on a loopback port; yields ``(base
    URL, process, seconds from start to ready)`` once ``ready(base)`` (the tests start
    their TensorBoards here too)."""
    port = free_port()
    tb = Path(sys.executable).with_name("tensorboard")
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(tb), "--logdir", str(logdir), "--host", HOST,
                                 "--port", str(port), *flags], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err)
        base = f"http://{HOST}:{port}"
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while True:
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    if ready(base):
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    tail = err.read()[-1500:].decode(errors="replace").strip()
                    raise TinyMTError(f"tensorboard --logdir {logdir} did not serve every step "
                                      f"within {READY_TIMEOUT_S:g} s: {tail.replace(chr(10), ' | ')}")
                time.sleep(0.1)
            yield base, proc, time.perf_counter() - t0
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _loaded(steps: int, probes: int) -> Callable[[str], bool]:
    """Ready: ``/runs`` lists every probe and ``/steps`` every step of each."""
    tags, want = [f"probe_{p}" for p in range(probes)], steps_of(steps)

    def ready(base: str) -> bool:
        status, body, _, _ = http_get(f"{base}{ROUTE}/runs", timeout=10)
        runs = {r["run"]: r["probes"] for r in json.loads(body)["runs"]} if status == 200 else {}
        if [p["tag"] for p in runs.get(RUN, [])] != tags:
            return False
        for tag in tags:
            status, body, _, _ = http_get(f"{base}{ROUTE}/steps?run={RUN}&tag={tag}", timeout=30)
            if status != 200 or json.loads(body)["steps"] != want:
                return False
        return True
    return ready


# --------------------------------------------------------------------------- measuring
def _summary(seconds: list[float], received: list[int], inflated: list[int]) -> dict:
    ms = [s * 1000 for s in seconds]
    return {"requests": len(ms), "p50_ms": percentile(ms, 0.5), "p90_ms": percentile(ms, 0.9),
            "max_ms": max(ms), "gzip_bytes": int(np.median(received)),
            "json_bytes": int(np.median(inflated))}


def _timed(urls: list[str]) -> tuple[dict, list[bytes]]:
    """Every URL once, in order: the latency and size summary, and the answers."""
    seconds, received, bodies = [], [], []
    for url in urls:
        status, body, sent, s = http_get(url)
        if status != 200:
            raise TinyMTError(f"{url}: HTTP {status}: {body[:200]!r}")
        seconds.append(s)
        received.append(sent)
        bodies.append(body)
    return _summary(seconds, received, [len(b) for b in bodies]), bodies


def weights_sha256(doc: dict) -> dict[str, str]:
    """``{kind: sha256 of its weights as uint8 bytes}`` of a document (JSON lists or arrays)."""
    return {kind: hashlib.sha256(np.asarray(view["weights"], np.uint8).tobytes()).hexdigest()
            for kind, view in doc["kinds"].items()}


def _equal(answer: dict, written: dict) -> bool:
    """The served document is the written one: text, axes and every weight."""
    if set(answer["kinds"]) != set(written["kinds"]):
        return False
    same = all(answer[k] == written[k] for k in ("sentence", "reference", "step", "scale"))
    for kind, view in written["kinds"].items():
        got = answer["kinds"][kind]
        same &= got["rows"] == view["rows"] and got["cols"] == view["cols"]
        served = np.asarray(got["weights"])
        same &= served.shape == view["weights"].shape and bool((served == view["weights"]).all())
    return same


def measure_logdir(shape: Shape, steps: int, probes: int, requests: int,
                   load_fast: str | None = None, seed: int = SEED) -> dict:
    """One row: a logdir of ``steps`` x ``probes`` frames of ``shape``, written, loaded by
    TensorBoard and measured (see the module docstring)."""
    rng = np.random.default_rng([seed, steps, probes])
    with tempfile.TemporaryDirectory(prefix="tinymt-bench-viewer-") as tmp:
        logdir = Path(tmp)
        row = {"size": shape.size, "encoder_layers": shape.encoder_layers,
               "decoder_layers": shape.decoder_layers, "heads": shape.heads,
               "steps": steps, "probes": probes,
               **write_logdir(logdir, shape, steps, probes, seed)}
        flags = [f"--load_fast={load_fast}"] if load_fast else []
        with tensorboard(logdir, _loaded(steps, probes), *flags) as (base, proc, ready_s):
            row["ready_seconds"] = ready_s
            time.sleep(1.0)  # idle: the load done, no request
            pids = process_tree(proc.pid)
            row["processes"] = len(pids)
            loaded = memory_mib(pids)
            peaks_reset = reset_peaks(pids)
            url = f"{base}{ROUTE}"
            tags = [f"probe_{p}" for p in range(probes)]
            lat = {}
            lat["runs"], _ = _timed([f"{url}/runs"] * requests)
            lat["steps"], _ = _timed([f"{url}/steps?run={RUN}&tag={tags[i % probes]}"
                                      for i in range(requests)])
            # random (probe, step) pairs, each once; as many as there are when fewer
            pairs = [(p, s) for p in range(probes) for s in steps_of(steps)]
            picked = [pairs[i] for i in rng.permutation(len(pairs))[:requests]]
            step_urls = [f"{url}/step?run={RUN}&tag=probe_{p}&step={s}" for p, s in picked]
            lat["step_cold"], bodies = _timed(step_urls)
            lat["step_again"], _ = _timed(step_urls)
            checked = [_equal(json.loads(b), synthetic_document(shape, p, s, seed))
                       for b, (p, s) in zip(bodies, picked)]
            row["step_answers_checked"], row["step_answers_equal"] = len(checked), sum(checked)
            p, s = picked[0]
            row["sample"] = {"probe": p, "step": s,
                             "weights_sha256": weights_sha256(json.loads(bodies[0]))}
            trend, row["trend_skipped"] = _trend(url, tags, requests)
            lat.update(trend)
            after = memory_mib(pids)
            row["latency"] = lat
            row["memory_mib"] = None if loaded is None or after is None else {
                "idle_after_load_rss": loaded["rss"], "load_peak": loaded["hwm"],
                "after_requests_rss": after["rss"],
                "requests_peak": after["hwm"] if peaks_reset else None}
            if proc.poll() is not None:
                raise TinyMTError("tensorboard exited during the viewer benchmark")
    return row


def _trend(url: str, tags: list[str], requests: int) -> tuple[dict, str | None]:
    """``/trend`` where the plugin has that route: ``{"trend_cold": each probe's first
    request (its records decoded), "trend_again": ``requests`` more, probe after probe}``;
    else nothing, and why. The route is there when a request without ``tag=`` is refused
    by it (400), not by TensorBoard (404: no such route)."""
    status, body, _, _ = http_get(f"{url}/trend?run={RUN}")
    if status != 400:
        first = body.decode(errors="replace").strip().splitlines()[:1]
        return {}, f"HTTP {status}" + (f": {first[0][:120]}" if first else "")
    urls = [f"{url}/trend?run={RUN}&tag={tag}" for tag in tags]
    return {"trend_cold": _timed(urls)[0],
            "trend_again": _timed([urls[i % len(urls)] for i in range(requests)])[0]}, None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def bench_viewer(args: argparse.Namespace, argv: list[str]) -> dict:
    """The viewer section of a device's results: settings, a row per size and logdir, and
    which command measured it (``machine``)."""
    t_start = time.monotonic()
    shapes = [Shape.of(size) for size in args.viewer_size_list]
    load_fast = None if args.viewer_load_fast == "default" else args.viewer_load_fast
    rows = []
    for shape in shapes:
        for steps, probes in args.viewer_log_list:
            log(f"[viewer] {shape.size}: {steps} steps x {probes} probes ...")
            row = measure_logdir(shape, steps, probes, args.viewer_requests, load_fast)
            lat, mem = row["latency"], row["memory_mib"] or {}
            log(f"[viewer] {shape.size} {steps}x{probes}: ready {row['ready_seconds']:.1f} s, "
                + ", ".join(f"{k} p50 {v['p50_ms']:.1f} ms" for k, v in lat.items() if v)
                + f", {row['record_bytes_per_frame'] / 1e3:.1f} KB a frame, "
                f"RSS {mem.get('after_requests_rss', float('nan')):.0f} MiB, "
                f"{row['step_answers_equal']}/{row['step_answers_checked']} answers equal")
            rows.append(row)
    return {
        "machine": machine_info(torch.device("cpu"), argv),
        "settings": {"sizes": args.viewer_size_list,
                     "logs": [f"{s}x{p}" for s, p in args.viewer_log_list],
                     "requests": args.viewer_requests, "source_tokens": SOURCE_TOKENS,
                     "target_tokens": list(TARGET_TOKENS), "sigma": SIGMA,
                     "step_every": STEP_EVERY, "seed": SEED,
                     "load_fast": args.viewer_load_fast,
                     "tensorboard": _version("tensorboard"),
                     "data_server": _version("tensorboard-data-server")},
        "rows": rows,
        "wall_seconds": round(time.monotonic() - t_start, 1),
    }
