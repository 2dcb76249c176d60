"""Watching every head learn, in a real browser (Debian's Chromium through Playwright, as in
test_viewer_browser.py): the overview of every layer x head, clicking into one head, the
state in the URL, keyboard, dark mode and narrow windows (on the self-contained HTML file
of synthetic documents), then in TensorBoard's tab: Play through the frames of a run with
``trainer.probe_every``, each head's trend, the SC face, the first text under a 20 Mbit/s
link, and a run started after the page opened reaching the tab with no page reload.

What is on screen is read back from the page itself (canvas pixels, text, attributes) and
compared with the numbers the documents or the plugin hold.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import (
    canvas_pixels,
    expected_pixels,
    http_get,
    showcase_document,
    synthetic_document,
    tensorboard_process,
    view_palette,
)
from tinymt.viewer.document import jsonable
from tinymt.viewer.html import html_page, inline_data

pytestmark = pytest.mark.slow

ROUTE = "data/plugin/tinymt_attention"
MEAN = (0x55, 0x55, 0x55)  # view.js MEAN_COLOR: the mean-of-heads row
DARK = (32, 33, 36)  # view.js BACKGROUND.dark
# a head's label as the trainer records it: the label, then what was measured
RELATION = "object ← 0.62 · accuracy 0.62 over 40 instances · baseline 0.45: the word at offset -2"


def page_of(tmp_path: Path, docs: list[dict], name: str = "maps.html") -> Path:
    target = tmp_path / name
    target.write_text(html_page("synthetic", docs), encoding="utf-8")
    return target


def ready(view, step: int | None = None):
    extra = f'[data-step="{step}"]' if step is not None else ""
    view.locator(f'#tinymt-attention[data-ready="true"]{extra}').wait_for(timeout=60_000)
    return view.locator("#tinymt-attention")


def redraw_ms(view, control: str, values: list[str], rounds: int = 5) -> float:
    """Median time (ms) view.js took to draw after ``control`` changed, over ``rounds``
    rounds of ``values``."""
    root = view.locator("#tinymt-attention")
    times = []
    for _ in range(rounds):
        for value in values:
            view.locator(control).select_option(value)
            times.append(float(root.get_attribute("data-draw-ms")))
    return float(np.median(times))


def weights_of(doc: dict, kind: str) -> np.ndarray:
    return np.asarray(doc["kinds"][kind]["weights"])  # (layers, heads, T_q, T_k)


def assert_overview_is(view, w: np.ndarray, heads, background=(255, 255, 255)) -> None:
    """Every picture of the overview is its head's weights, pixel for pixel; the last of
    each row the mean of the layer's heads."""
    drawn = canvas_pixels(view, "#overview canvas.cells")
    layers = w.shape[0]
    assert len(drawn) == layers * (len(heads) + 1)
    seen = set()
    for data, pixels in drawn:
        layer, h = int(data["layer"]), int(data["head"])
        seen.add((layer, h))
        if h < 0:
            want = expected_pixels(w[layer].astype(np.float64).mean(0), MEAN, background)
        else:
            want = expected_pixels(w[layer, h], view_palette()[h], background)
        assert (pixels == want).all(), f"layer {layer} head {h}: {(pixels != want).any(-1).sum()} differ"
    assert seen == {(layer, h) for layer in range(layers) for h in [*heads, -1]}


def test_the_overview_shows_every_head_and_opens_one(browser, tmp_path):
    """8 heads x 6 layers of a 40-token sentence: every picture equals its weights, all fit
    1400 x 900, and a click opens that head in the matrix view."""
    doc = synthetic_document(layers=6, heads=8, n=40, step=7)
    target = page_of(tmp_path, [doc])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(target.as_uri())
    root = ready(page)
    assert root.get_attribute("data-view") == "overview"
    for kind in ("encoder_self", "decoder_self", "cross"):
        page.locator("#kind").select_option(kind)
        assert_overview_is(page, weights_of(doc, kind), range(8))
    boxes = page.locator(".thumb").evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect();"
        " return [r.left, r.top, r.right, r.bottom]; })")
    assert len(boxes) == 6 * 9
    assert max(b[2] for b in boxes) <= 1400 and max(b[3] for b in boxes) <= 900, boxes[-1]
    # a click on layer 3, head 5: the matrix view of that layer, that head alone
    page.locator(".thumb[data-layer='3'][data-head='5']").click()
    assert root.get_attribute("data-view") == "matrix"
    assert page.locator("#layer").input_value() == "3"
    (data, pixels), = canvas_pixels(page, "#matrices canvas.cells")
    assert data["head"] == "5"
    assert (pixels == expected_pixels(weights_of(doc, "cross")[3, 5], view_palette()[5])).all()
    # the mean of layer 1: every head of it
    page.locator("#mode").select_option("overview")
    page.locator(".thumb[data-layer='1'][data-head='-1']").click()
    assert [d["head"] for d, _ in canvas_pixels(page, "#matrices canvas.cells")] == \
        [str(h) for h in range(8)]
    assert not errors, errors
    page.close()


