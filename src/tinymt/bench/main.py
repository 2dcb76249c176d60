"""``scripts/benchmark.py``: its arguments, and the run from the data to the report."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from tinymt import runtime
from tinymt.bench.decode_speed import bench_decoding
from tinymt.bench.measure import REPO_ROOT, log
from tinymt.bench.report import into_page, render
from tinymt.bench.serve_speed import bench_serve
from tinymt.bench.train_speed import bench_training
from tinymt.bench.workload import load_data
from tinymt.cli import one_line_errors
from tinymt.config import CHECKPOINT, FOLDER, PATH, RUN
from tinymt.errors import TinyMTError, first_line
from tinymt.files import check_outputs, load_json, name_problem, write_text
from tinymt.rundir import clock_run_dir

SECTIONS = ("training", "decoding", "serve")
SIZES = sorted(p.stem for p in (REPO_ROOT / "configs" / "model").glob("*.yaml"))
OUTPUTS = "outputs/benchmarks"  # without --out: <cwd>/outputs/benchmarks/<date>/<time>/
DEFAULTS = {  # what --sizes, --steps, ... default to, by device; --quick over them
    "cpu": {"sizes": ["tiny", "small"], "steps": 20, "warmup": 3, "repeats": 3,
            "sentences": 1000, "max_tokens": [4096]},
    "cuda": {"sizes": ["tiny", "small", "base"], "steps": 50, "warmup": 10, "repeats": 3,
             "sentences": 1000, "max_tokens": [16384]},
    "quick": {"sizes": ["tiny"], "steps": 3, "warmup": 1, "repeats": 1, "sentences": 50},
}
# the paths of the command line (made absolute from the caller's folder) and their checks
PATHS = {"out": None, "json": None, "merge": PATH, "run": RUN, "checkpoint": CHECKPOINT,
         "data_path": PATH, "cache_dir": FOLDER}
EXAMPLES = """examples (docs/benchmarks.md has more, what each figure means, and the targets):
  python scripts/benchmark.py --quick          # a smoke run: its numbers mean nothing
  python scripts/benchmark.py --run outputs/<date>/<time>     # decode a trained model
Without --out the report and its JSON go to outputs/benchmarks/<date>/<time>/; a report
names the commit it measured (and whether the working tree had uncommitted changes)."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, as every script's errors
        raise TinyMTError(message)

    def _print_message(self, message: str, file=None):  # argparse ignores a failed write:
        if message:  # --help to a full disk is then one error line, as in every script
            print(message, end="", file=file or sys.stderr, flush=True)


