"""The files the views are made of: the view's JavaScript (``static/``) and the Noto Sans
CJK font of the ``noto-cjk-sans-jp-regular`` dependency (Chinese renders everywhere)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import noto_cjk_sans_jp_regular

STATIC = Path(__file__).resolve().parent / "static"


def font_path() -> Path:
    return Path(noto_cjk_sans_jp_regular.FONT_PATH)


@cache
def asset_bytes(path: Path) -> bytes:
    """A file the views are made of, read once (the font is 16 MB: not per request)."""
    return path.read_bytes()
