"""``scripts/benchmark.py``: its arguments, and the run from data to report.

Measures, in one process:

* training throughput (target tokens/s) of our ``Transformer`` and the ``nn.Transformer``
  peer (``tinymt.bench.peer``) on the same token-budget batches of the Multi30k train split,
  runs alternating ours, peer, ours, peer, ...; median of the repeats; the ratio;
  on CUDA with bf16 autocast and model FLOPs utilisation;
* decoding throughput (sentences/s) on the Multi30k test sentences, greedy and beam 5:
  ours with the KV cache, ours recomputing the prefix, the peer recomputing the prefix;
  with a trained run (``--run``) also its CTranslate2 export, float32 and int8, and the
  BLEU of every method;
* peak memory of each measurement;
* with ``--sections serve`` and ``--run``, ``scripts/serve.py`` under load
  (``tinymt.bench.serve_speed``): sentences/s and p50/p99 latency at 1, 8 and 64
  concurrent clients, micro-batching against one request at a time, both engines, beside
  one ``translate.py`` process per request;
* with ``--sections viewer``, the Attention tab's server (``tinymt.bench.viewer_speed``):
  TensorBoard on a synthetic logdir of 100 steps x 10 probes (and 10 x 1), the latency of
  its routes, the bytes of a frame and of an answer, TensorBoard's memory;
* with ``--sections scale``, memory and time against the corpus's size
  (``tinymt.bench.scale``): ``prepare_data.py`` and the training start-up on Multi30k
  repeated to ``--scale-pairs`` pairs, each in a process of its own;

and writes a markdown report and the raw numbers as JSON: by default into a folder of their
own, ``outputs/benchmarks/<date>/<time>/`` under the current directory; into the project's
``docs/`` only when ``--out`` / ``--json`` name it, and only from a clean working tree, so
that a published report names the commit it measured. ``--sections`` picks what is
measured; a section left out is taken from ``--merge`` (the same device's earlier JSON),
so that one section can be measured again without the others.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tinymt.bench.decode_speed import bench_decoding
from tinymt.bench.machine import REPO_ROOT, machine_info, uncommitted_changes
from tinymt.bench.measure import log
from tinymt.bench.memory import MemoryMeter
from tinymt.bench.report import mark, render_markdown
from tinymt.bench.scale import DEFAULT_PAIRS, DEFAULT_STEPS, DEFAULT_VOCAB, bench_scale, parse_pairs
from tinymt.bench.scale_report import scale_targets
from tinymt.bench.serve_speed import bench_serve
from tinymt.bench.targets import CPU_SIZES, CUDA_SIZES, evaluate_targets
from tinymt.bench.training import bench_training
from tinymt.bench.viewer_speed import bench_viewer, parse_logs
from tinymt.bench.workload import DEFAULT_DATA, load_data, model_config
from tinymt.cli import one_line_errors
from tinymt.errors import TinyMTError
from tinymt.files import check_outputs, name_problem, parse_json, read_bytes, write_text
from tinymt.rules import CHECKPOINT, PATH, RUN, creatable_folder
from tinymt.rundir import clock_run_dir

PATH_ARGS = ("out", "json", "merge", "run", "data_path", "scale_dir")  # relative to the caller's cwd
SECTIONS = ("training", "decoding", "serve", "viewer", "scale")
DEFAULT_SECTIONS = "training,decoding"
OUTPUTS = "outputs/benchmarks"  # default: <cwd>/outputs/benchmarks/<date>/<time>/
REPORT, RESULTS = "benchmarks.md", "benchmarks.json"
DOCS = REPO_ROOT / "docs"  # the published report: written from a clean working tree only
# The defaults that depend on the device (and --quick), written once: parse_args's help
# texts and resolve_defaults both read them.
VIEWER = {"viewer_sizes": "tiny,small", "viewer_logs": "10x1,100x10", "viewer_requests": 20}
DEFAULTS = {
    "cpu": {"sizes": ",".join(CPU_SIZES), "steps": 20, "warmup": 3, "repeats": 3,
            "sentences": 1000, "max_tokens": 4096, **VIEWER},
    "cuda": {"sizes": ",".join(CUDA_SIZES), "steps": 50, "warmup": 10, "repeats": 3,
             "sentences": 1000, "max_tokens": 16384, **VIEWER},
    "quick": {"sizes": "tiny", "steps": 3, "warmup": 1, "repeats": 1, "sentences": 50,
              "viewer_sizes": "tiny", "viewer_logs": "3x2", "viewer_requests": 5},
}


EPILOG = (
    f"Defaults per device: CPU sizes {DEFAULTS['cpu']['sizes']}, fp32, --max-tokens "
    f"{DEFAULTS['cpu']['max_tokens']}, --steps {DEFAULTS['cpu']['steps']}; CUDA sizes "
    f"{DEFAULTS['cuda']['sizes']}, bf16 autocast, --max-tokens "
    f"{DEFAULTS['cuda']['max_tokens']}, --steps {DEFAULTS['cuda']['steps']}. "
    "Without --run, decoding uses randomly initialised models forced to a fixed output "
    "length (--decode-len) so every method does the same work."
)


def _default_help(key: str) -> str:
    cpu, cuda = DEFAULTS["cpu"][key], DEFAULTS["cuda"][key]
    return f"default {cpu}" if cpu == cuda else f"default {cpu} CPU, {cuda} CUDA"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    _check_values(p, args)
    return args


def build_parser() -> argparse.ArgumentParser:
    """The command line of scripts/benchmark.py."""
    p = argparse.ArgumentParser(
        prog="scripts/benchmark.py",
        description=(
            "Training and decoding throughput of tinymt's Transformer against the same model "
            "built from torch.nn.Transformer (tinymt.bench.peer), plus peak memory. Writes a "
            "markdown report and optionally JSON."
        ),
        epilog=EPILOG,
    )
    p.add_argument("--quick", action="store_true",
                   help="smoke run (< 2 min on a CPU): sizes {sizes}, {warmup}+{steps} steps, "
                        "{repeats} repeat, {sentences} sentences; numbers are not "
                        "meaningful".format(**DEFAULTS["quick"]))
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto = cuda when available, else cpu")
    p.add_argument("--sizes", default=None,
                   help="comma-separated model sizes (configs/model/<size>.yaml); "
                        + _default_help("sizes"))
    p.add_argument("--steps", type=int, default=None,
                   help=f"timed training steps per run ({_default_help('steps')})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"untimed training steps before each run ({_default_help('warmup')})")
    p.add_argument("--repeats", type=int, default=None,
                   help="training runs per model, alternating ours/peer; the median is "
                        f"reported ({_default_help('repeats')})")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="token budget per training batch, padding included "
                        f"({_default_help('max_tokens')})")
    p.add_argument("--sentences", type=int, default=None,
                   help=f"test sentences to decode ({_default_help('sentences')}: all of "
                        "Multi30k test)")
    p.add_argument("--decode-repeats", type=int, default=1,
                   help="passes over the test sentences per decoding method; the median is "
                        "reported (default 1)")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="source tokens per decoding batch, sentences batched by length "
                        "(default 4096)")
    p.add_argument("--decode-len", type=int, default=None,
                   help="random models only: every sentence decodes exactly this many tokens "
                        "(default: mean test reference length, rounded)")
    p.add_argument("--run", default=None,
                   help="a trained run dir: decode with its model and tokenizer instead of "
                        "random models (stops at EOS; the peer gets the same weights); adds "
                        "BLEU and, with the ct2 extra, CTranslate2 float32 and int8 rows")
    p.add_argument("--checkpoint", default="best",
                   help="with --run: best | last | avg | path (default best)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile both models for training (decoding stays eager)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default 0 = torch's default)")
    p.add_argument("--data-path", default=None,
                   help="Multi30k in the hub layout (default ../shared/data/"
                        f"{DEFAULT_DATA} beside the repo, or $TINYMT_SHARED_DATA/{DEFAULT_DATA});"
                        " absent: the built-in zh-en corpus, noted in the report")
    p.add_argument("--cache-dir", default="outputs/.cache",
                   help="prepared-data cache, relative to the repo root (default "
                        "outputs/.cache)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="GPU bf16 dense peak for MFU when the GPU is not in the built-in table")
    p.add_argument("--out", default=None,
                   help=f"markdown report to write (default {OUTPUTS}/<date>/<time>/{REPORT}, "
                        f"with {RESULTS} beside it); the project's docs/ only from a clean "
                        "working tree")
    p.add_argument("--json", default=None,
                   help="the raw results (default: beside the default report; none when --out "
                        "is given without --json)")
    p.add_argument("--merge", default=None,
                   help="JSON of an earlier run: its other devices (e.g. the CPU run), and "
                        "of this device the sections not in --sections, are included in "
                        "this report")
    _serve_options(p)
    _viewer_options(p)
    _scale_options(p)
    return p


def _serve_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sections", default=DEFAULT_SECTIONS,
                   help=f"comma-separated, of {', '.join(SECTIONS)} (default "
                        f"{DEFAULT_SECTIONS}); serve needs --run. A section left out is "
                        "taken from --merge when it holds this device")
    p.add_argument("--serve-clients", default="1,8,64",
                   help="serve: concurrent clients of each load level (default 1,8,64)")
    p.add_argument("--serve-requests", type=int, default=None,
                   help="serve: timed requests per load level, one sentence each (at "
                        "least one per client; default max(40, 4 × clients))")
    p.add_argument("--serve-process-requests", type=int, default=None,
                   help="serve: translate.py processes per level of the one-process-per-"
                        "request baseline, run at levels of at most 8 clients (at least one "
                        "per client; default max(6, 2 × clients); 0 = no baseline)")


def _viewer_options(p: argparse.ArgumentParser) -> None:
    q = DEFAULTS["quick"]
    p.add_argument("--viewer-sizes", default=None,
                   help="viewer: model sizes whose attention the synthetic records hold "
                        f"(layers, heads of configs/model/<size>.yaml; default "
                        f"{VIEWER['viewer_sizes']}, --quick {q['viewer_sizes']})")
    p.add_argument("--viewer-logs", default=None,
                   help="viewer: logdirs to measure, <steps>x<probes> comma-separated (default "
                        f"{VIEWER['viewer_logs']}, --quick {q['viewer_logs']})")
    p.add_argument("--viewer-requests", type=int, default=None,
                   help="viewer: timed requests per route and logdir (default "
                        f"{VIEWER['viewer_requests']}, --quick {q['viewer_requests']})")
    p.add_argument("--viewer-load-fast", choices=("default", "true", "false"),
                   default="default",
                   help="viewer: TensorBoard's --load_fast (default: not given, TensorBoard's "
                        "default: the Rust data server where installed)")


def _scale_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale-pairs", default=DEFAULT_PAIRS,
                   help="scale: corpus sizes in pairs, comma-separated: Multi30k's train split "
                        f"repeated (default {DEFAULT_PAIRS})")
    p.add_argument("--scale-steps", type=int, default=DEFAULT_STEPS,
                   help="scale: training steps per size, the first 5 not timed (default "
                        f"{DEFAULT_STEPS})")
    p.add_argument("--scale-vocab", type=int, default=DEFAULT_VOCAB,
                   help=f"scale: data.vocab_size (default {DEFAULT_VOCAB})")
    p.add_argument("--scale-dir", default=None,
                   help="scale: where the corpora and caches are written, in a temporary "
                        "folder removed after (default: the system's temporary folder)")


def _check_values(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Counts positive; ``--sections`` -> ``args.section_set``, ``--serve-clients`` ->
    ``args.serve_client_list``."""
    for name in ("steps", "warmup", "repeats", "max_tokens", "sentences", "decode_len",
                 "serve_requests", "serve_process_requests", "batch_tokens", "decode_repeats",
                 "viewer_requests", "scale_vocab"):
        value = getattr(args, name)
        if value is not None and value < (0 if name in ("warmup", "serve_process_requests")
                                          else 1):
            p.error(f"--{name.replace('_', '-')} must be positive")

    def split(value: str) -> list[str]:
        return [v.strip() for v in value.split(",") if v.strip()]

    sections = split(args.sections)
    if not sections or set(sections) - set(SECTIONS):
        p.error(f"--sections {args.sections}: comma-separated, of {', '.join(SECTIONS)}")
    args.section_set = set(sections)
    clients = split(args.serve_clients)
    if not clients or not all(c.isdigit() and int(c) > 0 for c in clients):
        p.error(f"--serve-clients {args.serve_clients}: positive whole numbers, "
                "comma-separated")
    args.serve_client_list = sorted({int(c) for c in clients})
    if args.viewer_logs is not None:
        try:
            parse_logs(args.viewer_logs)
        except ValueError as e:
            p.error(f"--viewer-logs {args.viewer_logs}: {e}")
    try:
        args.scale_pair_list = parse_pairs(args.scale_pairs)
    except ValueError as e:
        p.error(f"--scale-pairs {args.scale_pairs}: {e}")
    if args.scale_steps < 2:
        p.error("--scale-steps must be at least 2")


