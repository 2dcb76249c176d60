"""The analysis's outputs: figures (PNG), the markdown report ``heads.md``, the relation
numbers ``heads.json`` and a sweep's ``heads_sweep.md``."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from tinymt import KINDS
from tinymt.bench.report import table
from tinymt.corpus.relations import RELATION_DOCS
from tinymt.files import write_text
from tinymt.heads.pruning import BLEU_DROP
from tinymt.labels import BROAD_ENTROPY, POSITIONAL_MASS
from tinymt.plotting import heatmap, save_figure
from tinymt.relations import MARGIN, MIN_INSTANCES, RELATION_KINDS, row_label

REPORT = "heads.md"  # <run>/heads.md, with its figures in <run>/heads/
FIGURES = "heads"
JSON_REPORT = "heads.json"  # <run>/heads.json: the relation numbers, machine-readable
SWEEP_REPORT = "heads_sweep.md"  # <sweep>/heads_sweep.md: its runs side by side


# ----------------------------------------------------------------------------- figures
def write_figures(r: dict, fig_dir: Path) -> dict[str, Path]:
    """Every figure of result ``r`` saved under ``fig_dir``: ``{tag: png path}``."""
    figures = {}  # tag -> matplotlib figure
    for kind in KINDS:
        for name, values, title in (
                ("importance", r["importance"][kind], "importance (normalised per layer)"),
                ("entropy", r["stats"][kind]["entropy"], "attention entropy (nats)"),
                ("distance", r["stats"][kind]["distance"], "distance from the diagonal")):
            figures[f"{name}/{kind}"] = _heatmap(values, f"{title}: {kind}")
    if r["pruning"]:
        figures["pruning"] = _pruning_figure(r["pruning"]["curves"], r["pruning"]["base"])
    figures["entropy_vs_distance"] = _scatter_figure(r["stats"])
    if r["alignment"] is not None:
        figures["aer"] = _heatmap(r["alignment"]["aer"],
                                  "alignment error rate (lower = better): cross")
    summary = r.get("relations")
    for kind in RELATION_KINDS if summary else ():
        figures[f"relations/{kind}"] = _relation_heatmap(summary, kind)
    paths = {tag: fig_dir / f"{'aer_cross' if tag == 'aer' else tag.replace('/', '_')}.png"
             for tag in figures}
    for tag, fig in figures.items():
        save_figure(fig, paths[tag])
    return paths


def _heatmap(values: np.ndarray, title: str):
    """:func:`tinymt.plotting.heatmap` with its colour scale starting at 0 (so the cell
    text, dark on light cells, stays readable whatever the smallest value is)."""
    fig = heatmap(np.nan_to_num(values, nan=0.0), title)
    top = float(np.nanmax(values)) if np.isfinite(values).any() else 0.0
    fig.axes[0].images[0].set_clim(0.0, top if top > 0 else 1.0)
    return fig


def _pruning_figure(curves: dict, base: float):
    fig, ax = plt.subplots(figsize=(6, 4))
    for curve, pts in curves.items():
        x = [100.0 * n / total if total else 0.0 for n, total, _ in pts]
        ax.plot(x, [b for _, _, b in pts], marker="o", markersize=3,
                label=curve, linewidth=2.2 if curve == "all" else 1.2)
    ax.axhline(base - BLEU_DROP, color="grey", linestyle=":", linewidth=1,
               label=f"unpruned − {BLEU_DROP:g} BLEU")
    return _finish(fig, ax, "% of heads masked (least important first)", "BLEU (greedy)",
                   "Pruning heads without retraining")


def _scatter_figure(means: dict):
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for kind, marker in zip(KINDS, "osD"):
        m = means[kind]
        ax.scatter(m["distance"].ravel(), m["entropy"].ravel(), marker=marker, label=kind,
                   alpha=0.8)
        for (layer, h), x in np.ndenumerate(m["distance"]):
            ax.annotate(f"{layer}.{h}", (x, m["entropy"][layer, h]), fontsize=6,
                        xytext=(2, 2), textcoords="offset points")
    return _finish(fig, ax, "distance from the diagonal (fraction of the sentence)",
                   "entropy (nats)", "Heads: positional (left, low) vs content / broad")


def _finish(fig, ax, xlabel: str, ylabel: str, title: str):
    """Axis labels, title, grid and legend of a line or scatter figure."""
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _relation_heatmap(summary: dict, kind: str):
    """Accuracy of every head (columns ``layer.head``) on every relation and direction
    (rows), with the best fixed offset's accuracy as the last column."""
    rows = summary[kind]["rows"]
    n_layers, n_heads = summary[kind]["shape"]
    heads = [f"{layer}.{h}" for layer in range(n_layers) for h in range(n_heads)]
    values = np.array([[*row["accuracy"].ravel(), row["baseline"]] for row in rows]) \
        if rows else np.zeros((1, len(heads) + 1))
    fig = heatmap(values, f"relation accuracy per head: {kind} (last column: best fixed "
                  "offset)", row_label="relation (→ dependent finds head, ← head finds "
                  "dependent)", col_label="layer.head", row_ticks=[row_label(r) for r in rows]
                  or ["(no relations)"], col_ticks=[*heads, "offset"])
    fig.axes[0].images[0].set_clim(0.0, 1.0)
    return fig


