"""A sweep's runs side by side: test BLEU and what their heads track.

``scripts/analyze_heads.py run=<sweep dir>`` (a ``scripts/train.py -m ...`` folder: runs
in sub-folders) analyses every run, then :func:`sweep_report` puts them in one table,
``<sweep>/heads_sweep.md``: per run the settings that differ between the runs, the test
BLEU and steps of its training (``metrics.json``), and per attention kind how many
relations have a head beating the baseline; then per relation and direction the best
head's accuracy in every run beside the baseline (best fixed offset) of each.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tinymt.heads.relation_report import row_label
from tinymt.heads.relations import RELATION_KINDS
from tinymt.loaders import load_config_file, load_json_file
from tinymt.rundir import CONFIG, holds_run

SWEEP_REPORT = "heads_sweep.md"
_IGNORED = ("run_dir", "resume")  # settings that differ between any two runs


def sweep_runs(folder: Path) -> list[Path]:
    """The run folders directly under a sweep folder (empty when ``folder`` is a run)."""
    if holds_run(folder):
        return []
    return sorted((p for p in folder.iterdir() if p.is_dir() and holds_run(p)),
                  key=lambda p: p.name)


def _flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def run_labels(runs: list[Path]) -> list[str]:
    """Each run named by the training settings that differ between the runs."""
    flats = [_flat(load_config_file(r / CONFIG, "the run's config")) for r in runs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if not k.endswith(_IGNORED)
              and len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1]
    return [", ".join(f"{k}={f.get(k)}" for k in differ) or r.name
            for r, f in zip(runs, flats)]


def sweep_report(runs: list[Path], results: list[dict]) -> str:
    """The markdown of ``heads_sweep.md`` for analysed ``runs`` (``results``: what
    :func:`tinymt.heads.analyze` returned for each)."""
    labels = run_labels(runs)
    metrics = [load_json_file(r / "metrics.json", "the run's metrics")
               if os.path.lexists(r / "metrics.json") else {} for r in runs]
    kinds = list(RELATION_KINDS)
    L = ["# Heads across a sweep", "",
         "| run | test BLEU | steps | train s | "
         + " | ".join(f"relations tracked, {k}" for k in kinds) + " |",
         "| --- | --- | --- | --- |" + " --- |" * len(kinds)]
    for label, m, r in zip(labels, metrics, results):
        rel = r.get("relations") or {}
        cells = [f"{len(rel[k]['tracked'])} of {len({x['relation'] for x in rel[k]['rows']})}"
                 + (f" ({', '.join(rel[k]['tracked'])})" if rel[k]["tracked"] else "")
                 if k in rel else "n/a" for k in kinds]
        L.append(f"| {label} | {_num(m.get('test_bleu'))} | {m.get('steps', '?')} | "
                 f"{_num(m.get('train_seconds'), '.0f')} | " + " | ".join(cells) + " |")
    for kind in kinds:
        L += ["", f"**{kind}**: the best head's accuracy per relation (baseline: the best "
              "fixed offset; bold: the head tracks it)", "",
              "| relation | " + " | ".join(labels) + " |",
              "| --- |" + " --- |" * len(labels)]
        rows: dict[str, dict[int, dict]] = {}
        for i, r in enumerate(results):
            for row in (r.get("relations") or {}).get(kind, {}).get("rows", []):
                rows.setdefault(row_label(row), {})[i] = row
        for name, by_run in rows.items():
            cells = []
            for i in range(len(results)):
                row = by_run.get(i)
                if row is None:
                    cells.append("—")
                    continue
                acc = f"{row['best_accuracy']:.2f}"
                cells.append(f"{'**' + acc + '**' if row['tracks'] else acc} "
                             f"({row['baseline']:.2f})")
            L.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(L) + "\n"


def _num(x, fmt: str = ".2f") -> str:
    return format(x, fmt) if type(x) in (int, float) else "?"
