"""``### Memory and time against corpus size`` of ``docs/benchmarks.md`` (the results of
:mod:`tinymt.bench.scale`), and the targets it is held to (the issue "memory must not grow
with the corpus")."""

from __future__ import annotations

from collections.abc import Callable

from tinymt.bench.text import code, fmt, mark, plural

MIB = 2**20
# at TARGET_PAIRS pairs (and more); the growth targets hold from the smallest size measured
# to the largest; preparation time may grow at most PREPARE_TIME_SLACK x the pairs
TARGET_PAIRS = 3_000_000
PREPARE_PEAK_MIB = 2048  # 2 GB (GiB)
TRAIN_PEAK_MIB = 1536  # 1.5 GB (GiB)
PEAK_GROWTH = 1.5
PREPARE_TIME_SLACK = 1.1  # "11x the time for 10x the data"
SCALE_COMMAND = ("python scripts/benchmark.py --device cpu --sections scale --merge "
                 "docs/benchmarks.json --json docs/benchmarks.json --out docs/benchmarks.md")
BEFORE = ("Before the streaming pipeline (the issue's figures, Multi30k repeated with a "
          "marker): `prepare_data.py` on 0.29 M pairs 28 s and 1.3 GB peak, on 2.9 M pairs "
          "221 s and 9.1 GB (cache 775 MB); training start-up on those caches 1.2 GB and "
          "4.7 GB.")
PHASE_ORDER = ("normalise", "sentencepiece", "tokenize", "load_cache", "model",
               "lengths", "sampler", "first_batch", "steps", "other")


def _growth(rows: list[dict], get) -> float | None:
    first, last = get(rows[0]), get(rows[-1])
    return last / first if first else None


def _columns() -> list[tuple[str, Callable[[dict], float], int]]:
    """``(heading, value of a row, digits)`` of the table's numeric columns."""
    return [
        ("prepare s", lambda r: r["prepare"]["seconds"], 0),
        ("prepare peak RSS MiB", lambda r: r["prepare"]["peak_rss_mib"], 0),
        ("prepare peak anon MiB", lambda r: r["prepare"]["peak_anon_mib"], 0),
        ("cache MB", lambda r: r["prepare"]["cache_bytes"] / 1e6, 0),
        ("start-up peak RSS MiB", lambda r: r["train"]["peak_rss_mib"], 0),
        ("start-up peak anon MiB", lambda r: r["train"]["peak_anon_mib"], 0),
        ("before step 1 RSS MiB", lambda r: r["train"]["before_steps_rss_mib"], 0),
        ("before step 1 anon MiB", lambda r: r["train"]["before_steps_anon_mib"], 0),
        ("s to first step", lambda r: r["train"]["seconds_to_first_step"], 1),
        ("batch set-up s", lambda r: r["train"]["batch_setup_seconds"], 2),
        ("tokens/s", lambda r: r["train"]["tokens_per_s"], 0),
    ]


def scale_targets(devices: dict) -> list[dict]:
    """The issue's targets on every device with a scale section: peak RSS of
    ``prepare_data.py`` and of the training start-up at 3 M pairs, their growth and the
    preparation time's from the smallest size to the largest."""
    out = []
    for dev, res in devices.items():
        scale = (res or {}).get("scale")
        if not scale or len(scale["rows"]) < 1:
            continue
        rows = scale["rows"]
        small, big = rows[0], rows[-1]
        at = f"{dev.upper()}, {big['pairs']:,} pairs"
        for name, limit, value in (
                ("prepare_data.py peak RSS ≤ 2 GB at 3 M pairs", PREPARE_PEAK_MIB,
                 big["prepare"]["peak_rss_mib"]),
                ("training start-up peak RSS ≤ 1.5 GB at 3 M pairs", TRAIN_PEAK_MIB,
                 big["train"]["peak_rss_mib"])):
            enough = big["pairs"] >= TARGET_PAIRS
            out.append({"target": name, "where": at if enough else f"{dev.upper()} (largest "
                        f"{big['pairs']:,} pairs)", "measured": f"{fmt(value)} MiB",
                        "met": value <= limit if enough else None})
        if len(rows) < 2:
            continue
        span = f"{dev.upper()}, {small['pairs']:,} → {big['pairs']:,}"
        data = big["pairs"] / small["pairs"]
        for name, get, limit in (
                (f"prepare_data.py peak RSS ≤ {PEAK_GROWTH:g}× the smaller corpus's",
                 lambda r: r["prepare"]["peak_rss_mib"], PEAK_GROWTH),
                (f"training start-up peak RSS ≤ {PEAK_GROWTH:g}× the smaller corpus's",
                 lambda r: r["train"]["peak_rss_mib"], PEAK_GROWTH),
                (f"prepare_data.py time ≤ {PREPARE_TIME_SLACK:g}× the data's growth "
                 f"(≤ {PREPARE_TIME_SLACK * data:.1f}× for {data:.1f}× the pairs)",
                 lambda r: r["prepare"]["seconds"], PREPARE_TIME_SLACK * data)):
            g = _growth(rows, get)
            out.append({"target": name, "where": span,
                        "measured": "n/a" if g is None else f"{g:.2f}×",
                        "met": None if g is None else g <= limit})
    return out