@pytest.mark.skipif(not os.environ.get("TINYMT_REDRAW_TIMES"), reason="measures the view's "
                    "redraw times (docs/viewer.md): TINYMT_REDRAW_TIMES=1 to run it, with -s")
def test_redraw_times(browser, tmp_path):
    """Prints the medians of 10 redraws (the view's own ``data-draw-ms``) of the overview
    and of a layer's matrices, for 8 heads x 6 layers and 4 x 2, 40 tokens a side: figures,
    not a check (the suite leaves it out)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    for layers, heads in ((6, 8), (2, 4)):
        doc = synthetic_document(layers=layers, heads=heads, n=40, step=7)
        page.goto(page_of(tmp_path, [doc], f"redraw_{heads}x{layers}.html").as_uri())
        ready(page)
        overview = redraw_ms(page, "#kind", ["encoder_self", "cross"])
        page.locator("#mode").select_option("matrix")
        matrix = redraw_ms(page, "#layer", ["0", "1"])
        print(f"\n{heads}x{layers} heads, 40 tokens: overview redraw {overview:.0f} ms, "
              f"matrix ({heads} heads) {matrix:.0f} ms (medians)")
    page.close()


def test_the_overview_fits_1400_x_900_without_a_scrollbar(browser, tmp_path):
    """Width-bound (few layers, many heads) or height-bound, short or long sentences, each
    head named by a relation: the overview of every kind fits 1400 x 900 beside the panel,
    no horizontal scrollbar (each picture's frame was left out of the fit: 2 px a column
    too wide)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    for layers, heads, n in [(2, 4, 16), (2, 8, 40), (1, 8, 60), (3, 16, 30), (6, 8, 40)]:
        doc = synthetic_document(layers=layers, heads=heads, n=n, step=1)
        for view in doc["kinds"].values():
            view["labels"] = [[RELATION] * heads] * layers
        page.goto(page_of(tmp_path, [doc], f"fit_{layers}_{heads}_{n}.html").as_uri())
        ready(page)
        for kind in ("encoder_self", "decoder_self", "cross"):
            page.locator("#kind").select_option(kind)
            over = page.evaluate("() => { const v = document.querySelector('.tmv-views');"
                                 " return v.scrollWidth - v.clientWidth; }")
            assert over <= 0, (layers, heads, n, kind, over)
    page.close()


def test_the_overview_outlines_the_gold_cells(browser, tmp_path):
    """With "gold" on, every picture of the overview outlines the kind's gold cells, where
    they are (row, column, size of a cell); off, none; a hover still reads the cell."""
    doc = synthetic_document(layers=2, heads=4, n=12, step=1)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(page_of(tmp_path, [doc], "gold.html").as_uri())
    ready(page)
    page.locator("#kind").select_option("cross")  # (the synthetic gold cells: cross's)
    gold = {(i, j) for i, j, *_ in doc["kinds"]["cross"]["gold"]}
    assert gold
    for thumb in page.locator(".thumb").all():
        s = float(thumb.get_attribute("data-scale"))
        rects = thumb.locator("svg.ov-gold rect.gold").evaluate_all(
            "rs => rs.map(r => [+r.dataset.row, +r.dataset.col, +r.getAttribute('x'),"
            " +r.getAttribute('y'), +r.getAttribute('width')])")
        assert {(i, j) for i, j, *_ in rects} == gold
        assert all((x, y, w) == (j * s, i * s, s) for i, j, x, y, w in rects)
    page.locator("#gold").uncheck()
    assert page.locator("#overview rect.gold").count() == 0
    page.locator(".thumb[data-layer='0'][data-head='1'] canvas.cells").hover(
        position={"x": 1, "y": 1})
    assert page.locator("#info").get_attribute("data-thumb") == "0,1"
    page.close()


