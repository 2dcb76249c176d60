"""Simplified Chinese glyph forms everywhere (tinymt.fonts).

The reference is HarfBuzz inside Chromium: the original pan-CJK font under
``lang="zh-Hans"`` (Chromium applies its ``locl`` ZHS feature) must draw exactly the pixels
our SC face draws with no Chinese ``lang`` at all, and other pixels than the original
under ``lang="ja"``. Then each home of the font: the HTML file's ``@font-face``, the
Attention tab's ``font.otf?text=``, the server's whole font, matplotlib's font file.

The Chromium tests (conftest's ``browser``) skip without Debian's ``chromium``, except
under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import io
import types

import numpy as np
import pytest
from fontTools import subset
from fontTools.pens.recordingPen import RecordingPen
from fontTools.ttLib import TTFont
from matplotlib import font_manager
from matplotlib.font_manager import FontProperties
from PIL import Image

from conftest import small_document
from tinymt import fonts
from tinymt.fonts import font_path

# characters whose Simplified Chinese form differs from the Japanese one (the tests check
# that they do), and some whose forms are the same
DIFFERING = "直骨今角写次海画"
SAME = "我猫大中"


@pytest.fixture
def font_cache(tmp_path, monkeypatch):
    """``$XDG_CACHE_HOME`` in tmp_path, :func:`fonts.sc_font_file` forgotten before and
    after (it is cached per process)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fonts.sc_font_file.cache_clear()
    yield tmp_path / "cache" / "tinymt" / "fonts"
    fonts.sc_font_file.cache_clear()


def reference_subset(text: str) -> bytes:
    """The original font cut to ``text`` with every layout feature and language system
    kept: what a browser shapes with HarfBuzz, ``locl`` included."""
    options = subset.Options()
    options.layout_features = ["*"]
    options.notdef_outline = True
    font = TTFont(str(font_path()), lazy=True)
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=text)
    subsetter.subset(font)
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()


def zhs_glyph(font: TTFont, ch: str) -> str:
    """The glyph of ``ch`` after the ``locl`` lookups of the ``hani`` script's ZHS
    language system (single substitutions, extension-wrapped or not), read from ``font``
    here, not through tinymt.fonts."""
    gsub = font["GSUB"].table
    records = gsub.FeatureList.FeatureRecord
    script = next(s.Script for s in gsub.ScriptList.ScriptRecord if s.ScriptTag == "hani")
    langsys = next(r.LangSys for r in script.LangSysRecord if r.LangSysTag == "ZHS ")
    lookups = sorted({i for f in langsys.FeatureIndex if records[f].FeatureTag == "locl"
                      for i in records[f].Feature.LookupListIndex})
    glyph = font.getBestCmap()[ord(ch)]
    for i in lookups:
        lookup = gsub.LookupList.Lookup[i]
        for sub in lookup.SubTable:
            sub = sub.ExtSubTable if lookup.LookupType == 7 else sub
            if glyph in getattr(sub, "mapping", {}):
                glyph = sub.mapping[glyph]
                break
    return glyph


def outline(font: TTFont, glyph: str) -> list:
    pen = RecordingPen()
    font.getGlyphSet()[glyph].draw(pen)
    return pen.value


def family(font: TTFont) -> tuple[str, str, str]:
    """Name IDs 1, 4 and 6 (family, full name, PostScript name)."""
    return tuple(font["name"].getDebugName(i) for i in (1, 4, 6))