# ----------------------------------------------------------------------------- markdown
def _grid_table(values: np.ndarray) -> list[str]:
    """A markdown table of a ``(layers, heads)`` array, three decimals."""
    return table(["layer", *(f"head {h}" for h in range(values.shape[1]))],
                 ([layer, *(f"{v:.3f}" for v in row)] for layer, row in enumerate(values)))


def tracked(v: dict, bold: str = "") -> str:
    """``n of m (relation, ...)``: the relations of one kind with a head beating the
    baseline, of those seen."""
    names = v["tracked"]
    return (f"{bold}{len(names)} of {len({row['relation'] for row in v['rows']})}{bold}"
            + (f" ({', '.join(names)})" if names else ""))


# long: the report's sections in order, each a few tables and figures
def markdown_report(r: dict, run_dir: Path) -> str:
    """``heads.md``: the result ``r`` of :func:`tinymt.heads.analyze` in tables, with its
    figures (paths relative to ``run_dir``)."""
    def img(tag: str, alt: str) -> str:
        return f"![{alt}]({Path(r['figures'][tag]).relative_to(run_dir).as_posix()})"

    L = ["# What does each head do?", "",
         f"Run `{run_dir}`, checkpoint `{Path(r['checkpoint']).name}`, "
         f"{r['sentences']} sentences of the {r['split']} split"
         + (f" ({r['truncated']} truncated to the model's length)" if r["truncated"] else "")
         + f". {r['n_heads']} heads: "
         + ", ".join(f"{k} {a}×{b}" for k, (a, b) in r["shapes"].items())
         + " (layers × heads).", "",
         "## 1. Importance", "",
         ("Expected |∂ loss / ∂ gate| of each head (Michel et al., 2019), teacher-forced on "
          "the references, normalised per layer (L2). Low = the loss hardly notices the head."),
         ""]
    for kind in KINDS:
        L += [f"**{kind}**", "", *_grid_table(r["importance"][kind]),
              img(f"importance/{kind}", f"importance {kind}"), ""]
    pr = r["pruning"]
    L += ["## 2. Pruning without retraining", ""]
    if not pr:
        L += ["Pruning curves skipped (pruning=false).", ""]
    else:
        L += [("Heads masked least important first; greedy BLEU after each step. "
               f"Unpruned BLEU: **{pr['base']:.2f}**."), "",
              *table(["curve", "heads", "prunable (BLEU within 1 point)",
                      "BLEU at each step (heads masked: BLEU)"],
                     ([curve, pts[-1][1], f"**{pr['prunable'][curve]}** "
                       f"({100 * pr['prunable'][curve] / max(pts[-1][1], 1):.0f}%)",
                       ", ".join(f"{n}: {b:.1f}" for n, _, b in pts)]
                      for curve, pts in pr["curves"].items())),
              img("pruning", "BLEU vs heads masked"), ""]
    if r["pruned"]:
        p = r["pruned"]
        L += [f"Pruned checkpoint: `{p['path']}` — {p['n_masked']} of {r['n_heads']} heads "
              f"masked ({100 * p['n_masked'] / r['n_heads']:.0f}%; prune={p['fraction']:g}), "
              f"BLEU {p['bleu']:.2f}. Masked: "
              + (", ".join(f"{k} {layer}.{h}" for k, layer, h in p["heads"]) or "none")
              + ". Translate with it: `python scripts/translate.py run=" + str(run_dir)
              + f" checkpoint={p['path']}`.", ""]
    L += ["## 3. Cross-attention as word alignment", ""]
    a = r["alignment"]
    if a is None:
        L += [f"Skipped: {r['alignment_note']}.", ""]
    else:
        L += [("Alignment error rate (AER, lower is better) of each cross-attention head's "
               "alignment against the corpus's gold word alignments: for each target word, "
               "the source word whose pieces get the most of its attention (EOS = no link). "
               f"{a['gold_links']} gold links."), "", *_grid_table(a["aer"]),
              *table(["heads averaged", "AER"],
                     [*([f"layer {layer}", _num(v, ".3f")]
                        for layer, v in enumerate(a["layer_average_aer"])),
                      ["all cross heads", _num(a["average_aer"], ".3f")]]),
              (f"Best head: **layer {a['best_head'][0]}, head {a['best_head'][1]}**, AER "
               f"**{a['best_aer']:.3f}**. Floor for one link per target word (oracle): "
               f"{a['oracle_aer']:.3f}."), "", img("aer", "AER per cross head"), ""]
    return "\n".join(L + _stats_section(r, img) + _relation_section(r, img))


