"""The one font code: Noto Sans CJK with **Simplified Chinese** glyph forms, for every view.

The font we ship (``noto-cjk-sans-jp-regular``, :func:`font_path`) holds the glyphs of
every CJK locale; its cmap maps each character to the Japanese form, and its ``GSUB``
``locl`` feature, per language system (``ZHS`` = Simplified Chinese, ...), swaps in the
others (直 骨 今 角 写 ... differ). Browsers apply ``locl`` only when the text's ``lang``
says Chinese, matplotlib not at all, so we build the SC face with fontTools: the cmap with
the ZHS ``locl`` substitutions applied (:func:`sc_cmap`).

:func:`sc_subset` cuts it to a text's characters (the HTML file inlines it, the Attention
tab serves ``font.otf?text=...``); :func:`sc_font_file` is the whole
font, built once into the user's cache folder (matplotlib needs a font *file*). A shared
leaf: it imports no torch (the TensorBoard plugin imports it).
"""

from __future__ import annotations

import atexit
import functools
import io
import logging
import multiprocessing
import multiprocessing.util  # noqa: F401  (its exit handler first: see _EXITING)
import os
import signal
import threading
from collections.abc import Iterable
from pathlib import Path

import noto_cjk_sans_jp_regular
from fontTools import subset
from fontTools.fontBuilder import FontBuilder
from fontTools.ttLib import TTFont

from tinymt.files import write_bytes

logger = logging.getLogger(__name__)

# The Noto CJK fonts are under the SIL OFL 1.1, whose only Reserved Font Name is "Source"
# ("Copyright 2014-2021 Adobe, with Reserved Font Name 'Source'"): a modified version may
# keep "Noto" in its name, so our cut of it may call itself Noto Sans CJK SC.
SC_FAMILY = "Noto Sans CJK SC"
SC_LANGUAGE = "ZHS "  # the OpenType language system of Simplified Chinese
# what every subset holds besides its text: printable ASCII and the view's own marks
ALWAYS = "".join(chr(c) for c in range(32, 127)) + "▁…→←·"
MAX_QUERY_CHARS = 4096  # distinct characters a font.otf?text= request may ask for
FILE_VERSION = 2  # bump when what build_sc_font writes changes: a new cache file name


# ----------------------------------------------------------------------------- the SC cmap
def font_path() -> Path:
    """The source: Noto Sans CJK JP Regular of the ``noto-cjk-sans-jp-regular`` wheel."""
    return Path(noto_cjk_sans_jp_regular.FONT_PATH)


@functools.cache
def sc_cmap() -> dict[int, str]:
    """Code point -> the glyph the ZHS ``locl`` feature selects (the default glyph where
    it selects none), read once per process (0.1 s). Shared: do not change it."""
    font = TTFont(str(font_path()), lazy=True)
    gsub = font["GSUB"].table
    subst = _single_substitutions(gsub, _language_lookups(gsub, SC_LANGUAGE, "locl"))
    return {cp: subst.get(glyph, glyph) for cp, glyph in font.getBestCmap().items()}


def _language_lookups(table, language: str, feature: str) -> list[int]:
    """The lookups of ``feature`` in the ``language`` system (else the default one) of
    every script, in lookup-list order (as shapers apply them); one list for all scripts
    (in Noto CJK each script's ZHS ``locl`` is the same lookups)."""
    records = table.FeatureList.FeatureRecord
    found: set[int] = set()
    for script in table.ScriptList.ScriptRecord:
        langsys = next((r.LangSys for r in script.Script.LangSysRecord
                        if r.LangSysTag == language), script.Script.DefaultLangSys)
        for i in langsys.FeatureIndex:
            if records[i].FeatureTag == feature:
                found.update(records[i].Feature.LookupListIndex)
    return sorted(found)


