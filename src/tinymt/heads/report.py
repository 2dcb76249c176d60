"""The analysis's outputs: figures (PNG), TensorBoard events and the markdown report."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
from torch.utils.tensorboard import SummaryWriter

from tinymt.heads.pruning import BLEU_DROP
from tinymt.heads.relation_report import relation_figures, relation_scalars, relation_section
from tinymt.heads.stats import BROAD_ENTROPY, POSITIONAL_MASS
from tinymt.model import KINDS
from tinymt.plotting import heatmap, save_figure

REPORT = "heads.md"  # <run>/heads.md, with its figures in <run>/heads/
FIGURES = "heads"


# ----------------------------------------------------------------------------- figures
def write_figures(r: dict, fig_dir: Path, owner=None) -> dict[str, tuple[Path, np.ndarray]]:
    """Every figure of result ``r`` saved under ``fig_dir``: ``{tag: (png path, image
    (H, W, 3) uint8)}`` (``owner``: the run this process holds)."""
    images: dict[str, tuple[Path, object]] = {}  # tag -> (png path, matplotlib figure)
    for kind in KINDS:
        images[f"importance/{kind}"] = (fig_dir / f"importance_{kind}.png", _heatmap(
            r["importance"][kind], f"importance (normalised per layer): {kind}"))
        images[f"entropy/{kind}"] = (fig_dir / f"entropy_{kind}.png", _heatmap(
            r["stats"][kind]["entropy"], f"attention entropy (nats): {kind}"))
        images[f"distance/{kind}"] = (fig_dir / f"distance_{kind}.png", _heatmap(
            r["stats"][kind]["distance"], f"distance from the diagonal: {kind}"))
    if r["pruning"]:
        images["pruning"] = (fig_dir / "pruning.png", _pruning_figure(r["pruning"]["curves"],
                                                                       r["pruning"]["base"]))
    images["entropy_vs_distance"] = (fig_dir / "entropy_vs_distance.png",
                                     _scatter_figure(r["stats"]))
    if r["alignment"] is not None:
        images["aer"] = (fig_dir / "aer_cross.png", _heatmap(
            r["alignment"]["aer"], "alignment error rate (lower = better): cross"))
    images.update(relation_figures(r, fig_dir))
    return {tag: (path, _save_png(fig, path, owner)) for tag, (path, fig) in images.items()}


def _save_png(fig, path: Path, owner) -> np.ndarray:
    """Save ``fig`` to ``path`` and return the image as ``(H, W, 3)`` uint8 (TensorBoard)."""
    img = matplotlib.image.imread(io.BytesIO(save_figure(fig, path, owner)), format="png")
    if img.dtype != np.uint8:
        img = (img * 255).round().astype(np.uint8)
    return img[..., :3]


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
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- TensorBoard
def write_tensorboard(run_dir: Path, images: dict[str, np.ndarray], r: dict,
                      step: int) -> None:
    """Images and scalars under ``heads/...`` in an events file of their own in
    ``run_dir``, replacing the previous analysis's."""
    # our events file carries the suffix .heads: a new analysis replaces the previous one
    # (the pruning curves' steps are % masked, so appending would draw them twice)
    for old in run_dir.glob("events.out.tfevents.*.heads"):
        old.unlink()
    writer = SummaryWriter(str(run_dir), filename_suffix=".heads")
    try:
        for tag, img in images.items():
            writer.add_image(f"heads/{tag}", img, step, dataformats="HWC")
        _head_scalars(writer, r, step)
        writer.add_text("heads/report", f"see {run_dir / REPORT}", step)
    finally:
        writer.close()


def _head_scalars(writer: SummaryWriter, r: dict, step: int) -> None:
    for kind in KINDS:
        means = r["stats"][kind]
        for (layer, h), v in np.ndenumerate(r["importance"][kind]):
            pre = f"{kind}/layer_{layer}/head_{h}"
            writer.add_scalar(f"heads/importance/{pre}", float(v), step)
            writer.add_scalar(f"heads/entropy/{pre}", float(means["entropy"][layer, h]), step)
            writer.add_scalar(f"heads/distance/{pre}", float(means["distance"][layer, h]), step)
    pruning = r["pruning"] or {"curves": {}}
    for curve, pts in pruning["curves"].items():
        for n, total, b in pts:  # x axis = % of the curve's heads masked
            writer.add_scalar(f"heads/pruning_bleu/{curve}", b,
                              round(100 * n / total) if total else 0)
        writer.add_scalar(f"heads/prunable/{curve}", pruning["prunable"][curve], step)
    alignment = r["alignment"]
    if alignment:
        for (layer, h), v in np.ndenumerate(alignment["aer"]):
            writer.add_scalar(f"heads/aer/layer_{layer}/head_{h}", float(v), step)
        writer.add_scalar("heads/aer/best", alignment["best_aer"], step)
        writer.add_scalar("heads/aer/average", alignment["average_aer"], step)
    relation_scalars(writer, r.get("relations"), step)


# ----------------------------------------------------------------------------- markdown
def markdown_report(r: dict, run_dir: Path) -> str:
    """``heads.md``: the result ``r`` of :func:`tinymt.heads.analyze` in tables, with its
    figures (paths relative to ``run_dir``)."""
    def img(tag: str, alt: str) -> str:
        return f"![{alt}]({Path(r['figures'][tag]).relative_to(run_dir).as_posix()})"

    lines = [*_header(r, run_dir), *_importance_section(r, img),
             *_pruning_section(r, run_dir, img), *_alignment_section(r, img),
             *_stats_section(r, img), *relation_section(r, img)]
    return "\n".join(lines)


