"""The attention view as one self-contained HTML file: no server, nothing fetched.

``translate.py attention=maps.html`` and the tour notebook build it here: ``static/view.js``
inlined as a module script, the view documents as JSON, and Noto Sans CJK SC cut to the
characters the page shows (:func:`tinymt.fonts.sc_subset`) as a ``data:`` URL: Chinese
renders in any browser, and the file stays a few hundred KB.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence

from tinymt.fonts import SC_FAMILY, sc_subset
from tinymt.viewer import STATIC
from tinymt.viewer.document import jsonable

_SEP = "\u0000"  # joins run, tag and step into the inline source's keys (view.js)
# inside an inline <script>, "</script", "<!--" and (old parsers) U+2028/2029 change how
# the page is read: every such character goes in as a JSON escape, which JSON.parse undoes
_SCRIPT_ESCAPES = {ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"}


def inline_data(run: str, docs: Sequence[dict]) -> dict:
    """The object ``inlineSource`` of view.js reads: one run, a probe per document (each
    document's own step)."""
    probes, steps, by_key = [], {}, {}
    for k, doc in enumerate(docs):
        tag = f"probe_{k}"
        probes.append({"tag": tag, "sentence": doc["sentence"], "reference": doc["reference"]})
        steps[f"{run}{_SEP}{tag}"] = [doc["step"]]
        by_key[f"{run}{_SEP}{tag}{_SEP}{doc['step']}"] = jsonable(doc)
    return {"runs": [{"run": run, "probes": probes}], "steps": steps, "docs": by_key}


def html_page(run: str, docs: Sequence[dict], title: str = "tinymt attention") -> str:
    """The whole page: every document of ``docs`` a probe of run ``run``."""
    data_js = json.dumps(inline_data(run, docs), ensure_ascii=False, separators=(",", ":")
                         ).translate(_SCRIPT_ESCAPES)
    font = base64.b64encode(sc_subset(data_js)).decode("ascii")  # the page's characters
    view_js = (STATIC / "view.js").read_text(encoding="utf-8").replace("</script", "<\\/script")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>
@font-face {{ font-family: "{SC_FAMILY}"; src: url(data:font/otf;base64,{font}) format("opentype");
  font-display: block; }}
body {{ margin: 0; }}
</style></head>
<body><div id="tinymt-attention"></div>
<script type="application/json" id="tinymt-data">{data_js}</script>
<script type="module">
{view_js}
mountView(document.getElementById("tinymt-attention"),
          inlineSource(JSON.parse(document.getElementById("tinymt-data").textContent)));
</script>
</body></html>
"""