def resolve_defaults(args: argparse.Namespace, device_type: str) -> None:
    defaults = {**DEFAULTS["cuda" if device_type == "cuda" else "cpu"],
                **(DEFAULTS["quick"] if args.quick else {})}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.size_list = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.viewer_size_list = [s.strip() for s in args.viewer_sizes.split(",") if s.strip()]
    args.viewer_log_list = parse_logs(args.viewer_logs)


def json_name(path: str | None) -> str | None:
    """How the report names the JSON: relative to the repo root when inside it."""
    if not path:
        return None
    rel = os.path.relpath(path, REPO_ROOT)
    return path if rel.startswith("..") else rel


def benchmark_device(args: argparse.Namespace) -> torch.device:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise TinyMTError("--device cuda: torch sees no CUDA GPU (use --device cpu)")
    device = torch.device("cuda" if args.device == "cuda" or
                          (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    return device


def check_docs_output(paths: Sequence[str | None]) -> None:
    """Refuse to write into the project's ``docs/`` from a working tree that differs from
    its commit: the published report names one commit, the code it measured."""
    into_docs = [p for p in paths if p and Path(p).resolve().is_relative_to(DOCS.resolve())]
    changed = uncommitted_changes() if into_docs else []
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise TinyMTError(
            f"{os.path.relpath(into_docs[0], REPO_ROOT)}: the working tree has uncommitted changes "
            f"({', '.join(changed[:3])}{more}); a report in docs/ names the commit it "
            f"measured: commit first, or leave out --out/--json to write under {OUTPUTS}/")


def read_merge(path: str | None) -> dict:
    """The ``devices`` of an earlier run's JSON (``--merge``), or nothing."""
    if not path:
        return {}
    doc = parse_json(read_bytes(path, "--merge", 64 << 20), f"--merge {path}")
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), dict):
        raise TinyMTError(f"--merge {path}: not a benchmark JSON (no \"devices\" object)")
    return doc["devices"]


