"""LibreTranslate 1.9's own web page against our server, in Debian's Chromium.

The page is the ``libretranslate`` package's (installed ``--no-deps`` by the Makefile: only
its files are used): its Jinja templates rendered as its Flask app renders them with its
defaults (English, no API keys, no URL prefix), its static files as they are. They are
served on a loopback port of their own, which passes every other path to our server: the
page reaches our API as LibreTranslate's page reaches its own, on its own origin.
"""

from __future__ import annotations

import html as html_lib
import importlib.util
import json
import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import post_json
from tinymt.bench.serve_speed import ServerProcess

SPEC = importlib.util.find_spec("libretranslate")  # (not imported: its deps are not here)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    SPEC is None, reason="the libretranslate package is not installed (make install does it)")]
PARAGRAPH = "他喜欢猫吗？我请李雷帮我订了去北京的机票。"


def rendered(root: Path) -> dict[str, bytes]:
    """The page and its app.js as LibreTranslate 1.9 renders them by default."""
    import jinja2
    import markupsafe

    def gettext(text, **kw):
        return text % kw if kw else text

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(root / "templates"),
                             autoescape=jinja2.select_autoescape(["html"]))  # as Flask's
    env.globals.update(_=gettext, _h=lambda text, **kw: markupsafe.Markup(gettext(text, **kw)),
                       _e=lambda text, **kw: json.dumps(gettext(text, **kw)),
                       url_for=lambda endpoint, filename="": f"/static/{filename}"
                       if endpoint == "static" else "/")
    page = env.get_template("index.html").render(
        frontendTimeout=500, api_keys=False, get_api_key_link="", web_version=False,
        version="1.9.6", swagger_url="/docs", available_locales=[{"code": "en", "name": "English"}],
        current_locale="en", alternate_locales=[], under_attack=False, hide_api=False,
        frontend_title="")
    app = env.get_template("app.js.template").render(
        url_prefix="", get_api_key_link="", api_secret="", bogus_api_secret="", under_attack=False)
    return {"/": page.encode(), "/js/app.js": app.encode()}


@pytest.fixture(scope="module")
def lt_page(tiny_run):
    """(our server at beam 4, the base URL of LibreTranslate's page in front of it)."""
    root = Path(SPEC.submodule_search_locations[0])
    files, server = rendered(root), ServerProcess([f"run={tiny_run}", "device=cpu",
                                                   "decode.beam=4"])

    class Front(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            if path in files or path.startswith("/static/"):
                body = files.get(path) or (root / path.lstrip("/")).read_bytes()
                kind = ("text/html" if path == "/" else "application/javascript"
                        if path.endswith(".js") else "text/css" if path.endswith(".css")
                        else "application/octet-stream")
                return self.answer(200, body, kind)
            self.forward()

        def do_POST(self):
            self.forward()

        def forward(self):  # everything else is our server's
            size = int(self.headers.get("Content-Length") or 0)
            req = urllib.request.Request(server.base + self.path, method=self.command,
                                         data=self.rfile.read(size) if size else None,
                                         headers={"Content-Type": self.headers.get(
                                             "Content-Type", "application/json")})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    self.answer(r.status, r.read(), r.headers["Content-Type"])
            except urllib.error.HTTPError as e:
                self.answer(e.code, e.read(), e.headers["Content-Type"])

        def answer(self, status, body, kind):
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    front = ThreadingHTTPServer(("127.0.0.1", 0), Front)
    threading.Thread(target=front.serve_forever, daemon=True).start()
    yield server, f"http://127.0.0.1:{front.server_address[1]}"
    front.shutdown()
    assert server.stop()[0] == 0


def open_page(browser, base: str):
    """LibreTranslate's page, Chinese into English chosen; and the list its problems go to."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
    page.goto(base + "/")
    source = page.locator("select[aria-labelledby='sourceLangLabel']")
    target = page.locator("select[aria-labelledby='targetLangLabel']")
    page.wait_for_function("() => document.querySelectorAll("
                           "'select[aria-labelledby=sourceLangLabel] option').length >= 3",
                           timeout=30_000)
    names = [n.strip() for n in source.locator("option").all_text_contents()]
    assert {"Chinese", "English"} <= set(names), names  # (and its own "Auto Detect")
    source.select_option(label="Chinese")
    target.select_option(label="English")
    return page, problems


def test_libretranslate_s_page_translates_a_paragraph_with_alternatives(browser, lt_page):
    """The page loads our two languages, translates a typed two-sentence paragraph (what
    /translate answers for it: each sentence's translation), shows the answer with the
    beam's three alternatives (it always asks for 3), and no console error or failed
    request appears."""
    server, base = lt_page
    page, problems = open_page(browser, base)
    page.locator("#textarea1").fill(PARAGRAPH)
    status, answer = post_json(f"{server.base}/translate", {
        "q": PARAGRAPH, "source": "zh", "target": "en", "alternatives": 3})
    assert status == 200 and answer["alternatives"], answer
    page.wait_for_function("(text) => document.querySelector('#textarea2').value === text",
                           arg=answer["translatedText"], timeout=60_000)
    # the page shows the answer's JSON under "Response": the alternatives of the beam
    shown = json.loads(page.locator("pre.code code").last.inner_text())
    assert shown["alternatives"] == answer["alternatives"] and len(answer["alternatives"]) == 3
    assert not problems, problems
    page.close()


INLINE = ["<p>我喜欢<b>猫</b>。</p>",  # bold
          '<p><a href="https://example.org/猫">那只小猫</a>昨天在公园里追了一只蝴蝶。</p>',  # a link
          "<p>我请<b>李雷</b>帮我订了<i>去<b>北京</b>的机票</i>。</p>",  # nested
          "<p>他喜欢<b>猫吗？他</b>喜欢狗。</p>"]  # a tag across a sentence end


def test_inline_markup_is_translated_with_its_sentence(browser, lt_page):
    """Markup typed into the page goes as format=html (the page sees the tags): the answer
    the page shows is /translate's, its text is the plain text's translation (the sentences
    whole, the inline elements in them), and every tag comes back."""
    server, base = lt_page
    page, problems = open_page(browser, base)
    for markup in INLINE:
        plain = re.sub("<[^>]+>", "", markup)
        texts = {}
        for q, fmt in ((markup, "html"), (plain, "text")):
            status, answer = post_json(f"{server.base}/translate", {
                "q": q, "source": "zh", "target": "en", "format": fmt})
            assert status == 200, answer
            texts[fmt] = answer["translatedText"]
        html = texts["html"]
        assert html_lib.unescape(re.sub("<[^>]+>", "", html)) == texts["text"], markup
        assert sorted(re.findall("<[^>]+>", html)) == sorted(re.findall("<[^>]+>", markup))
        page.locator("#textarea1").fill(markup)
        page.wait_for_function("(text) => document.querySelector('#textarea2').value === text",
                               arg=html, timeout=60_000)
    assert not problems, problems
    page.close()