def _phase_text(phases: dict) -> str:
    """``normalise 12 s (RSS 300 / anon 200 MiB), ...``: the splits of a step together."""
    merged: dict[str, dict] = {}
    for name, e in phases.items():
        m = merged.setdefault(name.split(":")[0], {"seconds": 0.0, "peak_rss_mib": 0.0,
                                                   "peak_anon_mib": 0.0})
        m["seconds"] += e["seconds"]
        m["peak_rss_mib"] = max(m["peak_rss_mib"], e["peak_rss_mib"])
        m["peak_anon_mib"] = max(m["peak_anon_mib"], e["peak_anon_mib"])
    order = [n for n in PHASE_ORDER if n in merged] + sorted(set(merged) - set(PHASE_ORDER))
    parts = []
    for name in order:
        m = merged[name]
        mem = (f"RSS {fmt(m['peak_rss_mib'])} / anon {fmt(m['peak_anon_mib'])} MiB"
               if m["peak_rss_mib"] else "not sampled")
        secs = "" if name == "other" else f" {m['seconds']:.2f} s"
        parts.append(f"{name}{secs} ({mem})")
    return ", ".join(parts)


def _epoch_hours(row: dict) -> float | None:
    """Hours one epoch of the row's train split would take at its measured tokens/s."""
    st = row["prepare"]["stats"]
    try:
        tokens = st["pairs"]["train"] * (st["tokens"]["train"]["tgt"]["mean"] + 1)
    except (KeyError, TypeError):
        return None
    return tokens / row["train"]["tokens_per_s"] / 3600


def render_scale(scale: dict, where: str) -> list[str]:
    """``### Memory and time against corpus size``: the table, growth, targets, phases."""
    st, m, rows = scale["settings"], scale["machine"], scale["rows"]
    L = ["### Memory and time against corpus size", "",
         (f"On {where}, measured by `{m['command']}` ({m['date']}, git {code(m)}). Corpora: "
          f"the Multi30k train split (`{st['source']}`, {st['base_pairs']:,} pairs) repeated, "
          "copy *k* ≥ 1 of every pair with the word `r<k>` appended to both sides (every "
          "repeat a sentence of its own), cut at the size, as text files in a temporary "
          "folder; valid and test Multi30k's own. Each size in fresh processes: "
          "`scripts/prepare_data.py data=text_files data.src_lang=de data.tgt_lang=en "
          f"data.vocab_size={st['vocab_size']}` into an empty cache, then `scripts/train.py` "
          f"with the same data keys and `model={st['model']}` on that cache (a cache hit), "
          f"stopped when its {plural(st['steps'], 'optimizer step')} are done, before any "
          "validation. *Peak RSS*: the process's high-water mark (`ru_maxrss` of `wait4`); "
          "*peak anon*: the largest `RssAnon` (memory the process holds itself, without the "
          "file-backed, reclaimable pages of the memory-mapped Arrow files that RSS also "
          f"counts) sampled every {st['poll_seconds'] * 1000:g} ms over the process and its "
          "children; *start-up* peaks include the training steps (their activations and "
          "AdamW state), *before step 1* is the largest sample before the first step. "
          "*Cache MB*: the bytes of the cache entry. *s to first step*: from "
          "starting the process to the first training step (Python, torch and the cache "
          "loaded, model built, first batch ready); *batch set-up*: the length arrays, "
          "`TokenBatchSampler` and the first batch. *tokens/s*: target tokens (`</s>` "
          f"included) of steps {st['warmup_steps'] + 1}–{st['steps']} over their wall time, "
          "data included: one epoch's throughput (a whole epoch is hours on this CPU: see "
          "below). Wall times on a shared machine: other jobs may have used its cores."), "",
         "| pairs | " + " | ".join(h for h, _, _ in _columns()) + " | prepare peak in |",
         "| ---: | " + " | ".join("---:" for _ in _columns()) + " | --- |"]
    for r in rows:
        L.append(f"| {r['pairs']:,} | " + " | ".join(fmt(get(r), d) for _, get, d in _columns())
                 + f" | {r['prepare']['peak_rss_phase'] or '—'} |")
    if len(rows) > 1:
        cells = [_growth(rows, get) for _, get, _ in _columns()]
        L.append(f"| growth {rows[-1]['pairs'] / rows[0]['pairs']:.1f}× | "
                 + " | ".join("—" if g is None else f"{g:.2f}×" for g in cells) + " | |")
    L += ["", BEFORE, ""]
    targets = scale_targets({"cpu": {"scale": scale}})
    L += ["| target | where | measured | met |", "| --- | --- | ---: | --- |"]
    L += [f"| {t['target']} | {t['where'].removeprefix('CPU, ')} | {t['measured']} | "
          f"{mark(t['met'])} |" for t in targets]
    L += ["", "Where the time and memory go (seconds of each step, the largest RSS / anon "
          "sampled in it; *other*: outside the marked steps: imports, optimizer set-up, the "
          "gaps between training steps, the summary):", ""]
    for r in rows:
        p, t = r["prepare"], r["train"]
        hours = _epoch_hours(r)
        epoch = "" if hours is None else (f"; an epoch ({r['prepare']['stats']['pairs']['train']:,} "
                                          f"pairs) would take ≈ {hours:.1f} h at this rate")
        L += [f"- {r['pairs']:,} pairs, `prepare_data.py` (peak RSS in "
              f"{p['peak_rss_phase']}, peak anon in {p['peak_anon_phase']}): "
              f"{_phase_text(p['phases'])}.",
              f"- {r['pairs']:,} pairs, `train.py` (peak RSS in {t['peak_rss_phase']}, "
              f"peak anon in {t['peak_anon_phase']}): {_phase_text(t['phases'])}{epoch}."]
    L.append("")
    return L