def measure(args: argparse.Namespace, device: torch.device, argv: Sequence[str]) -> dict:
    """What this run measures of its device: machine, data, training, decoding (those of
    ``args.section_set``) and serve (which keeps its own machine: its command, date, git
    revision)."""
    t_start = time.monotonic()
    sections = args.section_set
    mine = {}
    if sections & {"training", "decoding"}:
        log(f"benchmark on {device.type}: sizes {','.join(args.size_list)}, "
            f"{torch.get_num_threads()} threads")
        data, data_info = load_data(args.data_path, args.cache_dir, args.quick)
        meter = MemoryMeter(device)
        mine.update(machine=machine_info(device, argv), data=data_info)
        if "training" in sections:
            mine["training"] = bench_training(args, device, data, data_info, meter)
        if "decoding" in sections:
            mine["decoding"] = bench_decoding(args, device, data, data_info, meter)
        mine["memory_method"] = meter.describe()
    if "serve" in sections:
        mine["serve"] = bench_serve(args, device, argv)
    if "viewer" in sections:
        mine["viewer"] = bench_viewer(args, argv)
    if "scale" in sections:
        scale = bench_scale(args, argv)  # None: skipped (no Multi30k), said why
        if scale is not None:
            mine["scale"] = scale
    mine["wall_seconds"] = round(time.monotonic() - t_start, 1)
    return mine


