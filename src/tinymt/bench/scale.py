"""Memory and time against the size of the corpus (``--sections scale``).

For each size of ``--scale-pairs`` a corpus is written into a temporary folder (outside the
repository): the Multi30k train split (``../shared/data/multi30k``, 29,000 pairs) repeated,
copy ``k >= 1`` of every pair with the word ``r<k>`` appended to both sides (so that every
repeat is a sentence of its own), cut at the size, as ``train.de`` / ``train.en``; the valid
and test splits are Multi30k's own. Then, each in a fresh process:

1. ``scripts/prepare_data.py data=text_files ...`` into an empty cache: wall seconds, the
   peak memory of the process tree, the cache's bytes on disk;
2. ``scripts/train.py data=text_files ... model=tiny`` on that cache, stopped when its
   ``--scale-steps``-th optimizer step is done (before any validation): peak memory,
   seconds from the start of the process to the first training step, the seconds of the
   batch set-up (the length arrays, ``TokenBatchSampler``, the first batch) and the target
   tokens/s of the steps after the first :data:`WARMUP_STEPS`.

Both scripts run unchanged under :data:`tinymt.bench.scale_process.DRIVER`, which only
marks (on stderr, with the system-wide monotonic clock) when the steps of a build or of the
set-up begin and end. Memory: ``VmRSS`` and ``RssAnon`` of the process and its descendants,
summed, every ``POLL_S`` seconds, and the exact high-water mark (``ru_maxrss`` of
``wait4``, the largest of ``VmHWM``). RSS counts the memory-mapped cache's pages, which are file-backed
and reclaimable; ``RssAnon`` is what the process itself holds. Each sample is put in the
step marked at its time, so the report can say where the peak is.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from tinymt.bench.machine import REPO_ROOT, machine_info
from tinymt.bench.measure import log
from tinymt.bench.scale_process import POLL_S, Run, check, peaks, run_measured
from tinymt.errors import TinyMTError

MULTI30K = "multi30k"  # under the shared data folder
LANGS = ("de", "en")
SPLIT_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # ours: theirs
DEFAULT_PAIRS = "300000,3000000"
DEFAULT_STEPS = 40
WARMUP_STEPS = 5  # training steps not counted in tokens/s
DEFAULT_VOCAB = 8000


def shared_multi30k() -> Path:
    """``$TINYMT_SHARED_DATA/multi30k`` or ``../shared/data/multi30k`` beside the repo."""
    env = os.environ.get("TINYMT_SHARED_DATA")
    return (Path(env) if env else REPO_ROOT.parent / "shared" / "data") / MULTI30K


def missing_data(folder: Path) -> str | None:
    """Why the section cannot run on ``folder``, or None."""
    for split, name in SPLIT_FILES.items():
        for lang in LANGS:
            path = folder / f"{name}.{lang}.gz"
            if not path.is_file():
                return (f"{path} not found (the {split} split of Multi30k: put the reference "
                        "corpora at ../shared/data beside the repository or set "
                        "TINYMT_SHARED_DATA)")
    return None


def parse_pairs(value: str) -> list[int]:
    """``"300000,3000000"`` -> ``[300000, 3000000]``: distinct, ascending; ``ValueError``."""
    out = set()
    for part in (p.strip().replace("_", "") for p in value.split(",") if p.strip()):
        if not part.isdigit() or not 100 <= int(part) <= 100_000_000:
            raise ValueError(f"{part!r} is not a pair count from 100 to 100,000,000")
        out.add(int(part))
    if not out:
        raise ValueError("no pair count")
    return sorted(out)


# --------------------------------------------------------------------------- the corpus
def _lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def write_corpus(source: Path, folder: Path, pairs: int) -> dict:
    """``folder/{train,valid,test}.{de,en}`` (see the module docstring); returns the pairs
    of each split and the bytes of the train files."""
    folder.mkdir(parents=True)
    written = {"train": pairs}
    for lang in LANGS:
        base = _lines(source / f"{SPLIT_FILES['train']}.{lang}.gz")
        with open(folder / f"train.{lang}", "w", encoding="utf-8", newline="\n") as out:
            for start in range(0, pairs, len(base)):
                k = start // len(base)
                block = base[:pairs - start]
                out.write("".join(f"{line} r{k}\n" if k else f"{line}\n" for line in block))
        for split in ("valid", "test"):
            lines = _lines(source / f"{SPLIT_FILES[split]}.{lang}.gz")
            (folder / f"{split}.{lang}").write_text("".join(f"{x}\n" for x in lines),
                                                    encoding="utf-8")
            written[split] = len(lines)
    train_bytes = sum((folder / f"train.{lang}").stat().st_size for lang in LANGS)
    return {"pairs": written, "train_bytes": train_bytes}


def folder_bytes(folder: Path) -> tuple[int, int]:
    """``(apparent bytes, bytes on disk)`` of every file under ``folder``."""
    size = disk = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            size += st.st_size
            disk += st.st_blocks * 512
    return size, disk



# --------------------------------------------------------------------------- one size
def data_overrides(corpus: Path, cache: Path, vocab: int) -> list[str]:
    return ["data=text_files", f"data.path={corpus}", "data.src_lang=de", "data.tgt_lang=en",
            f"data.vocab_size={vocab}", f"data.cache_dir={cache}"]


def measure_prepare(corpus: Path, cache: Path, vocab: int) -> dict:
    """``scripts/prepare_data.py`` into the empty ``cache``: seconds, memory, the cache."""
    run = run_measured("prepare", "scripts/prepare_data.py",
                       data_overrides(corpus, cache, vocab), REPO_ROOT)
    check(run, "scripts/prepare_data.py")
    entries = [p for p in cache.iterdir() if p.is_dir()]
    if len(entries) != 1:
        raise TinyMTError(f"{cache}: {len(entries)} cache entries after prepare_data.py")
    stats = json.loads((entries[0] / "stats.json").read_text())
    size, disk = folder_bytes(entries[0])
    return {"seconds": run.seconds, "build_seconds": stats.get("seconds"),
            **peaks(run), "cache_bytes": size, "cache_disk_bytes": disk,
            "cache_entry": entries[0].name,
            "stats": {k: stats[k] for k in ("pairs", "dropped", "tokens") if k in stats}}


def _step_numbers(run: Run, warmup: int) -> dict:
    """Seconds to the first step, tokens/s of the steps after ``warmup`` (start of step
    ``warmup + 1``'s wait for data, i.e. the end of step ``warmup``, to the last step's end)."""
    begins = [t for t, w in run.marks if w[0] == "step_begin"]
    ends = {int(w[1]): t for t, w in run.marks if w[0] == "step_end"}
    tokens = [int(w[1]) for _, w in run.marks if w[0] == "tokens"]
    last = max(ends) if ends else 0
    if not begins or last <= warmup or len(tokens) < last:
        raise TinyMTError(f"scripts/train.py: {last} steps done, more than {warmup} needed: "
                           f"{run.tail()}")
    timed = sum(tokens[warmup:last])
    seconds = ends[last] - ends[warmup]
    return {"seconds_to_first_step": begins[0] - run.t0,
            "seconds_to_first_step_done": ends[min(ends)] - run.t0,
            "steps": last, "timed_steps": last - warmup, "timed_target_tokens": timed,
            "timed_seconds": seconds, "tokens_per_s": timed / seconds}


def measure_training(corpus: Path, cache: Path, vocab: int, steps: int, run_dir: Path
                     ) -> dict:
    """``scripts/train.py ... model=tiny`` on the prepared ``cache`` (a cache hit), stopped
    after ``steps`` optimizer steps."""
    overrides = [*data_overrides(corpus, cache, vocab), "model=tiny", "trainer.device=cpu",
                 f"trainer.max_steps={steps}", "trainer.valid_every=1000000",
                 "trainer.probe_every=0", f"run_dir={run_dir}"]
    run = run_measured("train", "scripts/train.py", overrides, REPO_ROOT)
    check(run, "scripts/train.py")
    out = {**peaks(run), **_step_numbers(run, min(WARMUP_STEPS, steps - 1))}
    first = run.t0 + out["seconds_to_first_step"]  # the set-up alone: sampled before step 1
    before = [s for s in run.samples if s[0] < first] or [(0.0, 0, 0)]
    out["before_steps_rss_mib"] = max(s[1] for s in before) / 1024
    out["before_steps_anon_mib"] = max(s[2] for s in before) / 1024
    ph = out["phases"]
    out["batch_setup_seconds"] = sum(ph.get(k, {}).get("seconds", 0.0)
                                     for k in ("lengths", "sampler", "first_batch"))
    out["cache_load_seconds"] = ph.get("load_cache", {}).get("seconds")
    out["cache_hit"] = any(line.startswith("data: cache hit") for line in run.lines)
    return out


def measure_size(source: Path, base: Path, pairs: int, vocab: int, steps: int) -> dict:
    """One row: the corpus of ``pairs`` pairs written, prepared, trained on; its folder
    removed after."""
    folder = base / f"pairs-{pairs}"
    try:
        t0 = time.monotonic()
        corpus = write_corpus(source, folder / "corpus", pairs)
        log(f"[scale] {pairs:,} pairs: corpus written ({corpus['train_bytes'] / 1e6:.0f} MB, "
            f"{time.monotonic() - t0:.0f} s); prepare_data.py ...")
        cache = folder / "cache"
        cache.mkdir()
        prep = measure_prepare(folder / "corpus", cache, vocab)
        log(f"[scale] {pairs:,}: prepared in {prep['seconds']:.0f} s, peak RSS "
            f"{prep['peak_rss_mib']:.0f} MiB (in {prep['peak_rss_phase']}), anon "
            f"{prep['peak_anon_mib']:.0f} MiB, cache {prep['cache_bytes'] / 1e6:.0f} MB; "
            "train.py ...")
        train = measure_training(folder / "corpus", cache, vocab, steps, folder / "run")
        log(f"[scale] {pairs:,}: training start-up peak RSS {train['peak_rss_mib']:.0f} MiB, "
            f"anon {train['peak_anon_mib']:.0f} MiB, first step at "
            f"{train['seconds_to_first_step']:.1f} s, batch set-up "
            f"{train['batch_setup_seconds']:.2f} s, {train['tokens_per_s']:,.0f} tok/s")
        return {"pairs": pairs, "written": corpus["pairs"], "train_bytes": corpus["train_bytes"],
                "prepare": prep, "train": train}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_scale(args: argparse.Namespace, argv: list[str]) -> dict | None:
    """The scale section of a device's results, or None (logged) when Multi30k is not
    there."""
    source = shared_multi30k()
    why = missing_data(source)
    if why:
        log(f"[scale] skipped: {why}")
        return None
    t_start = time.monotonic()
    base = Path(args.scale_dir) if args.scale_dir else None
    if base:
        base.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tinymt-bench-scale-", dir=base) as tmp:
        for pairs in args.scale_pair_list:
            rows.append(measure_size(source, Path(tmp), pairs, args.scale_vocab,
                                     args.scale_steps))
    return {
        "machine": machine_info(torch.device("cpu"), argv),
        "settings": {"pairs": args.scale_pair_list, "base_pairs": len(_lines(
                         source / f"{SPLIT_FILES['train']}.de.gz")),
                     "vocab_size": args.scale_vocab, "model": "tiny",
                     "steps": args.scale_steps, "warmup_steps": min(WARMUP_STEPS,
                                                                    args.scale_steps - 1),
                     "poll_seconds": POLL_S, "source": os.path.relpath(source, REPO_ROOT)},
        "rows": rows,
        "wall_seconds": round(time.monotonic() - t_start, 1),
    }
