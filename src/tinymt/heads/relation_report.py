"""The relation analysis's outputs: heatmaps, the showcase figure, TensorBoard scalars,
the ``heads.md`` section and ``heads.json`` (see :mod:`tinymt.heads.relations`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import FancyArrowPatch

from tinymt.corpus.relations import RELATION_DOCS, RELATIONS
from tinymt.files import write_text
from tinymt.heads.relations import (
    MARGIN,
    MIN_INSTANCES,
    RELATION_KINDS,
    tracking_heads,
)
from tinymt.plotting import cjk_font_name, heatmap

JSON_REPORT = "heads.json"  # <run>/heads.json: the relation numbers, machine-readable
ARROWS = {"dep->head": "→", "head->dep": "←"}  # dependent → head, head ← dependent
_SHOWN_SHARE = 0.3  # a link not in the gold is drawn when it gets this much of the word


def row_label(row: dict) -> str:
    """``subject →`` (the dependent looks for its head) / ``subject ←`` (the reverse)."""
    return f"{row['relation']} {ARROWS[row['direction']]}"


# ----------------------------------------------------------------------------- figures
def relation_heatmap(summary: dict, kind: str):
    """Accuracy of every head (columns ``layer.head``) on every relation and direction
    (rows), with the best fixed offset's accuracy as the last column."""
    rows = summary[kind]["rows"]
    n_layers, n_heads = summary[kind]["shape"]
    values = np.array([[*row["accuracy"].ravel(), row["baseline"]] for row in rows]) \
        if rows else np.zeros((1, n_layers * n_heads + 1))
    cols = [f"{layer}.{h}" for layer in range(n_layers) for h in range(n_heads)] + ["offset"]
    fig = heatmap(values, f"relation accuracy per head: {kind} (last column: best fixed "
                  "offset)", row_label="relation (→ dependent finds head, ← head finds "
                  "dependent)", col_label="layer.head", row_ticks=[row_label(r) for r in rows]
                  or ["(no relations)"], col_ticks=cols)
    fig.axes[0].images[0].set_clim(0.0, 1.0)
    return fig


def showcase_figure(links: dict, summary: dict, kind: str):
    """The showcase sentence once per head of ``kind``: an arrow from each word to the
    word it attends to most (shown when it is gold or gets >= 30% of the word's
    attention); gold relations the head tracks are coloured and named."""
    data = links[kind]
    words, attended, share, gold = data["words"], data["attended"], data["share"], data["gold"]
    n_layers, n_heads, n = attended.shape
    tracked = {head: {name.split(" (")[0] for name in names}
               for head, names in tracking_heads(summary, kind).items()}
    colours = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(RELATIONS)}
    width = max(3.2, 0.42 * n)
    fig, axes = plt.subplots(n_layers, n_heads, figsize=(width * n_heads, 1.9 * n_layers),
                             squeeze=False)
    family = [cjk_font_name(), "DejaVu Sans"]
    for layer in range(n_layers):
        for h in range(n_heads):
            ax = axes[layer][h]
            ax.set_xlim(-0.7, n - 0.3)
            ax.set_ylim(-0.6, 2.2)
            ax.axis("off")
            for i, w in enumerate(words):
                ax.text(i, 0, w, ha="center", va="top", fontsize=8, family=family)
            mine = tracked.get((layer, h), set())
            for q in range(n):
                a = int(attended[layer, h, q])
                if a < 0 or a == q:
                    continue
                rel = gold.get((q, a))
                if rel is None and share[layer, h, q] < _SHOWN_SHARE:
                    continue
                on = rel is not None and rel in mine
                colour = colours[rel] if rel is not None else (0.6, 0.6, 0.6, 0.7)
                rad = -0.5 if a > q else 0.5
                ax.add_patch(FancyArrowPatch(
                    (q, 0.15), (a, 0.15), connectionstyle=f"arc3,rad={rad}",
                    arrowstyle="-|>", mutation_scale=7, color=colour,
                    linewidth=2.0 if on else 0.8, linestyle="-" if rel else ":"))
                if on:
                    ax.text((q + a) / 2, 0.2 + 0.28 * abs(a - q), rel, ha="center",
                            fontsize=7, color=colour, fontweight="bold")
            title = f"layer {layer} head {h}"
            if mine:
                title += ": " + ", ".join(sorted(mine))
            ax.set_title(title, fontsize=8)
    fig.suptitle(f"{kind}: where each word looks (arrow: to its most-attended word; "
                 "coloured: a gold relation, named where the head tracks it)", fontsize=9)
    fig.tight_layout()
    return fig