def combine(earlier: dict | None, mine: dict) -> dict:
    """This device's results: what this run measured, over what ``--merge`` holds of the
    same device (the sections this run left out)."""
    return {**(earlier or {}), **mine}


def write(results: dict, out: str, json_path: str | None, wall_seconds: float) -> None:
    log(f"report: {write_text(render_markdown(results), out)} ({wall_seconds:.0f}s)")
    if json_path:
        log(f"json: {write_text(json.dumps(results, indent=2) + chr(10), json_path)}")
    for t in results["targets"]:
        log(f"  {t['target']:<45} {t['where']:<22} {t['measured']:>12}  {mark(t['met'])}")


# the paths of the command line: how each is checked before any work
PATH_RULES = {"run": RUN, "checkpoint": CHECKPOINT, "data_path": PATH,
              "cache_dir": (lambda v: creatable_folder(v, write=True), "must be a folder"),
              "scale_dir": (lambda v: creatable_folder(v, write=True), "must be a folder")}


def check_paths(args: argparse.Namespace, cwd: Path) -> None:
    """Every path option checked, made absolute (relative to ``cwd``); the outputs may be
    written; ``--merge`` read (before the work: a bad one fails at once)."""
    for name in (*PATH_ARGS, *PATH_RULES):
        value = getattr(args, name)
        flag = f"--{name.replace('_', '-')}"
        why = None if value is None else name_problem(str(value))
        if why is None and name in PATH_RULES and value is not None:
            check, allowed = PATH_RULES[name]
            verdict = check(REPO_ROOT / value if name == "cache_dir" else value)
            why = None if verdict is True else f"{allowed} ({verdict})"
        if why:
            raise TinyMTError(f"{flag} {value}: {why}")
        if value and name in PATH_ARGS and not (name == "run" and value == "latest"):
            setattr(args, name, os.path.abspath(cwd / value))  # a link named is replaced
    check_outputs(("--out", args.out), ("--json", args.json))
    check_docs_output([args.out, args.json])
    args.merged = read_merge(args.merge)


