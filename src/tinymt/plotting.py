"""Per-head attention maps: one figure per (attention kind, layer), one heatmap per head.

The trainer logs these to TensorBoard and ``translate.py attention=...`` saves them to
PNG; both call :func:`attention_grid`. Labels are sentencepiece pieces, drawn with Noto
Sans CJK SC (:func:`tinymt.fonts.sc_font_file`) so that Chinese shows its SC forms.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from functools import lru_cache

import matplotlib

matplotlib.use("Agg")  # headless: no display needed, ever

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.transforms import offset_copy  # noqa: E402

from tinymt.files import write_bytes  # noqa: E402
from tinymt.fonts import font_path, sc_font_file  # noqa: E402


@lru_cache(maxsize=1)
def cjk_font_name() -> str:
    """Register the CJK font with matplotlib and return its family name: Noto Sans CJK SC,
    else the bundled font (Japanese forms; :func:`tinymt.fonts.sc_font_file` has logged
    why): a font never stops a run."""
    path = str(sc_font_file() or font_path())
    font_manager.fontManager.addfont(path)
    return font_manager.FontProperties(fname=path).get_name()


def _display(piece: str) -> str:
    """Sentencepiece marks word starts with U+2581; show it as a visible underscore."""
    return piece.replace("\u2581", "_") if piece else "∅"


def attention_grid(weights: np.ndarray, query_labels: Sequence[str],
                   key_labels: Sequence[str], title: str = "") -> Figure:
    """One heatmap per head of ``weights`` ``(heads, T_q, T_k)`` (rows sum to 1), rows
    labelled by the ``T_q`` ``query_labels`` (the tokens looking), columns by the ``T_k``
    ``key_labels`` (the tokens looked at), titled e.g. ``"cross / layer 2"``. Masked
    entries (exact zeros: the causal mask) are drawn blank."""
    weights = np.asarray(weights, dtype=np.float32)
    n_heads, t_q, t_k = weights.shape
    cols = min(n_heads, 4)
    rows = math.ceil(n_heads / cols)
    fontsize = 8 if max(t_q, t_k) <= 30 else 6
    cell = fontsize / 72 * 1.5  # inches per token: one label line
    # fixed margins sized from the labels (tight_layout measures every label: too slow)
    label_in = fontsize / 72 * 0.75 * max(len(_display(p)) for p in [*query_labels, *key_labels])
    left, bottom, top, gap = label_in + 0.3, label_in + 0.2, 0.55 if title else 0.35, 0.25
    panel_w, panel_h = max(1.5, cell * t_k), max(1.5, cell * t_q)
    fig_w = left + cols * panel_w + (cols - 1) * gap + 0.2
    fig_h = top + rows * (panel_h + bottom) + 0.1
    family = [cjk_font_name(), "DejaVu Sans"]
    fig = plt.figure(figsize=(fig_w, fig_h))
    masked = np.ma.masked_where(weights == 0.0, weights)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="white")
    for h in range(n_heads):
        r, c = divmod(h, cols)
        x0 = (left + c * (panel_w + gap)) / fig_w
        y0 = 1 - (top + r * (panel_h + bottom) + panel_h) / fig_h
        ax = fig.add_axes((x0, y0, panel_w / fig_w, panel_h / fig_h))
        ax.imshow(masked[h], cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=fontsize + 1, family=family)
        # labels as texts 3 pt off the axes, not ticks (five artists each: twice as slow)
        ax.set_xticks([]), ax.set_yticks([])
        below = offset_copy(ax.get_xaxis_transform(), fig=fig, y=-3, units="points")
        beside = offset_copy(ax.get_yaxis_transform(), fig=fig, x=-3, units="points")
        for i, label in enumerate(key_labels):
            ax.text(i, 0, _display(label), transform=below, rotation=90, ha="center",
                    va="top", fontsize=fontsize, family=family)
        for i, label in enumerate(query_labels if c == 0 else []):  # once a row of panels
            ax.text(0, i, _display(label), transform=beside, ha="right", va="center",
                    fontsize=fontsize, family=family)
    if title:
        fig.suptitle(title, family=family, y=1 - 0.12 / fig_h, va="top", fontsize=fontsize + 2)
    return fig


def figure_to_array(fig: Figure) -> np.ndarray:
    """Render a figure to an ``(H, W, 3)`` uint8 array (for TensorBoard) and close it."""
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    plt.close(fig)
    return rgba[..., :3].copy()


def save_figure(fig: Figure, path) -> None:
    """Save a figure as PNG (:func:`tinymt.files.write_bytes`) and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    write_bytes(buf.getvalue(), path)


def heatmap(values: np.ndarray, title: str, row_label: str = "layer", col_label: str = "head",
            row_ticks: Sequence[str] | None = None, col_ticks: Sequence[str] | None = None
            ) -> Figure:
    """A small annotated heatmap (layers x heads by default, e.g. head importance);
    ``row_ticks`` / ``col_ticks`` name the rows / columns instead of 0, 1, ..."""
    values = np.asarray(values, dtype=np.float32)
    rows, cols = values.shape
    left = 0.0 if row_ticks is None else 0.075 * max(map(len, row_ticks), default=0)
    fig, ax = plt.subplots(figsize=(1.0 + left + 0.7 * cols, 0.8 + 0.5 * rows))
    im = ax.imshow(values, cmap="magma", aspect="auto")
    lo, hi = im.get_clim()
    for r in range(rows):
        for c in range(cols):
            dark = (values[r, c] - lo) < 0.6 * (hi - lo)  # magma is dark at the low end
            ax.text(c, r, f"{values[r, c]:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")
    ax.set_xticks(range(cols), labels=col_ticks)
    ax.set_yticks(range(rows), labels=row_ticks)
    ax.set(xlabel=col_label, ylabel=row_label, title=title)
    fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    return fig
