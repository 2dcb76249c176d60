"""LibreTranslate's API, as this server speaks it: reading a request's fields (JSON, a form,
or the query string; the body capped), checking them against the limits, and the answer's
shape (docs/serve.md's table). No model here: :mod:`tinymt.serve.app` routes, this module
reads and writes. Errors: ``{"error": "..."}`` with 400 (bad request), 403 (API key), 413
(body too large), 429 (queue full), 500, 503 (timed out, shutting down).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.requests import Request

MAX_ALTERNATIVES = 3  # LibreTranslate's own cap
MAX_SENTENCES = 1024  # a request's, all its items together, as the text is cut
ALIASES = {"zh-hans": "zh", "zh-hant": "zh", "zh-cn": "zh", "zh-tw": "zh"}  # LibreTranslate's codes
MAX_FIELDS = 16  # form fields read besides the items of a q repeated (a list, in a form)
LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish",
    "fr": "French", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese", "cmn": "Chinese (Mandarin)",
    "zh-Hans": "Chinese (Simplified)", "zh-Hant": "Chinese (Traditional)",  # LibreTranslate's
}


class ApiError(Exception):
    """A request answered with ``{"error": message}`` and ``status``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Pair:
    """The one language pair a model translates."""

    source: str
    target: str

    def languages(self) -> list[dict]:
        """``GET /languages``: each language with the codes it translates into, and each
        variant LibreTranslate names that is read as one of them (``zh-Hans``: clients that
        check a code against this list before sending it accept it)."""
        def codes(code: str) -> list[str]:
            return [code, *(v for v in LANGUAGE_NAMES if ALIASES.get(v.lower()) == code)]
        return [{"code": c, "name": LANGUAGE_NAMES.get(c, c), "targets": targets}
                for code, targets in ((self.source, codes(self.target)), (self.target, []))
                for c in codes(code)]

    def check(self, source: str, target: str) -> bool:
        """Whether ``source`` -> ``target`` is this pair (``source`` may be ``auto``);
        True means the source was ``auto``."""
        src, tgt = (ALIASES.get(c.strip().lower(), c.strip().lower()) for c in (source, target))
        if (src in ("auto", self.source.lower())) and tgt == self.target.lower():
            return src == "auto"
        source, target = (" ".join(c.split())[:40] for c in (source, target))  # (echoed)
        raise ApiError(400, f"{source}→{target} is not a language pair this server "
                            f"translates: it translates {self.source}→{self.target}")


@dataclass(frozen=True)
class TranslateRequest:
    items: list[str]
    single: bool  # q was a string (the answer holds strings, not lists)
    auto: bool  # source=auto
    alternatives: int  # asked for (the answer holds what the search has, maybe none)
    html: bool = False  # format=html: the text between the markup is translated