def test_a_link_restores_the_view(browser, tmp_path):
    """The state lives in the URL's #fragment: a link opens the same view (kind, layer,
    view, heads, colour scale, gold); a change is written back."""
    doc = synthetic_document(layers=3, heads=8, n=16)
    target = page_of(tmp_path, [doc])
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(target.as_uri() + "#kind=encoder_self&layer=2&view=matrix&hide=0,1,2,3,4,6&norm=row&gold=0")
    root = ready(page)
    assert page.locator("#kind").input_value() == "encoder_self"
    assert page.locator("#layer").input_value() == "2"
    assert root.get_attribute("data-view") == "matrix"
    assert page.locator("#gold").is_checked() is False
    assert page.locator("#colorbar").get_attribute("data-norm") == "row"
    drawn = canvas_pixels(page, "#matrices canvas.cells")
    assert [d["head"] for d, _ in drawn] == ["5", "7"]
    w = weights_of(doc, "encoder_self")[2]
    for data, pixels in drawn:
        h = int(data["head"])
        assert (pixels == expected_pixels(w[h], view_palette()[h], norm="row")).all()
    page.locator("#layer").select_option("1")
    page.locator(".head-toggle[data-head='6']").click()
    state = dict(p.split("=", 1) for p in page.evaluate("location.hash").lstrip("#").split("&"))
    assert state["layer"] == "1" and state["hide"] == "0%2C1%2C2%2C3%2C4" and state["norm"] == "row"
    page.close()


def test_keyboard_dark_mode_and_a_narrow_window(browser, tmp_path):
    """Tokens are reached with Tab and show what they attend to; a dark page draws on a
    dark background; on a 768 px window the hover panel stays on screen."""
    doc = synthetic_document(layers=2, heads=4, n=30)
    target = page_of(tmp_path, [doc])
    page = browser.new_page(viewport={"width": 768, "height": 600}, color_scheme="dark")
    page.goto(target.as_uri() + "#view=matrix&kind=cross&layer=0")
    root = ready(page)
    assert "tmv-dark" in root.get_attribute("class")
    w = weights_of(doc, "cross")[0]
    for data, pixels in canvas_pixels(page, "#matrices canvas.cells"):
        h = int(data["head"])
        assert (pixels == expected_pixels(w[h], view_palette()[h], DARK)).all()
    # Tab from the slider onwards reaches the first head's row labels
    page.locator("#step").focus()
    for _ in range(80):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('row-label')"):
            break
    else:
        pytest.fail("no row label reached with Tab")
    row = int(page.evaluate("document.activeElement.dataset.row"))
    info = page.locator("#info")
    assert info.get_attribute("data-axis") == "row" and info.get_attribute("data-index") == str(row)
    shown = info.locator(".info-head[data-head='0']").get_attribute("data-values")
    np.testing.assert_allclose([float(v) for v in shown.split(",")], w[0, row] / 255, atol=6e-4)
    # a label far down the page, hovered: the panel is inside the window
    label = page.locator("text.row-label[data-row='29']").last
    label.scroll_into_view_if_needed()
    label.hover()
    box = info.bounding_box()
    assert info.get_attribute("data-index") == "29"
    assert box["y"] >= 0 and box["y"] + box["height"] <= 600 and box["x"] + box["width"] <= 768, box
    page.close()


def labelled(doc: dict, step: int) -> dict:
    """``doc`` with each head's label as the trainer records it: positional everywhere, and
    at step 800 encoder layer 1 head 2 tracking a relation, cross layer 5 head 0 aligning."""
    for view in doc["kinds"].values():
        layers, heads = view["weights"].shape[:2]
        view["labels"] = [["previous · 0.71 of its attention on the previous token"] * heads
                          for _ in range(layers)]
        view["labels"][0][0] = "diffuse · entropy 0.93 of the uniform's"
    if step == 800:
        doc["kinds"]["encoder_self"]["labels"][1][2] = RELATION
        doc["kinds"]["cross"]["labels"][5][0] = "aligned 0.81, </s> 0.10 · 0.81 on the " \
            "gold-aligned source pieces, 0.04 on the piece before them, 0.03 on the piece after " \
            "them, 0.10 on </s>, 0.02 on anything else · over 700 target pieces with gold-aligned " \
            "source words"
    return doc