def _stats_section(r: dict, img) -> list[str]:
    rows = []
    for kind in KINDS:
        m = r["stats"][kind]
        for (layer, h), e in np.ndenumerate(m["entropy"]):
            rows.append([kind, layer, h, f"{e:.2f}", f"{m['distance'][layer, h]:.3f}",
                         f"{m['offset'][layer, h]:+.2f}" if "offset" in m else "—",
                         " / ".join(f"{m[n][layer, h]:.2f}" for n in ("prev", "same", "next"))
                         if "prev" in m else "—", r["labels"][kind][layer][h]])
    return ["## 4. Entropy and distance", "",
            ("Entropy (nats) of each head's attention rows, and its distance from the "
             "diagonal as a fraction of the sentence (0 = on the diagonal). Labels: previous / "
             f"self / next (self-attention) when ≥ {POSITIONAL_MASS:.0%} of the mass is on "
             "that offset, `</s>` (`<s>` in the decoder) when that much is on it; diffuse "
             f"when the entropy is ≥ {BROAD_ENTROPY:.0%} of the uniform's; else content."), "",
            *table(["kind", "layer", "head", "entropy", "distance", "mean offset",
                    "mass at −1 / 0 / +1", "label"], rows),
            img("entropy_vs_distance", "entropy vs distance"), "",
            *(img(f"entropy/{kind}", f"entropy {kind}") + " "
              + img(f"distance/{kind}", f"distance {kind}") for kind in KINDS), ""]


def _relation_section(r: dict, img) -> list[str]:
    """The best head per relation against the baseline, every head's accuracy (the
    heatmap's cells; heads.json has them too) and the showcase sentence's relations."""
    L = ["## 5. Which relation does each head track?", ""]
    summary = r.get("relations")
    if not summary:
        return L + [f"Skipped: {r['relations_note']}.", ""]
    L += [("For every self-attention head: how often the word a word attends to most is "
           "its gold partner (Clark et al., 2019), per relation and direction: → the "
           "dependent finds its head (subject → verb), ← the head finds its dependent. "
           "Encoder heads read the source words; decoder self heads the target words to "
           "their left (teacher-forced), so only partners to the left count there. "
           "Baseline: the best fixed offset (always the word k to the left/right). A head "
           f"**tracks** a relation when it beats the baseline by ≥ {MARGIN:.0%} (absolute) "
           f"over ≥ {MIN_INSTANCES} instances."), ""]
    for kind in RELATION_KINDS:
        rows = summary[kind]["rows"]
        L += [f"### {kind}", "",
              f"Relations with a head beating the baseline: {tracked(summary[kind], '**')}.", "",
              *table(["relation", "instances", "best head", "accuracy", "baseline (offset)",
                      "margin", "tracks"],
                     ([row_label(row), row["instances"], "{}.{}".format(*row["best_head"]),
                       f"{row['best_accuracy']:.2f}",
                       f"{row['baseline']:.2f} ({row['baseline_offset']:+d})",
                       f"{row['best_accuracy'] - row['baseline']:+.2f}",
                       "**yes**" if row["tracks"] else "no"] for row in rows)),
              img(f"relations/{kind}", f"relation accuracy {kind}"), ""]  # every head's
        if r.get("showcase"):  # one sentence: which head carries each of its relations
            sc = r["showcase"][kind]
            L += [f"On the showcase sentence ({sc['sentence']}), each relation and the head "
                  "giving the most of the first word's attention to the second:", "",
                  *table(["words", "relation", "head", "weight"],
                         ([f"{sc['words'][x['query']]} → {sc['words'][x['key']]}", row_label(x),
                           "{}.{}".format(*x["head"]), f"{x['weight']:.2f}"]
                          for x in sc["relations"]))]
    return L + ["Relations (dependent → head): "
                + "; ".join(f"**{name}**: {what} ({zh}; {en})"
                            for name, (what, zh, en) in RELATION_DOCS.items()) + ".", ""]