def _header(r: dict, run_dir: Path) -> list[str]:
    return ["# What does each head do?", "",
            f"Run `{run_dir}`, checkpoint `{Path(r['checkpoint']).name}`, "
            f"{r['sentences']} sentences of the {r['split']} split"
            + (f" ({r['truncated']} truncated to the model's length)" if r["truncated"] else "")
            + f". {r['n_heads']} heads: "
            + ", ".join(f"{k} {a}×{b}" for k, (a, b) in r["shapes"].items())
            + " (layers × heads).", ""]


def _importance_section(r: dict, img: Callable[[str, str], str]) -> list[str]:
    L = ["## 1. Importance", "",
         ("Expected |∂ loss / ∂ gate| of each head (Michel et al., 2019), teacher-forced on "
          "the references, normalised per layer (L2). Low = the loss hardly notices the head."),
         ""]
    for kind in KINDS:
        L += [f"**{kind}**", "", *_grid_table(r["importance"][kind]), "",
              img(f"importance/{kind}", f"importance {kind}"), ""]
    return L


def _pruning_section(r: dict, run_dir: Path, img: Callable[[str, str], str]) -> list[str]:
    pr = r["pruning"]
    L = ["## 2. Pruning without retraining", ""]
    if not pr:
        L += ["Pruning curves skipped (pruning=false).", ""]
    else:
        L += [("Heads masked least important first; greedy BLEU after each step. "
               f"Unpruned BLEU: **{pr['base']:.2f}**."), "",
              "| curve | heads | prunable (BLEU within 1 point) | BLEU at each step (heads "
              "masked: BLEU) |", "| --- | --- | --- | --- |"]
        for curve, pts in pr["curves"].items():
            total = pts[-1][1]
            k = pr["prunable"][curve]
            steps = ", ".join(f"{n}: {b:.1f}" for n, _, b in pts)
            L.append(f"| {curve} | {total} | **{k}** ({100 * k / max(total, 1):.0f}%) "
                     f"| {steps} |")
        L += ["", img("pruning", "BLEU vs heads masked"), ""]
    if r["pruned"]:
        p = r["pruned"]
        L += [f"Pruned checkpoint: `{p['path']}` — {p['n_masked']} of {r['n_heads']} heads "
              f"masked ({100 * p['n_masked'] / r['n_heads']:.0f}%; prune={p['fraction']:g}), BLEU {p['bleu']:.2f}. Masked: "
              + (", ".join(f"{k} {layer}.{h}" for k, layer, h in p["heads"]) or "none")
              + ". Translate with it: `python scripts/translate.py run=" + str(run_dir)
              + f" checkpoint={p['path']}`.", ""]
    return L


def _alignment_section(r: dict, img: Callable[[str, str], str]) -> list[str]:
    L = ["## 3. Cross-attention as word alignment", ""]
    a = r["alignment"]
    if a is None:
        return L + [f"Skipped: {r['alignment_note']}.", ""]
    L += [("Alignment error rate (AER, lower is better) of each cross-attention head's "
           "alignment against the corpus's gold word alignments: for each target word, the "
           "source word whose pieces get the most of its attention (EOS = no link). "
           f"{a['gold_links']} gold links."), "",
          *_grid_table(a["aer"]), "",
          "| heads averaged | AER |", "| --- | --- |"]
    for layer, v in enumerate(a["layer_average_aer"]):
        L.append(f"| layer {layer} | {_fmt_aer(v)} |")
    L += [f"| all cross heads | {_fmt_aer(a['average_aer'])} |", "",
          (f"Best head: **layer {a['best_head'][0]}, head {a['best_head'][1]}**, AER "
           f"**{a['best_aer']:.3f}**. Floor for one link per target word (oracle): "
           f"{a['oracle_aer']:.3f}."), "", img("aer", "AER per cross head"), ""]
    return L


def _stats_section(r: dict, img: Callable[[str, str], str]) -> list[str]:
    L = ["## 4. Entropy and distance", "",
         ("Entropy (nats) of each head's attention rows, and its distance from the diagonal "
          "as a fraction of the sentence (0 = on the diagonal). Self-attention labels: "
          f"previous / same / next token when ≥ {POSITIONAL_MASS:.0%} of the mass is on "
          f"that offset; broad when the entropy is ≥ {BROAD_ENTROPY:.0%} of the uniform's; "
          "else content."), "",
         "| kind | layer | head | entropy | distance | mean offset | mass at −1 / 0 / +1 "
         "| label |",
         "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind in KINDS:
        m = r["stats"][kind]
        for (layer, h), e in np.ndenumerate(m["entropy"]):
            off = f"{m['offset'][layer, h]:+.2f}" if "offset" in m else "—"
            mass = " / ".join(f"{m[n][layer, h]:.2f}" for n in ("prev", "same", "next")) \
                if "prev" in m else "—"
            L.append(f"| {kind} | {layer} | {h} | {e:.2f} | {m['distance'][layer, h]:.3f} "
                     f"| {off} | {mass} | {r['labels'][kind][layer][h]} |")
    L += ["", img("entropy_vs_distance", "entropy vs distance"), ""]
    for kind in KINDS:
        L += [img(f"entropy/{kind}", f"entropy {kind}") + " "
              + img(f"distance/{kind}", f"distance {kind}")]
    L.append("")
    return L


def _grid_table(values: np.ndarray) -> list[str]:
    """A markdown table of a ``(layers, heads)`` array, three decimals."""
    n_layers, n_heads = values.shape
    lines = ["| layer | " + " | ".join(f"head {h}" for h in range(n_heads)) + " |",
             "| --- |" + " --- |" * n_heads]
    for layer in range(n_layers):
        cells = [f"{values[layer, h]:.3f}" for h in range(n_heads)]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return lines


def _fmt_aer(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.3f}"