def steps_page(tmp_path: Path, docs: list[dict]) -> Path:
    """The self-contained page of one probe at several steps (the Attention tab's frames,
    without TensorBoard): html_page's inline data with the steps put together."""
    page = html_page("synthetic", docs[:1])
    data = inline_data("synthetic", docs[:1])
    key = "synthetic\u0000probe_0"
    data["steps"][key] = [d["step"] for d in docs]
    data["docs"] = {f"{key}\u0000{d['step']}": jsonable(d) for d in docs}
    head, rest = page.split('<script type="application/json" id="tinymt-data">')
    target = tmp_path / "steps.html"
    target.write_text(head + '<script type="application/json" id="tinymt-data">' +
                      json.dumps(data, ensure_ascii=False).replace("<", "\\u003c") +
                      rest[rest.index("</script>"):], encoding="utf-8")
    return target


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast of two CSS ``rgb(...)`` colours."""
    def lum(css):
        c = [int(v) / 255 for v in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
        c = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
    hi, lo = sorted((lum(fg), lum(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_each_head_is_named_under_its_picture_frame_by_frame(browser, tmp_path):
    """Under every head of the overview its label at the step shown (the mean's column
    none); a relation in bold and its own colour, readable in dark mode too; its meaning in
    full on hover; another step, another label; 8 heads x 6 layers still fit 1400 x 900."""
    docs = [labelled(synthetic_document(layers=6, heads=8, n=40, step=s), s) for s in (100, 800)]
    target = steps_page(tmp_path, docs)
    errors = []
    for scheme in ("light", "dark"):
        page = browser.new_page(viewport={"width": 1400, "height": 900}, color_scheme=scheme)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(target.as_uri() + "#kind=encoder_self")
        ready(page, 800)  # the last step first
        tags = page.locator(".thumb").evaluate_all(
            "els => els.map(e => { const t = e.querySelector('.ov-tag'), r = e.getBoundingClientRect();"
            " return [+e.dataset.layer, +e.dataset.head, t.textContent, t.className,"
            " getComputedStyle(t).fontWeight, getComputedStyle(t).color, r.right, r.bottom,"
            " t.scrollWidth <= t.clientWidth + 1]; })")
        assert len(tags) == 6 * 9 and all(t[8] for t in tags)  # none cut short
        want = {(layer, h): "previous" for layer in range(6) for h in range(8)}
        want.update({(0, 0): "diffuse", (1, 2): "object ← 0.62"})
        want.update({(layer, -1): "" for layer in range(6)})
        assert {(t[0], t[1]): t[2] for t in tags} == want
        rel = next(t for t in tags if t[:2] == [1, 2])
        plain = next(t for t in tags if t[:2] == [1, 3])
        assert "relation" in rel[3] and "relation" not in plain[3]
        assert int(rel[4]) >= 700 > int(plain[4]) and rel[5] != plain[5]
        background = page.evaluate("getComputedStyle(document.querySelector('.tmv')).backgroundColor")
        assert contrast(rel[5], background) >= 4.5 and contrast(plain[5], background) >= 3
        assert max(t[6] for t in tags) <= 1400 and max(t[7] for t in tags) <= 900
        assert page.evaluate("() => { const v = document.querySelector('.tmv-views');"
                             " return v.scrollWidth - v.clientWidth; }") <= 0
        # hover: the label in full, what it means
        page.locator(".thumb[data-layer='1'][data-head='2'] canvas.cells").hover()
        info = page.locator("#info").inner_text()
        assert "object ← 0.62" in info and "accuracy 0.62 over 40 instances" in info
        assert "baseline 0.45: the word at offset -2" in info and "← the head its dependent" in info
        page.locator("#kind").select_option("cross")
        assert page.locator(".thumb[data-layer='5'][data-head='0'] .ov-tag.relation").inner_text() \
            == "aligned 0.81, </s> 0.10"
        page.locator(".thumb[data-layer='5'][data-head='0'] canvas.cells").hover()
        info = page.locator("#info").inner_text()
        assert "0.03 on the piece after them" in info and "just before or after them" in info
        # the first frame: that head is not named by a relation yet
        page.locator("#step").fill("0")
        ready(page, 100)
        assert page.locator(".thumb[data-layer='5'][data-head='0'] .ov-tag").inner_text() == "previous"
        assert page.locator(".ov-tag.relation").count() == 0
        assert not errors, errors
        page.close()


def test_the_sentence_s_relations_each_with_the_head_carrying_it(browser, tmp_path):
    """Under the sentence, at the step shown: each gold relation of it and the head giving
    the most of the first word's attention to the second, with that share (the document's,
    worked out plainly in tests/test_viewer.py); another step, other heads; a click opens
    the head; cross-attention has none."""
    docs = [showcase_document(seed=seed, step=step)[1] for seed, step in ((1, 100), (2, 800))]
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(steps_page(tmp_path, docs).as_uri() + "#kind=encoder_self")
    ready(page, 800)

    def listed(doc):
        return [f"{q} → {k} {label}: layer {layer} head {h}, {w:.2f}"
                for q, k, label, layer, h, w in doc["kinds"]["encoder_self"]["relations"]]

    shown = page.locator("#relations .rel")

    def texts():  # (the head's colour swatch between ": " and "layer")
        return [" ".join(t.split()) for t in shown.all_inner_texts()]

    assert len(listed(docs[1])) == 12 and texts() == listed(docs[1])
    assert "may not hold for this one" in page.locator("#relations-title").get_attribute("title")
    page.locator("#step").fill("0")
    ready(page, 100)
    assert texts() == listed(docs[0]) != listed(docs[1])
    _, _, _, layer, h, _ = docs[0]["kinds"]["encoder_self"]["relations"][3]
    shown.nth(3).click()
    assert page.locator("#mode").input_value() == "matrix"
    assert page.locator("#layer").input_value() == str(layer)
    assert [d["head"] for d, _ in canvas_pixels(page, "#matrices canvas.cells")] == [str(h)]
    page.locator("#kind").select_option("cross")
    assert page.locator("#relations").is_hidden() and page.locator("#relations-title").is_hidden()
    assert not errors, errors
    page.close()


# ----------------------------------------------------------------------------- TensorBoard
def open_tab(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    frame = "iframe[src*='plugin_entry.html?name=tinymt_attention']"
    page.locator(frame).wait_for(timeout=60_000)
    return page, page.frame_locator(frame), errors


def tab_frame(page):
    return page.frame(url=lambda url: "plugin_entry.html?name=tinymt_attention" in url)


def test_play_trends_link_and_font_in_the_tab(browser, tensorboard):
    """The tiny run logs a frame every 2 steps (trainer.probe_every=2): Play shows them in
    order, and round again after the last; under each head its trend is the plugin's, a
    hover shows the hovered step's values and the strips' scale, and a click on it jumps to
    that step; the page's URL brings the view back; the loaded face is the SC one."""
    steps = json.loads(http_get(f"{tensorboard}/{ROUTE}/steps?run=.&tag=probe_0")[1])["steps"]
    assert len(steps) >= 16, steps
    page, view, errors = open_tab(browser, f"{tensorboard}/#tinymt_attention")
    ready(view, steps[-1])
    # under each head of the overview, its label in the trainer's record of the step shown
    doc = json.loads(http_get(f"{tensorboard}/{ROUTE}/step?run=.&tag=probe_0&step={steps[-1]}")[1])
    assert view.locator(".thumb:not([data-head='-1']) .ov-tag").all_inner_texts() == \
        [label.split(" · ")[0] for row in doc["kinds"]["cross"]["labels"] for label in row]
    frame = tab_frame(page)
    frame.evaluate("""() => { window.__steps = [];
      new MutationObserver(() => window.__steps.push(+document.querySelector('#tinymt-attention').dataset.step))
        .observe(document.querySelector('#tinymt-attention'), {attributes: true, attributeFilter: ['data-step']}); }""")

    def play(frames: int) -> list[int]:  # the steps Play showed, in order (a frame a 0.5 s)
        frame.evaluate("() => { window.__steps = []; }")
        view.locator("#play").click()
        frame.wait_for_function(f"() => window.__steps.length >= {frames}", timeout=60_000)
        view.locator("#play").click()
        return frame.evaluate("() => window.__steps")[:frames]

    assert play(3) == steps[:3]  # at the last step: from the first, one after another
    view.locator("#step").press("End")
    view.locator("#step").press("ArrowLeft")
    ready(view, steps[-2])
    assert play(3) == [steps[-1], steps[0], steps[1]]  # and round again
    # the trend of each head: what /trend says, the current step marked, a click moves there
    trend = json.loads(http_get(f"{tensorboard}/{ROUTE}/trend?run=.&tag=probe_0")[1])
    view.locator("#mode").select_option("matrix")
    view.locator("#kind").select_option("cross")
    view.locator("#layer").select_option("0")
    root = ready(view)
    spark = view.locator("#matrices canvas.spark[data-head='1']")
    spark.wait_for()
    frame.wait_for_function("() => document.querySelector('canvas.spark').dataset.steps > 0")
    want = [f"{s[0][1]:.4f}" for s in trend["kinds"]["cross"]["entropy"]]
    assert spark.get_attribute("data-entropy").split(",") == want
    # the strips' scale, on screen: the largest entropy of the kind over every step
    emax = max(v for s in trend["kinds"]["cross"]["entropy"] if s for row in s for v in row
               if v is not None)
    assert view.locator("#trend-scale").inner_text() == (
        f"strips under each head, steps {steps[0]} to {steps[-1]}: entropy (solid) 0 to "
        f"{emax:.2f} nats, gold share (dashed) 0 to 1")
    box = spark.bounding_box()
    for k in (1, len(steps) - 2):  # a hovered step: its own values, not the current step's
        spark.hover(position={"x": 3 + k * (box["width"] - 6) / (len(steps) - 1),
                              "y": box["height"] / 2})
        info = view.locator("#info")
        assert info.get_attribute("data-trend") == f"0,1,{steps[k]}"
        gold = trend["kinds"]["cross"]["gold"][k][0][1]
        assert f"at step {steps[k]}: entropy {float(want[k]):.2f} nats · gold share " + (
            "–" if gold is None else f"{gold:.2f}") in info.inner_text()
        assert "The strips' scale: entropy (solid) 0 to " in info.inner_text()
    k = 3
    spark.click(position={"x": 3 + k * (box["width"] - 6) / (len(steps) - 1), "y": box["height"] / 2})
    ready(view, steps[k])
    assert spark.get_attribute("data-current") == str(k)
    # the state went into TensorBoard's URL; a new page at that URL shows the same view
    page.wait_for_function(f"() => location.hash.includes('p.tinymt_attention.step={steps[k]}')")
    url = page.url
    assert "p.tinymt_attention.kind=cross" in url and "p.tinymt_attention.view=matrix" in url
    # TensorBoard's dark mode (a class on its page's body) reaches the tab at once
    page.evaluate("document.body.classList.add('dark-mode')")
    view.locator("#tinymt-attention.tmv-dark").wait_for(timeout=5_000)
    for data, pixels in canvas_pixels(view, "#matrices canvas.cells"):
        h = int(data["head"])
        doc = json.loads(http_get(f"{tensorboard}/{ROUTE}/step?run=.&tag=probe_0&step={steps[k]}")[1])
        w = weights_of(doc, "cross")[0, h]
        assert (pixels == expected_pixels(w, view_palette()[h], DARK)).all()
    page.evaluate("document.body.classList.remove('dark-mode')")
    view.locator("#tinymt-attention:not(.tmv-dark)").wait_for(timeout=5_000)
    # the SC face, cut to the shown characters, is what the tab loaded
    frame.wait_for_function("""() => [...document.fonts].some(
        f => f.family.replace(/"/g, '') === 'Noto Sans CJK SC' && f.status === 'loaded')""", timeout=30_000)
    assert not errors, errors
    page.close()
    again, view2, errors2 = open_tab(browser, url)
    root = ready(view2, steps[k])
    assert root.get_attribute("data-view") == "matrix"
    assert view2.locator("#layer").input_value() == "0"
    assert view2.locator("#kind").input_value() == "cross"
    assert not errors2, errors2
    again.close()


