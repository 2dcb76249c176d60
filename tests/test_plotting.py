"""Attention grids: one panel per head, masked cells blank, Chinese labels in a CJK font."""

import numpy as np
from matplotlib import font_manager
from matplotlib.font_manager import FontProperties

from tinymt.plotting import attention_grid, cjk_font_name, figure_to_array


def _labels(fig):
    return [t for ax in fig.axes for t in ax.texts if t.get_text()]


def test_one_panel_per_head_and_labels():
    rng = np.random.default_rng(0)
    w = rng.random((3, 4, 5))
    w /= w.sum(-1, keepdims=True)
    fig = attention_grid(w, list("abcd"), list("vwxyz"), title="cross / layer 0")
    titled = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titled == ["head 0", "head 1", "head 2"]
    # columns under every panel, rows beside the first: one label a token, in order
    assert [t.get_text() for t in fig.axes[0].texts] == list("vwxyz") + list("abcd")
    assert [t.get_text() for t in fig.axes[1].texts] == list("vwxyz")
    img = figure_to_array(fig)
    assert img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8


def test_chinese_labels_use_the_bundled_cjk_font():
    fig = attention_grid(np.full((1, 2, 2), 0.5), ["▁我", "请"], ["李", "雷"])
    cjk_file = font_manager.findfont(FontProperties(family=cjk_font_name()), fallback_to_default=False)
    assert "NotoSansCJK" in cjk_file
    for text in _labels(fig):
        used = font_manager.findfont(text.get_fontproperties(), fallback_to_default=False)
        assert used == cjk_file, text.get_text()
    # the font really has these glyphs (a box would come from a missing glyph)
    from matplotlib.ft2font import FT2Font

    font = FT2Font(cjk_file)
    for ch in "我请李雷帮订了去北京的机票":
        assert font.get_char_index(ord(ch)) != 0, ch
    figure_to_array(fig)


def test_masked_cells_are_blank():
    w = np.tril(np.ones((1, 3, 3)))
    w /= w.sum(-1, keepdims=True)
    fig = attention_grid(w, list("abc"), list("abc"))
    arr = fig.axes[0].images[0].get_array()
    assert arr.mask[0, 2] and arr.mask[0, 1] and not arr.mask[2, 0]
    figure_to_array(fig)