def _single_substitutions(table, lookups: Iterable[int]) -> dict[str, str]:
    """glyph -> glyph after the single substitutions of ``lookups`` (type 1, or type 7
    wrapping type 1), applied one lookup after the other as a shaper does. Other lookup
    types (contextual, alternates) cannot be a cmap and are left out."""
    result: dict[str, str] = {}
    for index in lookups:
        lookup = table.LookupList.Lookup[index]
        mapping: dict[str, str] = {}
        for sub in lookup.SubTable:
            kind = lookup.LookupType
            if kind == 7:
                kind, sub = sub.ExtensionLookupType, sub.ExtSubTable
            if kind == 1:
                for src, dst in sub.mapping.items():
                    mapping.setdefault(src, dst)  # the first subtable covering a glyph wins
        # what earlier lookups made of a glyph goes on through this one; other glyphs: new
        result = {**mapping, **{glyph: mapping.get(now, now) for glyph, now in result.items()}}
    return result


# ----------------------------------------------------------------------------- subsets
def sc_subset(text: str) -> bytes:
    """Noto Sans CJK SC with only the glyphs of ``text`` (plus :data:`ALWAYS`), each
    character mapped to its Simplified Chinese form, as OpenType (CFF) bytes: 0.4 s and
    20 KB for a sentence's characters (the source is 16 MB; 4,096 Chinese ones: 6 s, 1.3 MB)."""
    sc = sc_cmap()
    codes = {ord(c) for c in text + ALWAYS}
    cmap = {cp: sc[cp] for cp in codes if cp in sc}  # code point -> its SC glyph
    options = subset.Options()
    # fontTools' default features but locl (the cmap is SC already; a span marked zh-Hant
    # or ko would turn SC forms into its own); jp78, jp90, aalt would keep Japanese glyphs
    options.layout_features = [f for f in options.layout_features if f != "locl"]
    options.notdef_outline = True
    options.name_IDs = ["*"]  # keep the copyright, trademark and OFL license records
    font = TTFont(str(font_path()), lazy=True)
    FontBuilder(font=font).setupCharacterMap(cmap)  # the source's own: never read (0.3 s)
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=cmap)
    subsetter.subset(font)
    return _sc_bytes(font)  # the family renamed to SC_FAMILY


class FontBusy(Exception):
    """Other requests' subsets are being cut: try again shortly (a 503)."""


# A 4,096-character subset takes ~6 s of CPU and ~50 MB while it is cut: one at a time, on
# a process of its own (fontTools is pure Python: on a thread it would hold the GIL from
# the server's event loop for seconds), a few requests waiting, the rest refused at once;
# the last 16 answers are kept (~20 MB at most: a page asks for its characters on reload).
_CUTTING, _WAITING = threading.Lock(), threading.BoundedSemaphore(4)
WAIT_S = 10.0  # the longest a request waits for the cut before it
BUSY = "fonts are being cut for other pages; try again shortly"
_pool: list = []  # the cutting process (a pool of one), started when needed
_EXITING = threading.Event()
atexit.register(_EXITING.set)  # runs before multiprocessing.util's, which ends the process


def _start_cutter() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    os.nice(10)  # seconds of CPU a cut: the server's own work goes first


def _cut(chars: str) -> bytes:
    """:func:`sc_subset` on the cutting process (called holding ``_CUTTING``), started
    unless it runs."""
    if _EXITING.is_set():  # a process spawned now would die half-started, with a traceback
        raise FontBusy("the server is stopping")
    if not _pool:  # (spawn: no fork of a threaded server)
        _pool.append(multiprocessing.get_context("spawn").Pool(1, _start_cutter))
    try:
        return _pool[0].apply_async(sc_subset, (chars,)).get(60.0)  # (4,096 characters: ~6 s)
    except multiprocessing.TimeoutError:  # hung, or died: a new process next time
        _pool.pop().terminate()
        raise FontBusy("the font could not be cut; try again") from None


def refuse_when_busy(query: bytes) -> None:
    """:class:`FontBusy` at once for a query longer than 4 KB when every waiting place is
    taken; called before a route parses it (unquoting 4,096 characters' 36 KB costs the
    event loop ~3 ms: refused only after that, a storm of them slowed every other answer
    5-fold). A page's own short text goes on to the cache."""
    if len(query) > 4096:
        if not _WAITING.acquire(blocking=False):
            raise FontBusy(BUSY)
        _WAITING.release()