@one_line_errors
def run(args: argparse.Namespace, argv: Sequence[str], cwd: Path) -> int:
    check_paths(args, cwd)
    os.chdir(REPO_ROOT)  # data/cache paths as the configs spell them
    device = benchmark_device(args)
    resolve_defaults(args, device.type)
    if "serve" in args.section_set and not args.run:
        raise TinyMTError("--sections serve needs --run <a trained run dir>: the server "
                          "serves a trained model")
    if args.section_set & {"training", "decoding"}:
        for size in args.size_list:
            model_config(size)  # fail early on a bad --sizes
    if "viewer" in args.section_set:
        for size in args.viewer_size_list:
            try:
                model_config(size)
            except TinyMTError as e:
                raise TinyMTError(str(e).replace("--sizes", "--viewer-sizes", 1)) from None
    merged = args.merged
    mine = measure(args, device, argv)
    devices = {dev: merged.get(dev) for dev in ("cpu", "cuda")}
    devices[device.type] = combine(devices[device.type], mine)
    results = {
        "schema": 1,
        "meta": {"quick": bool(args.quick), "json": json_name(args.json),
                 "cuda_available": torch.cuda.is_available(),
                 "memory_method": {dev: res["memory_method"] for dev, res in devices.items()
                                   if res and "memory_method" in res},
                 "device": device.type},
        "devices": devices,
        "targets": evaluate_targets(devices) + scale_targets(devices),
    }
    write(results, args.out, args.json, mine["wall_seconds"])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), benchmark, write the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    cwd = Path.cwd()
    if args.out is None:  # a folder of its own, never the project's docs/
        folder = cwd / clock_run_dir(OUTPUTS)
        args.out = str(folder / REPORT)
        args.json = args.json or str(folder / RESULTS)
    return run(args, argv, cwd)