def count(least: int = 1):
    def parse(text: str) -> int:
        if not text.strip().isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"{text!r}: a whole number, at least {least}")
        return int(text)
    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command line of scripts/benchmark.py."""
    def default(key: str) -> str:
        cpu, cuda, quick = (", ".join(map(str, v)) if isinstance(v, list) else v
                            for v in (DEFAULTS[d].get(key) for d in ("cpu", "cuda", "quick")))
        return (f"default {cpu} on a CPU, {cuda} on CUDA"
                + (f", {quick} with --quick" if quick else ""))

    p = Parser(prog="scripts/benchmark.py", epilog=EXAMPLES,
               formatter_class=argparse.RawDescriptionHelpFormatter, description=(
                   "tinymt's Transformer against the same model on torch.nn.Transformer (same\n"
                   "weights): training throughput, with the plain step beside ours; decoding,\n"
                   "the KV cache against the peer's recompute loop (+ BLEU with --run);\n"
                   "scripts/serve.py (torch; CTranslate2 with the ct2 extra) under concurrent\n"
                   "clients. Writes Markdown and JSON."))
    add = p.add_argument
    add("--quick", action="store_true", help="a smoke run of the benchmark itself")
    add("--device", choices=("auto", "cpu", "cuda"), default="auto",
        help="auto: cuda when available (bf16 autocast), else cpu (fp32)")
    add("--sections", nargs="+", choices=SECTIONS, default=["training", "decoding"],
        help="default training decoding (serve needs --run); a section left out is kept "
        "from --merge")
    add("--sizes", nargs="+", choices=SIZES, help=f"configs/model/<size>.yaml ({default('sizes')})")
    add("--steps", type=count(), help=f"timed training steps per run ({default('steps')})")
    add("--warmup", type=count(0), help=f"untimed steps before each run ({default('warmup')})")
    add("--repeats", type=count(), help=f"training rounds, median ({default('repeats')})")
    add("--max-tokens", nargs="+", type=count(), help="tokens per training batch: one for "
        f"every size, or one a size ({default('max_tokens')})")
    add("--sentences", type=count(), help=f"test sentences to decode ({default('sentences')})")
    add("--decode-repeats", type=count(), default=1, help="passes per decoding method, median")
    add("--run", help="a trained run: decode its model (+ BLEU) instead of random ones; "
        "serve needs it")
    add("--checkpoint", default="best", help="of --run: best | last | avg | a path")
    add("--data-path", help="Multi30k, hub layout (default ../shared/data/multi30k-hub-layout; "
        "absent: the built-in zh-en corpus)")
    add("--cache-dir", default="outputs/.cache", help="prepared-data cache (from the repo root)")
    add("--serve-clients", nargs="+", type=count(), default=[1, 8, 64],
        help="serve: concurrent clients of each level (default 1 8 64)")
    add("--serve-requests", type=count(), help="serve: timed requests per level (default "
        "max(40, 4 × clients))")
    add("--hostile-seconds", type=count(0), default=30, help="serve: then the hostile load "
        "for this long (docs/reliability.md; default 30, 0: none)")
    add("--out", help="the report (default outputs/benchmarks/<date>/<time>/benchmarks.md); a "
        "page with the report's markers keeps its text around them")
    add("--json", help="the results (default: beside the default report)")
    add("--merge", help="an earlier run's JSON: its other devices and sections are kept")
    return p


def check_paths(args: argparse.Namespace, cwd: Path) -> None:
    """Every path option named well, made absolute from ``cwd``; the outputs writable."""
    for name, rule in PATHS.items():
        value = getattr(args, name)
        why = value is not None and (name_problem(str(value)) or rule and rule(
            REPO_ROOT / value if name == "cache_dir" else value))
        if why:
            raise TinyMTError(f"--{name.replace('_', '-')} {value}: {why}")
        if value and name not in ("checkpoint", "cache_dir") and value != "latest":
            setattr(args, name, os.path.abspath(cwd / value))
    check_outputs(("--out", args.out), ("--json", args.json))


def merged_devices(path: str) -> dict:
    """``--merge``'s devices, rendered as the report will before anything is measured: a
    file edited into another shape is one line naming it."""
    devices = load_json(path, "--merge", 64 << 20).get("devices")
    try:
        devices = {dev: {**((devices or {}).get(dev) or {})} for dev in ("cpu", "cuda")}
        render({"devices": devices})
    except Exception as e:  # noqa: BLE001  (another kind, a missing key, ...)
        raise TinyMTError(f"--merge {path}: devices is not what benchmark.py writes "
                          f"({type(e).__name__}: {first_line(e)})") from None
    return devices


def measure(args: argparse.Namespace, device: torch.device, argv: list[str]) -> dict:
    out = {}  # the sections this run measures on device
    if {"training", "decoding"} & set(args.sections):
        log(f"benchmark on {device.type}, {torch.get_num_threads()} threads")
        data, info = load_data(args.data_path, args.cache_dir, args.quick)
        if "training" in args.sections:
            out["training"] = bench_training(args, device, data, info, argv)
        if "decoding" in args.sections:
            out["decoding"] = bench_decoding(args, device, data, info, argv)
    if "serve" in args.sections:
        out["serve"] = bench_serve(args, device, argv)
    return out


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line), benchmark, write the report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, cwd, t0 = build_parser().parse_args(argv), Path.cwd(), time.monotonic()
    if args.out is None:  # a folder of its own, never the project's docs/
        folder = cwd / clock_run_dir(OUTPUTS)
        args.out = str(folder / "benchmarks.md")
        args.json = args.json or str(folder / "benchmarks.json")
    check_paths(args, cwd)
    devices = merged_devices(args.merge) if args.merge else {"cpu": {}, "cuda": {}}
    os.chdir(REPO_ROOT)  # data and cache paths as the configs spell them
    if args.device == "cuda" and not torch.cuda.is_available():
        raise TinyMTError("--device cuda: torch sees no CUDA GPU (use --device cpu)")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = runtime.pick_device("cuda" if cuda else "cpu")
    if cuda:
        torch.set_float32_matmul_precision("high")
    defaults = {**DEFAULTS[device.type], **(DEFAULTS["quick"] if args.quick else {})}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if len(args.max_tokens) not in (1, len(args.sizes)):
        raise TinyMTError("--max-tokens: give one budget, or one for each of the --sizes")
    if "serve" in args.sections and not args.run:
        raise TinyMTError("--sections serve needs --run <a trained run dir>: the server "
                          "serves a trained model")
    devices[device.type].update(measure(args, device, argv))
    results = {"schema": 2, "devices": devices}
    page = Path(args.out).read_text() if Path(args.out).is_file() else None  # our own page
    log(f"report: {write_text(into_page(page, render(results)), args.out)} "
        f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        log(f"json: {write_text(json.dumps(results, indent=2) + chr(10), args.json)}")
    return 0
