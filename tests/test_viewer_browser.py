"""The attention view in a real browser: headless Chromium (Debian's ``chromium``, driven
by Playwright pointed at that executable; no browser download) opens TensorBoard's
Attention tab on the tiny run, the self-contained HTML file of ``translate.py`` and the page
of ``serve.py``, and what is on screen is checked against the numbers they serve.

Without Chromium these tests skip with the reason, except under CI (``CI`` set), where
``.ci/run`` installs it and a missing browser is a failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import (
    canvas_pixels,
    compose_translate,
    expected_pixels,
    http_get,
    inline_data,
    post_json,
    view_palette,
)
from tinymt import KINDS
from tinymt.bench.serve_speed import ServerProcess
from tinymt.checkpoint import load_checkpoint
from tinymt.text import plan
from tinymt.translate import translate

pytestmark = pytest.mark.slow

ROUTE = "data/plugin/tinymt_attention"


def screenshot_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``$TINYMT_SCREENSHOTS`` (to look at them) or tmp_path."""
    return Path(os.environ.get("TINYMT_SCREENSHOTS") or tmp_path)


def assert_cells_are(view, weights: np.ndarray, heads, norm: str = "weight",
                     background=(255, 255, 255)) -> None:
    """The matrices on screen are exactly the served weights of ``heads`` (layer chosen),
    pixel by pixel in each head's colour (conftest.expected_pixels)."""
    drawn = canvas_pixels(view, "#matrices canvas.cells")
    assert [int(d["head"]) for d, _ in drawn] == list(heads)
    for data, pixels in drawn:
        h = int(data["head"])
        want = expected_pixels(weights[h], view_palette()[h], background, norm)
        assert pixels.shape == want.shape
        assert (pixels == want).all(), f"head {h}: {(pixels != want).any(-1).sum()} cells differ"


def wait_ready(view, step: int | None = None) -> None:
    root = view.locator("#tinymt-attention")
    expect = '[data-ready="true"]' + (f'[data-step="{step}"]' if step is not None else "")
    view.locator(f"#tinymt-attention{expect}").wait_for(timeout=60_000)
    return root


def hover_row_checks(view, weights: np.ndarray, heads, row: int) -> None:
    """Hovering a query token lists, for each visible head, that row's values."""
    view.locator(f"text.row-label[data-row='{row}']").first.hover()
    info = view.locator("#info")
    info.locator(".info-head").first.wait_for()
    assert info.get_attribute("data-axis") == "row"
    for h in heads:
        shown = info.locator(f".info-head[data-head='{h}']").get_attribute("data-values")
        np.testing.assert_allclose([float(v) for v in shown.split(",")],
                                   weights[h, row] / 255, atol=6e-4)


def drive(page, view, fetch_doc, steps: list[int], shots: Path, name: str,
          expect_gold: bool = True) -> dict:
    """Pick cross-attention layer 0, check every cell, hover a token, switch a head off,
    move the step slider back and look again; returns what it measured."""
    wait_ready(view, steps[-1])
    render_ms = float(view.locator("#tinymt-attention").get_attribute("data-render-ms"))
    view.locator("#mode").select_option("matrix")
    view.locator("#kind").select_option("cross")
    view.locator("#layer").select_option("0")
    doc = fetch_doc(steps[-1])
    w = np.asarray(doc["kinds"]["cross"]["weights"])[0]  # (heads, T_q, T_k) of layer 0
    heads = list(range(w.shape[0]))
    assert_cells_are(view, w, heads)
    assert view.locator("svg.head-matrix").count() == len(heads)
    for h, e in enumerate(doc["kinds"]["cross"]["entropy"][0]):
        assert f"{e:.2f}" in view.locator(f".entropy[data-head='{h}']").text_content()
    gold = {(i, j) for i, j, _ in doc["kinds"]["cross"]["gold"]}
    drawn = view.locator("rect.gold").evaluate_all(
        "els => els.map(e => [+e.dataset.row, +e.dataset.col])")
    assert {tuple(c) for c in drawn} == gold  # every head outlines the same cells
    assert gold or not expect_gold
    hover_row_checks(view, w, heads, row=min(3, w.shape[1] - 1))
    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    # a head switched off leaves the others
    view.locator(".head-toggle[data-head='0']").click()
    assert_cells_are(view, w, heads[1:])
    view.locator(".head-toggle[data-head='0']").click()
    # the slider back to the first validation: the weights of that step
    if len(steps) > 1:
        view.locator("#step").evaluate(
            "(el) => { el.value = 0; el.dispatchEvent(new Event('input', {bubbles: true}));"
            " el.dispatchEvent(new Event('change', {bubbles: true})); }")
        wait_ready(view, steps[0])
        first = np.asarray(fetch_doc(steps[0])["kinds"]["cross"]["weights"])[0]
        assert_cells_are(view, first, heads)
        assert view.locator("#step-label").inner_text().startswith(f"step {steps[0]} ")
    # the lines view: a line for every weight of at least 2% of a head
    view.locator("#mode").select_option("lines")
    n_lines = view.locator("line.attn-line").count()
    last = first if len(steps) > 1 else w
    assert n_lines == int((last >= 0.02 * 255).sum())
    return {"render_ms": render_ms, "lines": n_lines}


