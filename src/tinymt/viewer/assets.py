"""The files the views are made of: the view's JavaScript (``static/``). Their font, Noto
Sans CJK SC, comes from :mod:`tinymt.fonts`."""

from __future__ import annotations

from functools import cache
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"


@cache
def asset_bytes(path: Path) -> bytes:
    """A file the views are made of, read once (not per request)."""
    return path.read_bytes()