def test_first_text_under_a_slow_link(browser, tensorboard):
    """At 20 Mbit/s the tab's text is on screen within 1 s of the tab starting to load: it
    never waits for a font (measured from the tab frame's own start)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 20,
             "downloadThroughput": 20e6 / 8, "uploadThroughput": 20e6 / 8})
    page.goto(f"{tensorboard}/#tinymt_attention")
    page.frame_locator("iframe[src*='plugin_entry.html?name=tinymt_attention']") \
        .locator("#sentence:not(:empty)").wait_for(timeout=120_000)
    frame = tab_frame(page)
    shown = frame.evaluate("() => performance.getEntriesByName('tinymt-first-draw')[0].startTime")
    first = frame.evaluate("""() => (performance.getEntriesByName('first-contentful-paint')[0]
        || {startTime: -1}).startTime""")
    font = frame.evaluate("""() => document.fonts.ready.then(() => performance.now())""")
    print(f"\n20 Mbit/s: the tab's first paint {first:.0f} ms, the first step drawn by "
          f"{shown:.0f} ms, SC font loaded by {font:.0f} ms (from the tab frame's start)")
    assert 0 <= first <= 1000, first
    assert shown <= 1000, shown
    page.close()


def test_no_empty_boxes_while_the_font_is_on_its_way(browser, tensorboard):
    """With no CJK font on the system (CI's Debian Chromium has none) and the font held back,
    the tab's first frame leaves the Chinese sentence blank, not a row of empty boxes; once
    the font arrives, the sentence is drawn."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    held = []
    page.route("**/font.otf*", lambda route: held.append(route))
    page.goto(f"{tensorboard}/#tinymt_attention")
    view = page.frame_locator("iframe[src*='plugin_entry.html?name=tinymt_attention']")
    ready(view)
    sentence = view.locator("#sentence")
    assert sentence.inner_text().startswith("我请李雷") and held

    cdp = page.context.new_cdp_session(page)

    def pixels():  # (Chrome's own capture: Playwright's would wait for the font)
        box = sentence.bounding_box()
        png = cdp.send("Page.captureScreenshot", {"format": "png", "clip": {**box, "scale": 1}})
        return np.asarray(Image.open(io.BytesIO(base64.b64decode(png["data"]))).convert("L"))

    assert pixels().min() == pixels().max()  # nothing drawn, no box either
    page.unroute("**/font.otf*")  # (the requests held go on)
    tab_frame(page).wait_for_function("""() => [...document.fonts].some(f => f.status === 'loaded'
        && f.family.replace(/"/g, '') === 'Noto Sans CJK SC')""", timeout=30_000)
    page.wait_for_timeout(200)  # (the next paint)
    drawn = pixels()
    assert drawn.min() < drawn.max()
    page.close()


# ----------------------------------------------------------------------------- live
def write_probe_run(folder: Path, steps: list[int]) -> None:
    """A run folder's event file of one probe, a small synthetic document a step."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from tinymt.viewer.summary import probe_summary

    folder.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(folder), filename_suffix=f".{steps[0]}")
    for step in steps:
        doc = synthetic_document(layers=1, heads=2, n=6, step=step, seed=step)
        summary = probe_summary("probe_0", doc, doc["sentence"], doc["reference"])
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))
    writer.close()


@pytest.fixture
def live_logdir(tmp_path):
    """A logdir with one run, ``first``, and TensorBoard reading it as a user starts it
    (its default reload from disk every 5 s, its auto-reload off)."""
    logdir = tmp_path / "logdir"
    write_probe_run(logdir / "first", [1, 2])

    def up(base):
        return http_get(f"{base}/{ROUTE}/steps?run=first&tag=probe_0")[0] == 200

    with tensorboard_process(logdir, up) as (base, _):
        yield logdir, base


def test_a_new_run_and_its_new_steps_appear_without_a_click(browser, live_logdir):
    """Nothing clicked: a run written while the tab is open shows within 15 s, and so do
    its new steps (TensorBoard's 5 s from disk, the tab's own look every 5-10 s)."""
    logdir, base = live_logdir
    page, view, errors = open_tab(browser, f"{base}/#tinymt_attention")
    ready(view, 2)
    write_probe_run(logdir / "second", [1, 2])

    def shows_within_15_s(predicate: str) -> None:
        tab_frame(page).wait_for_function(predicate, timeout=15_000)

    shows_within_15_s("() => [...document.querySelectorAll('#run option')].some(o => o.value === 'second')")
    view.locator("#run").select_option("second")
    root = ready(view, 2)
    assert root.get_attribute("data-steps") == "2"
    write_probe_run(logdir / "second", [3, 4, 5])
    shows_within_15_s("() => document.querySelector('#tinymt-attention').dataset.steps === '5'")
    ready(view, 5)  # it was at the last step: it follows to the new last one
    assert view.locator("#step").get_attribute("max") == "4"
    assert view.locator("#step-label").inner_text().startswith("step 5 ")
    assert not errors, errors
    page.close()