# ----------------------------------------------------------------------------- reading
async def read_fields(request: Request, limits, keys: frozenset[str] | None) -> dict:
    """The request's fields: the query string, then a JSON object, a urlencoded or a
    multipart form body on top. The body is read up to ``limits.max_body_bytes`` (413
    beyond; ``limits``: the server's config, :class:`tinymt.config.ServeConfig`); anything
    unreadable is one 400. Then the API key is checked (``keys``)."""
    too_large = ApiError(413, f"Invalid request: the body is over {limits.max_body_bytes:,} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdecimal() and int(declared) > limits.max_body_bytes:
        raise too_large
    most, query = MAX_FIELDS + limits.max_items, request.query_params.multi_items()
    if len(query) > most:
        raise ApiError(400, f"Invalid request: the query string has over {most} fields")
    fields = _fields(query)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body_bytes:
            raise too_large
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower() if body else ""
    if kind == "application/json":
        try:
            value = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ApiError(400, "Invalid request: the body is not valid JSON in UTF-8") from None
        if not isinstance(value, dict):
            raise ApiError(400, "Invalid request: the JSON body must be an object, "
                                'e.g. {"q": "...", "source": "zh", "target": "en"}')
        fields.update(value)
    elif kind == "application/x-www-form-urlencoded":
        try:
            fields.update(_fields(parse_qsl(body.decode("utf-8"), keep_blank_values=True,
                                            max_num_fields=most, errors="strict")))
        except (UnicodeDecodeError, ValueError):
            raise ApiError(400, "Invalid request: the form is not valid UTF-8 or has too many "
                                f"fields (at most {most})") from None
    elif kind == "multipart/form-data":
        request._body = bytes(body)  # starlette's form parser reads the body kept here
        try:
            form = await request.form(max_files=0, max_fields=most)
        except Exception as e:  # noqa: BLE001  (python-multipart's and starlette's errors)
            raise ApiError(400, f"Invalid request: the form cannot be read ({e})") from None
        fields.update(_fields((k, v) for k, v in form.multi_items() if isinstance(v, str)))
    elif body:
        raise ApiError(400, "Invalid request: send JSON (Content-Type: application/json) or a "
                            "form (application/x-www-form-urlencoded or multipart/form-data)")
    check_key(fields, keys)
    return fields


def _fields(pairs) -> dict:
    """A form's (or query string's) fields; ``q`` given more than once is the list of its
    values, in order (LibreTranslate's clients send a list so)."""
    out, qs = {}, []
    for key, value in pairs:
        out[key] = value
        qs += [value] if key == "q" else []
    return {**out, "q": qs} if len(qs) > 1 else out


# ----------------------------------------------------------------------------- checking
def check_key(fields: Mapping, keys: frozenset[str] | None) -> None:
    """403 unless keys are off or ``api_key`` is one of them (compared in constant time)."""
    if keys is None:
        return
    given = fields.get("api_key")
    if not isinstance(given, str) or not given:
        raise ApiError(403, "Please contact the server operator to get an API key")
    if not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        raise ApiError(403, "Invalid API key")


def text_items(fields: Mapping, limits, max_items: int | None = None) -> tuple[list[str], bool]:
    """``(q as a list of strings, whether q was one string)``, checked against the limits."""
    q = fields.get("q")
    max_items = limits.max_items if max_items is None else max_items
    if q is None or q == "" or q == []:
        raise ApiError(400, "Invalid request: missing q parameter")
    single = isinstance(q, str)
    items = [q] if single else q
    if not isinstance(items, list) or not all(isinstance(t, str) for t in items):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    if len(items) > max_items:
        raise ApiError(400, f"Invalid request: q has {len(items):,} items; at most {max_items:,}"
                            " a request")
    for n, text in enumerate(items, 1):
        if len(text) > limits.max_chars:
            which = "q" if single else f"q item {n}"
            raise ApiError(400, f"Invalid request: {which} has {len(text):,} characters; at "
                                f"most {limits.max_chars:,}")
        if "\x00" in text or re.search("[\ud800-\udfff]", text):  # JSON may say "\\ud800"
            raise ApiError(400, "Invalid request: q holds a NUL character or half of a "
                                "surrogate pair: not text")
    return items, single


def translate_request(fields: Mapping, limits, pair: Pair) -> TranslateRequest:
    """``POST /translate``'s fields, checked."""
    items, single = text_items(fields, limits)
    for name in ("source", "target"):
        if not isinstance(fields.get(name), str) or not fields[name].strip():
            raise ApiError(400, f"Invalid request: missing {name} parameter")
    auto = pair.check(fields["source"], fields["target"])
    fmt = fields.get("format") or "text"  # empty or null: text, as LibreTranslate reads it
    if fmt not in ("text", "html"):
        raise ApiError(400, f"{str(fmt)[:40]} format is not supported")  # LibreTranslate's
    alternatives = fields.get("alternatives", 0)
    if isinstance(alternatives, str):
        with contextlib.suppress(ValueError):  # read as LibreTranslate reads it: int()
            alternatives = int(alternatives)
    if type(alternatives) is not int or not 0 <= alternatives <= MAX_ALTERNATIVES:  # no bool
        raise ApiError(400, "Invalid request: alternatives must be an integer from 0 to "
                            f"{MAX_ALTERNATIVES}")
    return TranslateRequest(items, single, auto, alternatives, fmt == "html")


# ----------------------------------------------------------------------------- answers
def distinct(hyps: list[str]) -> list[str]:
    """An n-best list (best first) without the empty or repeated hypotheses after the best."""
    return [h for i, h in enumerate(hyps) if not i or h.strip() and h not in hyps[:i]]


def translate_answer(req: TranslateRequest, nbests: list[list[str]],
                     detected: list[dict] | None = None, kept: int = 0,
                     doubts: list[bool] = ()) -> dict:
    """LibreTranslate's answer: each item's best translation, its alternatives when asked
    for (the next best of the n-best, none empty or twice: what it has, no error, as
    LibreTranslate answers), ``detected`` (``source=auto``), how many
    segments held no word of the source language and came back as they were (``kept``),
    and, when any is, which item's translation may be made up (``uncertain``: a short input
    of uncertain language the model finds unlikely, :func:`tinymt.translate.doubt`)."""
    best = [hyps[0] if hyps else "" for hyps in nbests]
    out: dict = {"translatedText": best[0] if req.single else best}
    if req.alternatives:
        alts = [distinct(hyps)[1:req.alternatives + 1] for hyps in nbests]
        out["alternatives"] = alts[0] if req.single else alts
    if detected is not None:
        out["detectedLanguage"] = detected[0] if req.single else detected
    if kept:
        out["untranslatedSegments"] = kept
    if any(doubts):
        out["uncertain"] = doubts[0] if req.single else doubts
    return out


def detection(lang: str, p: float) -> dict:
    """A language as LibreTranslate reports it (py3langid's among LIBRETRANSLATE's,
    :func:`tinymt.text.detect`): confidence in %."""
    return {"confidence": round(100 * p, 1), "language": lang}