def font_for_query(text: str | None) -> bytes:
    """The answer to ``font.otf?text=<text>``: :func:`sc_subset` of its distinct
    characters (none: ASCII only). More than :data:`MAX_QUERY_CHARS` distinct characters
    is a ValueError (one line); :class:`FontBusy` when others are being cut and this one
    would wait more than :data:`WAIT_S` or behind too many."""
    chars = "".join(sorted(set(text or "")))
    if len(chars) > MAX_QUERY_CHARS:
        raise ValueError(f"text= holds {len(chars):,} distinct characters; a font is cut "
                         f"to at most {MAX_QUERY_CHARS:,}")
    return _font(chars)


@functools.lru_cache(maxsize=16)
def _font(chars: str) -> bytes:
    if not _WAITING.acquire(blocking=False):
        raise FontBusy(BUSY)
    try:
        if not _CUTTING.acquire(timeout=WAIT_S):
            raise FontBusy(BUSY)
        try:
            return _cut(chars)
        finally:
            _CUTTING.release()
    finally:
        _WAITING.release()


def _sc_bytes(font: TTFont) -> bytes:
    """``font`` (the source's Regular) saved as OpenType, its family renamed to
    :data:`SC_FAMILY` in the name table (IDs 1, 4, 16; 6 the PostScript name, no spaces) and
    in the CFF table's names (which the PostScript name must equal); the copyright,
    trademark and license records kept."""
    ps_name = SC_FAMILY.replace(" ", "") + "-Regular"
    for record in font["name"].names:
        new = {1: SC_FAMILY, 4: SC_FAMILY, 6: ps_name, 16: SC_FAMILY}.get(record.nameID)
        if new is not None:
            record.string = new
    cff = font["CFF "].cff  # (the source is CFF-flavoured OpenType)
    cff.fontNames = [ps_name]
    top = cff.topDictIndex[0]
    top.FamilyName = top.FullName = SC_FAMILY
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()


# ----------------------------------------------------------------------------- a whole file
@functools.cache
def sc_font_file() -> Path | None:
    """The whole source font as Noto Sans CJK SC, as a file (matplotlib's figures, the
    server's ``font.otf`` without ``text=``): built once (2 s, 16 MB) into
    ``$XDG_CACHE_HOME/tinymt/fonts/`` (else ``~/.cache/tinymt/fonts/``), named by the
    source's size, mtime and :data:`FILE_VERSION`, and reused. None (a warning logged) when
    it cannot be had (no home, a folder we may not write): the caller uses the source font
    (Japanese forms); nothing fails for a font."""
    try:
        st = font_path().stat()
        base = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
        name = f"NotoSansCJKsc-Regular-{st.st_size}-{st.st_mtime_ns}-{FILE_VERSION}.otf"
        cached = base / "tinymt" / "fonts" / name
        if not cached.is_file():
            write_bytes(build_sc_font(), cached)
        return cached
    except Exception as e:  # noqa: BLE001  (a font never stops a training run)
        logger.warning("Chinese is drawn with Japanese glyph forms: no SC font (%s: %s)",
                       type(e).__name__, e)
        return None


def build_sc_font() -> bytes:
    """The bytes of :func:`sc_font_file`: the source with the SC cmap (no variation
    sequences: they select Japanese forms), no ``locl`` and the SC family name."""
    font = TTFont(str(font_path()), lazy=True, recalcBBoxes=False, recalcTimestamp=False)
    FontBuilder(font=font).setupCharacterMap(sc_cmap())  # (no variation sequences)
    gsub = font["GSUB"].table
    records = gsub.FeatureList.FeatureRecord
    for script in gsub.ScriptList.ScriptRecord:
        for langsys in [script.Script.DefaultLangSys,
                        *(r.LangSys for r in script.Script.LangSysRecord)]:
            # the feature records stay, used by none
            langsys.FeatureIndex = [i for i in langsys.FeatureIndex
                                    if records[i].FeatureTag != "locl"]
            langsys.FeatureCount = len(langsys.FeatureIndex)
    return _sc_bytes(font)