def relation_figures(r: dict, fig_dir: Path) -> dict[str, tuple[Path, object]]:
    """``{tag: (png path, figure)}`` of the relation analysis in result ``r``."""
    out: dict[str, tuple[Path, object]] = {}
    summary = r.get("relations")
    if not summary:
        return out
    for kind in RELATION_KINDS:
        out[f"relations/{kind}"] = (fig_dir / f"relations_{kind}.png",
                                    relation_heatmap(summary, kind))
        if r.get("showcase"):
            out[f"relations/showcase_{kind}"] = (fig_dir / f"relations_showcase_{kind}.png",
                                                 showcase_figure(r["showcase"], summary, kind))
    return out


# ----------------------------------------------------------------------------- TensorBoard
def relation_scalars(writer, summary: dict | None, step: int) -> None:
    """``heads/relations/<kind>/<relation>_<direction>/{best,baseline}`` scalars and the
    accuracy of every head."""
    if not summary:
        return
    for kind in RELATION_KINDS:
        for row in summary[kind]["rows"]:
            pre = f"heads/relations/{kind}/{row['relation']}_{row['direction'].replace('->', '_to_')}"
            writer.add_scalar(f"{pre}/best", row["best_accuracy"], step)
            writer.add_scalar(f"{pre}/baseline", row["baseline"], step)
            for (layer, h), a in np.ndenumerate(row["accuracy"]):
                writer.add_scalar(f"{pre}/layer_{layer}/head_{h}", float(a), step)


# ----------------------------------------------------------------------------- markdown
def relation_section(r: dict, img: Callable[[str, str], str]) -> list[str]:
    """The ``heads.md`` section: the best head per relation against the baseline, every
    head's accuracy, the heatmaps and the showcase figures."""
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
        L += _kind_tables(summary, kind)
        L += [img(f"relations/{kind}", f"relation accuracy {kind}"), ""]
        if r.get("showcase"):
            L += [img(f"relations/showcase_{kind}", f"showcase {kind}"), ""]
    L += ["Relations (dependent → head): "
          + "; ".join(f"**{name}**: {what} ({zh}; {en})"
                      for name, (what, zh, en) in RELATION_DOCS.items()) + ".", ""]
    return L


def _kind_tables(summary: dict, kind: str) -> list[str]:
    rows = summary[kind]["rows"]
    tracked = summary[kind]["tracked"]
    L = [f"### {kind}", "",
         f"Relations with a head beating the baseline: **{len(tracked)} of "
         f"{len({row['relation'] for row in rows})}**"
         + (f" ({', '.join(tracked)})" if tracked else "") + ".", "",
         "| relation | instances | best head | accuracy | baseline (offset) | margin | "
         "tracks |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        layer, h = row["best_head"]
        margin = row["best_accuracy"] - row["baseline"]
        L.append(f"| {row_label(row)} | {row['instances']} | {layer}.{h} | "
                 f"{row['best_accuracy']:.2f} | {row['baseline']:.2f} "
                 f"({row['baseline_offset']:+d}) | {margin:+.2f} | "
                 f"{'**yes**' if row['tracks'] else 'no'} |")
    n_layers, n_heads = summary[kind]["shape"]
    heads = [f"{layer}.{h}" for layer in range(n_layers) for h in range(n_heads)]
    L += ["", "<details><summary>every head (accuracy)</summary>", "",
          "| relation | " + " | ".join(heads) + " | baseline |",
          "| --- |" + " --- |" * (len(heads) + 1)]
    for row in rows:
        cells = [f"{a:.2f}" for a in row["accuracy"].ravel()]
        L.append(f"| {row_label(row)} | " + " | ".join(cells) + f" | {row['baseline']:.2f} |")
    L += ["", "</details>", ""]
    return L


# ----------------------------------------------------------------------------- JSON
def write_json(r: dict, path: Path, owner=None) -> None:
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
    write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", path, owner=owner)