# ----------------------------------------------------------------------------- the forms
@pytest.mark.slow
def test_our_face_draws_what_chromium_draws_for_zh_hans(browser, tmp_path):
    text = DIFFERING + SAME
    faces = {"Reference": reference_subset(text), "Ours": fonts.sc_subset(text)}
    css = "".join(
        f'@font-face {{ font-family: "{name}"; src: url(data:font/otf;base64,'
        f'{base64.b64encode(data).decode()}) format("opentype"); }}\n'
        for name, data in faces.items())
    cases = {"zh": ("Reference", ' lang="zh-Hans"'), "ja": ("Reference", ' lang="ja"'),
             "ours": ("Ours", ""), "ours-ja": ("Ours", ' lang="ja"'),
             "ours-hant": ("Ours", ' lang="zh-Hant"')}
    spans = "".join(f'<span id="{case}-{k}" style="font-family: {face}"{lang}>{ch}</span>'
                    for case, (face, lang) in cases.items() for k, ch in enumerate(text))
    page_html = f"""<!DOCTYPE html><html><head><meta charset="utf-8"><style>{css}
span {{ display: inline-block; width: 80px; height: 80px; font-size: 64px; line-height: 80px;
       text-align: center; color: #000; background: #fff; }}</style></head>
<body>{spans}</body></html>"""
    target = tmp_path / "forms.html"
    target.write_text(page_html, encoding="utf-8")
    page = browser.new_page(viewport={"width": 80 * len(text), "height": 80 * len(cases)})
    page.goto(target.as_uri())
    loaded = page.evaluate("""async () => { await document.fonts.ready;
        return [...document.fonts].map((f) => [f.family.replace(/"/g, ""), f.status]); }""")
    assert sorted(loaded) == [["Ours", "loaded"], ["Reference", "loaded"]]

    # one screenshot of the page, each span's own box cut from it (a screenshot a span: 7 s)
    shot = np.asarray(Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("L"))
    boxes = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('span')]
        .map((s) => { const r = s.getBoundingClientRect(); return [s.id, [r.x, r.y]]; }))""")
    assert all(x == int(x) and y == int(y) for x, y in boxes.values()), boxes  # whole pixels

    def pixels(case: str, k: int) -> np.ndarray:
        x, y = (int(v) for v in boxes[f"{case}-{k}"])
        return shot[y:y + 80, x:x + 80]

    for k, ch in enumerate(text):
        zh = pixels("zh", k)
        assert (zh < 128).sum() > 100, f"{ch}: nothing drawn"
        for case in ("ours", "ours-ja", "ours-hant"):
            assert np.array_equal(pixels(case, k), zh), f"{ch} ({case}) is not the zh-Hans form"
        differs = not np.array_equal(pixels("ja", k), zh)
        assert differs == (ch in DIFFERING), f"{ch}: the ja and zh-Hans forms " + (
            "are the same" if ch in DIFFERING else "differ")
    page.close()


def test_the_sc_cmap_is_the_zhs_locl_of_the_source():
    source = TTFont(str(font_path()), lazy=True)
    default = source.getBestCmap()
    cmap = fonts.sc_cmap()
    assert cmap.keys() == default.keys()
    for ch in DIFFERING:
        assert cmap[ord(ch)] == zhs_glyph(source, ch) != default[ord(ch)], ch
    for ch in SAME + "Aa1。":
        assert cmap[ord(ch)] == zhs_glyph(source, ch), ch
    # thousands of characters differ, and most stay as they are
    differing = sum(g != default[cp] for cp, g in cmap.items())
    assert 1000 < differing < len(cmap) / 2


def test_a_subset_has_its_text_ascii_the_sc_name_and_the_license():
    font = TTFont(io.BytesIO(fonts.sc_subset("直骨我𠮷")))  # 𠮷: beyond the BMP
    cmap = font.getBestCmap()
    source = TTFont(str(font_path()), lazy=True)
    assert set(map(ord, "直骨我𠮷" + fonts.ALWAYS)) == cmap.keys()
    for ch in "直骨":
        assert outline(font, cmap[ord(ch)]) == outline(source, zhs_glyph(source, ch)), ch
    assert family(font) == ("Noto Sans CJK SC", "Noto Sans CJK SC", "NotoSansCJKSC-Regular")
    assert font["CFF "].cff.fontNames == ["NotoSansCJKSC-Regular"]
    assert "Adobe" in font["name"].getDebugName(0)  # copyright
    assert "Open Font License" in font["name"].getDebugName(13)  # the license, its URL
    assert font["name"].getDebugName(14).startswith("http")
    features = {r.FeatureTag for r in font["GSUB"].table.FeatureList.FeatureRecord}
    assert "locl" not in features and "vert" in features


# ----------------------------------------------------------------------------- the homes
@pytest.mark.slow
def test_the_html_file_loads_its_sc_face(browser, tmp_path):
    from tinymt.viewer.html import html_page

    page_html = html_page("run", [small_document()])
    assert '@font-face { font-family: "Noto Sans CJK SC"; src: url(data:font/otf;base64,' in page_html
    assert "font-display: block" in page_html  # Chinese blank until the face is read, never boxes
    target = tmp_path / "maps.html"
    target.write_text(page_html, encoding="utf-8")
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(target.as_uri())
    page.locator("#tinymt-attention[data-ready='true']").wait_for(timeout=60_000)
    faces = page.evaluate("""async () => { await document.fonts.ready;
        return [...document.fonts].map((f) => [f.family.replace(/"/g, ""), f.status]); }""")
    assert faces == [["Noto Sans CJK SC", "loaded"]]  # loaded: the view draws with it
    assert page.evaluate("() => document.fonts.check('16px \"Noto Sans CJK SC\"', '猫')")
    assert not errors, errors
    page.close()


@pytest.mark.slow
def test_the_attention_tab_serves_sc_subsets(monkeypatch):
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from tinymt.viewer.plugin import AttentionPlugin

    tab = AttentionPlugin(base_plugin.TBContext(data_provider=None))
    client = Client(tab.get_plugin_apps()["/font.otf"])
    text = "我请李雷帮我订了去北京的机票直骨"
    real, cuts = fonts._cut, []  # cut on the cutting process, once
    monkeypatch.setattr(fonts, "_cut", lambda *a: cuts.append(a) or real(*a))
    fonts._font.cache_clear()
    for _ in range(2):  # the second from the cache
        resp = client.get("/font.otf", query_string={"text": text + text})
        assert resp.status_code == 200 and resp.headers["Content-Type"] == "font/otf"
        assert "max-age=86400" in resp.headers["Cache-Control"]
        font = TTFont(io.BytesIO(resp.data))
        assert set(map(ord, text + fonts.ALWAYS)) <= font.getBestCmap().keys()
        assert family(font)[0] == "Noto Sans CJK SC"
    assert len(cuts) == 1  # the second from the cache
    source = TTFont(str(font_path()), lazy=True)
    assert outline(font, font.getBestCmap()[ord("直")]) == outline(source, zhs_glyph(source, "直"))
    for query in ({}, {"text": ""}):  # no text: ASCII (and the view's marks) only
        resp = client.get("/font.otf", query_string=query)
        assert resp.status_code == 200
        assert set(TTFont(io.BytesIO(resp.data)).getBestCmap()) == set(map(ord, fonts.ALWAYS))
    many = "".join(chr(0x4E00 + i) for i in range(4097))
    cut = []  # 4,096 distinct characters are cut (not here: that takes 8 s)
    monkeypatch.setattr(fonts, "_cut", lambda chars: cut.append(chars) or b"OTTO")
    assert client.get("/font.otf", query_string={"text": many[:-1] * 2}).status_code == 200
    assert cut == [many[:-1]]
    resp = client.get("/font.otf", query_string={"text": many})
    assert resp.status_code == 400
    assert resp.get_data(as_text=True) == ("text= holds 4,097 distinct characters; a font is "
                                           "cut to at most 4,096")
    fonts._font.cache_clear()  # (it keeps the stand-in's answer)


def test_fonts_are_cut_one_at_a_time_a_few_waiting_the_cache_bounded(monkeypatch):
    """However many clients ask at once: one subset cut at a time, at most four requests
    inside (the rest refused at once, FontBusy: the servers' 503), a kept answer served
    while a cut is under way, and at most 16 answers kept; a long query refused before
    it is parsed when the places are taken."""
    import threading
    import time

    started, release, cutting, cuts = threading.Event(), threading.Event(), [], []

    def slow_cut(chars):  # stands in for a 6 s cut of 4,096 characters
        cutting.append(chars)
        assert len(cutting) == 1, "two subsets cut at once"
        cuts.append(chars)
        started.set()
        release.wait(10)
        cutting.remove(chars)
        return chars.encode() * 100

    monkeypatch.setattr(fonts, "_cut", slow_cut)
    fonts._font.cache_clear()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        first = pool.submit(fonts.font_for_query, "a")
        started.wait(10)
        rest = [pool.submit(fonts.font_for_query, c) for c in "bcdefghijkl"]
        time.sleep(0.3)  # the refusals are immediate; the waiters wait
        refused = [f for f in rest if f.done()]
        assert len(refused) == len(rest) - 3  # "a" being cut + 3 waiting = 4 slots
        assert all(isinstance(f.exception(), fonts.FontBusy) for f in refused)
        with pytest.raises(fonts.FontBusy):  # a long query: refused before it is parsed
            fonts.refuse_when_busy(b"x" * 4097)
        fonts.refuse_when_busy(b"x" * 4096)  # a page's own text: on to the cache
        release.set()
        assert first.result() == b"a" * 100
        waited = [f for f in rest if f not in refused]
        assert all(f.result(10) == f.result()[:1] * 100 for f in waited)
    monkeypatch.setattr(fonts, "WAIT_S", 0.05)
    with fonts._CUTTING:  # a cut under way: a kept answer at once, a new one waits WAIT_S
        assert fonts.font_for_query("a") == b"a" * 100
        with pytest.raises(fonts.FontBusy):
            fonts.font_for_query("z")
    for _ in range(5):  # the places free again: the check keeps none of them
        fonts.refuse_when_busy(b"x" * 4097)
    for k in range(40):
        fonts.font_for_query(f"x{k}")
    assert fonts._font.cache_info().currsize == 16
    done = len(cuts)
    fonts.font_for_query("x39")  # kept: not cut again
    assert len(cuts) == done
    fonts._font.cache_clear()


def asgi_get(app, path: str, query: str = "") -> tuple[int, dict, bytes]:
    """GET ``path?query`` from an ASGI app (no server, no httpx), in a thread of its own
    (Playwright's loop may be running in this one)."""
    async def go():
        sent, done, asked = [], asyncio.Event(), []

        async def receive():  # the request, then (once answered) the client leaves
            if not asked:
                asked.append(True)
                return {"type": "http.request", "body": b"", "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": query.encode(), "root_path": "", "headers": [],
                 "client": ("127.0.0.1", 1), "server": ("test", 80)}
        await app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], headers, body
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


@pytest.mark.slow
def test_the_server_serves_the_same_fonts(font_cache):
    from urllib.parse import quote

    from tinymt.serve.app import create_app

    app = create_app(types.SimpleNamespace(keys=None))  # the font route uses no model
    # the whole font, as SC (the page asks for it so; a query changes nothing)
    status, headers, body = asgi_get(app, "/font.otf", "text=" + quote("直骨今"))
    assert status == 200 and headers["content-type"] == "font/otf"
    assert headers["cache-control"] == "public, max-age=86400"
    assert body == fonts.sc_font_file().read_bytes()
    font = TTFont(io.BytesIO(body), lazy=True)
    assert family(font)[0] == "Noto Sans CJK SC"
    assert len(font.getBestCmap()) == len(fonts.sc_cmap())


# ----------------------------------------------------------------------------- matplotlib
@pytest.mark.slow
def test_matplotlib_draws_with_the_sc_file_built_once(font_cache, monkeypatch):
    from tinymt.plotting import cjk_font_name

    # the file matplotlib draws the grids with (built by whichever test came first)
    registered = font_manager.findfont(FontProperties(family=cjk_font_name()),
                                       fallback_to_default=False)
    source = TTFont(str(font_path()), lazy=True)
    for path in (registered, fonts.sc_font_file()):
        font = TTFont(path, lazy=True)
        assert family(font) == ("Noto Sans CJK SC", "Noto Sans CJK SC", "NotoSansCJKSC-Regular")
        cmap = font.getBestCmap()
        for ch in DIFFERING:
            sc = outline(font, cmap[ord(ch)])
            assert sc == outline(source, zhs_glyph(source, ch)), ch
            assert sc != outline(source, source.getBestCmap()[ord(ch)]), ch
        for ch in SAME:
            assert outline(font, cmap[ord(ch)]) == outline(source, source.getBestCmap()[ord(ch)])

    # built in the cache folder, then reused: no second build, the file untouched
    built = fonts.sc_font_file()
    assert built.parent == font_cache and built.name.startswith("NotoSansCJKsc-Regular-")
    mtime = built.stat().st_mtime_ns
    fonts.sc_font_file.cache_clear()

    def no_build():
        raise AssertionError("built again")
    monkeypatch.setattr(fonts, "build_sc_font", no_build)
    assert fonts.sc_font_file() == built and built.stat().st_mtime_ns == mtime
    assert [p.name for p in font_cache.iterdir()] == [built.name]  # no temp files left


def test_an_unwritable_cache_folder_means_the_source_font_and_a_warning(font_cache, monkeypatch,
                                                                       caplog):
    """No SC file to be had (the cache folder cannot be written, or the build fails): None
    and a warning, never an exception (the callers draw with the source font)."""
    blocker = font_cache.parent.parent.parent / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(fonts, "build_sc_font", lambda: fonts.sc_subset(""))  # quicker
    assert fonts.sc_font_file() is None
    assert "Japanese glyph forms" in caplog.text and "not-a-folder" in caplog.text
    assert blocker.read_text() == "a file where the cache folder would be"
    caplog.clear()
    fonts.sc_font_file.cache_clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(font_cache.parent))
    monkeypatch.setattr(fonts, "build_sc_font", lambda: 1 / 0)
    assert fonts.sc_font_file() is None
    assert "Japanese glyph forms" in caplog.text and "ZeroDivisionError" in caplog.text