def open_tab(browser, base: str):
    """``(page, the tab's frame, page errors)``: TensorBoard at ``base`` on our tab."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{base}/#tinymt_attention")
    frame = "iframe[src*='plugin_entry.html?name=tinymt_attention']"
    page.locator(frame).wait_for(timeout=60_000)
    return page, page.frame_locator(frame), errors


def test_the_tab_beside_a_hostile_run(browser, hostile_tensorboard, tmp_path):
    """TensorBoard on the good run and a run of forged records (conftest.hostile_records):
    the tab opens on the hostile run and says, in its status line, why a record cannot be
    shown; markup in a record never reaches the page; then, on the good run (the tiny
    run's events), :func:`drive` (every cell, a hover, a head off, the step slider). The tab
    on a run at the logdir's root: test_viewer_overview.py's Play test."""
    base, _ = hostile_tensorboard
    page, view, errors = open_tab(browser, base)
    root = view.locator("#tinymt-attention[data-error]")
    root.wait_for(timeout=60_000)  # the first run, "bad", its first tag
    assert view.locator("#run").input_value() == "bad"
    assert view.locator("#probe").input_value() == "gold_out_of_range"
    for tag in ("gold_out_of_range", "scale_markup", "zlib_bomb", "header_deep"):
        view.locator("#probe").select_option(tag)
        status = view.locator("#status.error", has_text=f"tag '{tag}', step 1")
        status.wait_for(timeout=30_000)
        assert status.inner_text().startswith("error: 422"), status.inner_text()
    view.locator("#probe").select_option("relations_markup")  # a readable record: drawn
    view.locator("#relations .rel").first.wait_for(timeout=30_000)
    assert [" ".join(t.split()) for t in view.locator("#relations .rel").all_inner_texts()] == [
        '<img src=x onerror="window.__pwned=1"> → b object ←: layer 0 head 0, 0.50',
        '{"x":"<img src=x onerror=\\"window.__pwned=1\\">"}', "[1,2]"]
    assert view.locator("img").count() == 0
    tab = page.frame(url=lambda url: "plugin_entry.html?name=tinymt_attention" in url)
    assert tab.evaluate("() => window.__pwned") is None
    # the good run, chosen in the tab
    view.locator("#run").select_option("good")
    steps = json.loads(http_get(f"{base}/{ROUTE}/steps?run=good&tag=probe_0")[1])["steps"]

    def fetch_doc(step):
        return json.loads(http_get(f"{base}/{ROUTE}/step?run=good&tag=probe_0&step={step}")[1])

    measured = drive(page, view, fetch_doc, steps, screenshot_dir(tmp_path), "attention_tab")
    assert "我请李雷帮我订了去北京的机票" in view.locator("#sentence").inner_text()
    print(f"\nthe tab showed one step in {measured['render_ms']:.0f} ms (request to drawn)")
    assert not errors, errors
    page.close()


def test_the_html_file_shows_the_same_numbers(browser, tiny_run, tmp_path):
    target = tmp_path / "maps.html"
    translate(compose_translate(f"run={tiny_run}", f"attention={target}"),
              ["我请李雷帮我订了去北京的机票。"])
    data = inline_data(target.read_text(encoding="utf-8"))
    (key, doc), = data["docs"].items()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(target.as_uri())
    # the tiny model's translation is not the reference: no target-side gold to draw
    drive(page, page, lambda step: doc, [doc["step"]], screenshot_dir(tmp_path), "attention_html",
          expect_gold=False)
    # under each head, the label the trainer measured at the checkpoint's step (best.pt)
    best = load_checkpoint(tiny_run / "checkpoints" / "best.pt")
    labels = best["labels"]
    assert labels.keys() == set(KINDS) and doc["step"] == best["step"]
    page.locator("#mode").select_option("overview")
    for kind in KINDS:
        page.locator("#kind").select_option(kind)
        page.locator(".thumb .ov-tag").first.wait_for()
        tags = page.locator(".thumb").evaluate_all(
            "els => els.filter(e => +e.dataset.head >= 0).map("
            "e => [+e.dataset.layer, +e.dataset.head, e.querySelector('.ov-tag').textContent])")
        assert sorted(tags) == [[layer, h, text.split(" · ")[0]] for layer, row in
                                enumerate(labels[kind]) for h, text in enumerate(row)]
    assert not errors, errors
    page.close()


# ----------------------------------------------------------------------------- serve.py's page
SHOWCASE = "我请李雷帮我订了去北京的机票。"
HOSTILE = ["他说</script><script>window.__pwned=1</script>", '<img src=x onerror="window.__pwned=1">',
           "<!--<script>", "我喜欢\u2028猫。"]
SHOWN = 400  # the view draws the first 400 tokens a side (MAX_TOKENS of view.js)
# the page has drawn the typed lines: its view's probes are these lines and #out has a
# translation for each (an answer to half-typed text does not pass). A function, not an
# expression: Playwright evaluates a bare expression with eval, which the page's CSP forbids.
DRAWN = """([lines, sentences]) => document.querySelector('#tinymt-attention').dataset.ready
  === 'true' && document.querySelectorAll('#out li').length === lines.length
  && JSON.stringify([...document.querySelectorAll('#probe option')].map((o) => o.textContent))
     === JSON.stringify(sentences)"""


@pytest.fixture(scope="module")
def server(tiny_run):
    """``serve.py`` on the tiny run; it must stop cleanly (SIGTERM: exit 0)."""
    srv = ServerProcess([f"run={tiny_run}", "device=cpu"])
    yield srv
    code, err = srv.stop()
    assert code == 0, err


def open_page(browser, server):
    """The server's page once it has read /health, and the list its problems go to: page
    errors and console errors (a Content-Security-Policy violation is one)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.goto(f"{server.base}/")
    page.locator("body[data-ready='true']").wait_for(timeout=30_000)
    return page, problems


def type_lines(page, lines: list[str]) -> None:
    """Type ``lines`` into #q with key events and wait for their translations and view."""
    page.locator("#q").press_sequentially("\n".join(lines))
    page.wait_for_function(DRAWN, arg=[lines, plan(lines, "zh")[0]], timeout=60_000)


def served(server, lines: list[str]) -> tuple[list[str], list[dict]]:
    """What the server answers for ``lines``: /translate's texts, /attention's documents."""
    status, answer = post_json(f"{server.base}/translate",
                               {"q": lines, "source": "zh", "target": "en"})
    assert status == 200, answer
    status, shown = post_json(f"{server.base}/attention", {"q": lines})
    assert status == 200, shown
    assert shown["translatedText"] == answer["translatedText"]
    docs = list(shown["view"]["docs"].values())  # one a probe: the lines' sentences in order
    assert [d["sentence"] for d in docs] == plan(lines, "zh")[0]  # (markup alone: none)
    return answer["translatedText"], docs


def test_the_server_page_shows_every_head(browser, server, tmp_path):
    """Type the showcase sentence: the page shows the server's translation, and every head
    of every layer of every kind is /attention's numbers."""
    page, problems = open_page(browser, server)
    type_lines(page, [SHOWCASE])
    texts, (doc,) = served(server, [SHOWCASE])
    assert page.locator("#out li").all_text_contents() == texts
    assert page.locator("#sentence").text_content() == SHOWCASE
    assert page.locator("#translation").text_content() == texts[0]
    page.locator("#mode").select_option("matrix")
    for kind in ("encoder_self", "decoder_self", "cross"):
        weights = np.asarray(doc["kinds"][kind]["weights"])  # (layers, heads, T_q, T_k)
        page.locator("#kind").select_option(kind)
        assert page.locator("#layer option").count() == weights.shape[0]
        for layer in range(weights.shape[0]):
            page.locator("#layer").select_option(str(layer))
            assert_cells_are(page, weights[layer, :, :SHOWN, :SHOWN], range(weights.shape[1]))
    # the showcase's relations, each with the head of this model that carries it
    page.locator("#kind").select_option("encoder_self")
    assert [" ".join(t.split()) for t in page.locator("#relations .rel").all_inner_texts()] == [
        f"{q} → {k} {label}: layer {layer} head {h}, {w:.2f}"
        for q, k, label, layer, h, w in doc["kinds"]["encoder_self"]["relations"]]
    assert len(doc["kinds"]["encoder_self"]["relations"]) == 12
    page.locator("#kind").select_option("cross")
    page.locator("#layer").select_option("0")
    page.screenshot(path=str(screenshot_dir(tmp_path) / "serve_page.png"), full_page=True)
    assert not problems, problems
    page.close()


def test_a_paragraph_typed_on_the_page_gives_every_sentence_and_its_heads(browser, server):
    """One line of two sentences: one translation, each sentence's own joined by a space
    (as /translate answers), and a probe with its maps for each sentence."""
    page, problems = open_page(browser, server)
    line = "他喜欢猫吗？" + SHOWCASE
    type_lines(page, [line])
    texts, docs = served(server, [line])
    alone, _ = served(server, ["他喜欢猫吗？", SHOWCASE])
    assert page.locator("#out li").all_text_contents() == texts == [" ".join(alone)]
    assert [d["sentence"] for d in docs] == ["他喜欢猫吗？", SHOWCASE]
    assert not problems, problems
    page.close()


def test_the_server_page_shows_hostile_text_as_text(browser, server):
    """Markup typed as sentences (one a line) stays text everywhere the page shows it;
    a line of markup alone comes back as it was, with no maps."""
    page, problems = open_page(browser, server)
    type_lines(page, HOSTILE)
    texts, docs = served(server, HOSTILE)
    assert page.locator("#out li").all_text_contents() == texts
    assert texts[1:3] == HOSTILE[1:3] and len(docs) == 3  # 我喜欢 | 猫。: U+2028 ends a line
    for k, doc in enumerate(docs):
        page.locator("#probe").select_option(f"probe_{k}")
        page.locator("#tinymt-attention[data-ready='true']").wait_for()
        assert page.locator("#sentence").text_content() == doc["sentence"]
        cross = np.asarray(docs[k]["kinds"]["cross"]["weights"])[0, :, :SHOWN, :SHOWN]
        page.locator("#mode").select_option("matrix")
        page.locator("#kind").select_option("cross")
        assert_cells_are(page, cross, range(cross.shape[0]))
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("img, iframe, #tinymt-attention script").count() == 0
    assert not problems, problems
    page.close()


def _contrast(a, b) -> float:
    """WCAG's contrast ratio of two sRGB colours (0-255 each)."""
    def luminance(rgb):
        c = [v / 255 for v in rgb]
        c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_html_file_of_one_translation(browser, tiny_run, tmp_path, scheme):
    """The file of a translation has one frame: no Play, no slider, no hint of trends; it
    opens on cross-attention (the tutorials' picture); the mean of the heads (the colour
    bar's full weight) reads at 4.5:1 or more on the page, light or dark."""
    target = tmp_path / "maps.html"
    translate(compose_translate(f"run={tiny_run}", f"attention={target}"), ["他喜欢猫吗？"])
    page = browser.new_page(viewport={"width": 1400, "height": 900}, color_scheme=scheme)
    page.goto(target.as_uri())
    page.locator("#tinymt-attention[data-ready='true']").wait_for(timeout=60_000)
    assert not page.locator("#play").is_visible() and not page.locator("#step").is_visible()
    assert page.locator("#kind").input_value() == "cross"
    hint = page.locator("#info").inner_text()
    assert "Hover" in hint and "across steps" not in hint
    full = page.evaluate("""() => [...document.querySelector('#colorbar canvas')
        .getContext('2d').getImageData(119, 0, 1, 1).data].slice(0, 3)""")
    background = [255, 255, 255] if scheme == "light" else [32, 33, 36]
    assert _contrast(full, background) >= 4.5, full
    page.close()


def test_the_html_file_shows_hostile_text_as_text(browser, tiny_run, tmp_path):
    """translate.py attention=maps.html on markup: the page was blank when a sentence held
    ``<!--<script>`` (only ``</`` was escaped in its inlined data); every line now shows as
    text, nothing in it runs."""
    target = tmp_path / "maps.html"
    lines = [f"猫{line}" for line in HOSTILE]  # Chinese in each: every line is translated
    translate(compose_translate(f"run={tiny_run}", f"attention={target}"), lines)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(target.as_uri())
    page.locator("#tinymt-attention[data-ready='true']").wait_for(timeout=60_000)
    sentences = plan(lines, "zh")[0]  # a probe a sentence (U+2028 ends a line)
    assert len(sentences) >= len(lines)
    for k, sentence in enumerate(sentences):
        page.locator("#probe").select_option(f"probe_{k}")
        page.locator("#tinymt-attention[data-ready='true']").wait_for()
        assert page.locator("#sentence").text_content() == sentence
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("img, iframe, #tinymt-attention script").count() == 0
    assert not errors, errors
    page.close()