def write_json(r: dict, path: Path) -> None:
    """``heads.json``: the relation numbers (and what they were measured on)."""
    summary = r.get("relations")
    doc = {"run_dir": r["run_dir"], "checkpoint": r["checkpoint"], "split": r["split"],
           "sentences": r["sentences"], "margin": MARGIN, "min_instances": MIN_INSTANCES,
           "relations": None if not summary else {
               kind: {"shape": list(summary[kind]["shape"]), "tracked": summary[kind]["tracked"],
                      "rows": [{**row, "accuracy": row["accuracy"].round(6).tolist(),
                                "best_head": list(row["best_head"])}
                               for row in summary[kind]["rows"]]}
               for kind in RELATION_KINDS},
           "relations_note": r.get("relations_note")}
    write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", path)


# ----------------------------------------------------------------------------- a sweep
def sweep_report(labels: list[str], metrics: list[dict], results: list[dict]) -> str:
    """The markdown of ``heads_sweep.md``: per run (named by ``labels``) the test BLEU,
    steps and seconds of its training (``metrics``: its ``metrics.json``) and per attention
    kind how many relations have a head beating the baseline; then per relation and
    direction the best head's accuracy in every run beside the baseline of each
    (``results``: what :func:`tinymt.heads.analyze` returned for each run)."""
    kinds = list(RELATION_KINDS)
    L = ["# Heads across a sweep", "",
         *table(["run", "test BLEU", "steps", "train s",
                 *(f"relations tracked, {k}" for k in kinds), "showcase object, encoder"],
                ([label, _num(m.get("test_bleu")), m.get("steps", "?"),
                  _num(m.get("train_seconds"), ".0f"),
                  *(tracked(r["relations"][k]) if k in (r.get("relations") or {}) else "n/a"
                    for k in kinds), showcase_object(r)]
                 for label, m, r in zip(labels, metrics, results)))]
    for kind in kinds:
        rows: dict[str, dict[int, dict]] = {}
        for i, r in enumerate(results):
            for row in (r.get("relations") or {}).get(kind, {}).get("rows", []):
                rows.setdefault(row_label(row), {})[i] = row
        L += [f"**{kind}**: the best head's accuracy per relation (baseline: the best "
              "fixed offset; bold: the head tracks it)", "",
              *table(["relation", *labels],
                     ([name, *(_sweep_cell(by_run.get(i)) for i in range(len(results)))]
                      for name, by_run in rows.items()))]
    return "\n".join(L)


def showcase_object(r: dict) -> str:
    """The showcase sentence's object (订 ↔ 机票) in the encoder, either direction: the
    largest share of one word's attention a head puts on the other, and that head."""
    enc = (r.get("showcase") or {}).get("encoder_self") or {"relations": ()}
    x = max((x for x in enc["relations"] if x["relation"] == "object"),
            key=lambda x: x["weight"], default=None)
    return "n/a" if x is None else (f"{x['weight']:.2f} ({enc['words'][x['query']]} → "
                                    f"{enc['words'][x['key']]}, head {x['head'][0]}.{x['head'][1]})")


def _sweep_cell(row: dict | None) -> str:
    if row is None:
        return "—"
    acc = f"{row['best_accuracy']:.2f}"
    return f"{'**' + acc + '**' if row['tracks'] else acc} ({row['baseline']:.2f})"


def _num(x, fmt: str = ".2f") -> str:
    """``x`` formatted, or n/a when it is no finite number (an AER without gold links, a
    metric the run did not record)."""
    return format(x, fmt) if isinstance(x, (int, float)) and np.isfinite(x) else "n/a"
