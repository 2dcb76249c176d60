"""Real text in: each line cut into sentences, what is not in the model's source language
kept as it is, the translations put back with the input's line breaks and spacing.

``plan(texts, source)`` -> the sentences to translate and, per text, its parts (a string
kept as it is, or the index of a sentence); ``assemble(parts, translations, target)``
joins them; ``mask_spans`` hides the numbers, URLs and e-mail addresses a model cannot
spell (:func:`tinymt.translate.copy_spans` puts them back). pysbd segments, py3langid
identifies (its model in the wheel); why these and how well: docs/serve.md, "Text in".
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from html import escape
from html.parser import HTMLParser

import pysbd
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from tinymt.errors import TinyMTError

SENTENCE_END = re.compile(r"[.!?。！？]")  # followed by a word, a sentence may end there
_SCRIPT = {"zh": re.compile(r"[\u3400-\u9fff\uf900-\ufaff]"),  # a source's letters
           "ja": re.compile(r"[\u3040-\u30ff\u3400-\u9fff]")}
_LETTER = re.compile(r"[^\W\d_]")  # any other source: a letter of any script
_OTHER = {"zh": re.compile(r"[\u3040-\u30ff\uac00-\ud7af]")}  # kana, hangul (not Chinese)
UNSPACED = {"zh", "ja"}  # written without spaces between sentences
CONFIDENT = 0.8  # py3langid's probability above which a text is taken to be in its language
# LibreTranslate's languages: what /detect chooses among, as LibreTranslate detects among the
# languages it has (so Chinese is zh, never Wu or Cantonese, which py3langid also knows)
LIBRETRANSLATE = frozenset(
    "ar az bg bn ca cs da de el en eo es et eu fa fi fr ga gl he hi hu id it ja ko ky lt lv ms "
    "nb nl pl pt ro ru sk sl sq sr sv th tl tr uk ur vi zh".split())
SPAN = re.compile(r"(?:https?://|www\.)[!-~]*[\w/=&#~-]"  # a URL (not its last full stop)
                  r"|(?<![\w.%+-])[\w.%+-]+@[\w-]+(?:\.[\w-]+)+"  # an e-mail (from a run's start:
                  # tried at every character of a long word it would be quadratic)
                  r"|(?<![A-Za-z])\d+(?:[.,:/]\d+)*(?![A-Za-z])", re.ASCII)  # 3, 25,50, 10:30
MASK = "\ue000"  # a private-use character: in no vocabulary, so the model reads one <unk>
# format=html: an inline element's tags stand in its text as two private-use characters (its
# start tag 2k, its end tag 2k + 1), carried through the sentence and put back around the
# words of the translation that read the element's words (tinymt.translate.copy_spans)
TAG, TAGS = 0xF0000, re.compile("[\U000f0000-\U000ffffd]")
INLINE = frozenset("a abbr b bdi bdo cite data dfn em font i kbd mark q s samp small span strong "
                   "sub sup time u var".split())
# The time reading a text (segmenting, language ID, HTML parsing) may take: pysbd reads
# prose at 5-10 us a character, punctuation runs ("。" * 5000) at up to ~180 us
READ_S, READ_S_PER_CHAR = 0.25, 200e-6
SHORT = 1000  # characters: plain one-pass text this short is read in bounded time


@contextlib.contextmanager
def within(text: str, what: str = "a text", plain: bool = True):
    """Reading ``text`` stopped by a one-line :class:`TinyMTError` past its time of the
    process's CPU: :data:`READ_S` + :data:`READ_S_PER_CHAR` a character (SIGPROF, which ``re``
    and the parsers check; again every 0.01 s: Python drops a raise in a weakref callback).
    Main thread only, the outermost deadline alone counts; untimed: plain :func:`one_pass`
    text of at most :data:`SHORT` characters (the server reads it amid its threads' CPU)."""
    if plain and len(text) <= SHORT and one_pass(text) or signal.getitimer(signal.ITIMER_PROF)[0] \
            or threading.current_thread() is not threading.main_thread():
        yield
        return
    seconds = READ_S + READ_S_PER_CHAR * len(text)
    error = TinyMTError(f"{what}: reading its {len(text):,} characters took over "
                        f"{seconds:.2f} s (sentences, language, markup); send plainer text")

    def stop(*_):  # (not while it is on its way out: the finally disarms the timer there)
        if sys.exc_info()[1] is not error:
            raise error
    old = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.01)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


@functools.cache
def _identifier() -> LanguageIdentifier:  # 0.6 s: loaded on first use
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detect(text: str, among: frozenset[str] | None = None) -> tuple[str, float]:
    """The language of ``text`` (ISO 639-1) and py3langid's probability for it (0..1),
    ``among`` these languages when given (their probabilities renormalised)."""
    ranked = [(lang, float(p)) for lang, p in _identifier().rank(text)
              if among is None or lang in among]
    total = sum(p for _, p in ranked)
    return ranked[0][0], ranked[0][1] / total if total > 0 else 0.0


def unsure(text: str, source: str) -> tuple[str, float] | None:
    """``text``'s language and its probability (:func:`detect` among LibreTranslate's),
    unless that is ``source`` at CONFIDENT or more."""
    lang, p = detect(text, LIBRETRANSLATE)
    return None if lang == language_code(source) and p >= CONFIDENT else (lang, p)


def in_language(segment: str, source: str) -> bool:
    """Does ``segment`` hold a word of ``source``? Not without a letter (of the source's
    script for Chinese and Japanese: no digits only, URL, emoji, English into a Chinese
    model), nor when it is confidently another language (German into an English model)."""
    code = language_code(source)
    if not _SCRIPT.get(code, _LETTER).search(segment):
        return False
    # a corpus's own name (text_files: "src"), or Chinese by its script (other sources: a
    # letter, found above): py3langid's 0.05 ms on the event loop cost a few % at 64 clients
    if code not in _identifier().nb_classes or not _OTHER.get(code, _LETTER).search(segment):
        return True
    lang, p = _identifier().classify(segment)  # (the best alone: half rank()'s 0.1 ms)
    return lang == code or p < CONFIDENT


def language_code(name: str) -> str:
    """A data config's language name as py3langid and pysbd know it: ``zh-CN`` -> ``zh``."""
    return name.strip().lower().replace("_", "-").split("-")[0]


@functools.cache
def _segmenter(lang: str) -> pysbd.Segmenter:
    lang = language_code(lang)
    return pysbd.Segmenter(language=lang if lang in pysbd.languages.LANGUAGE_CODES else "en",
                           clean=False, char_span=True)


def one_pass(text: str) -> bool:
    r"""No sentence end followed by a word in ``text``: nothing for pysbd to cut, every step
    of reading it linear (not one regex ``[.!?]\W*\w``: quadratic on ``"。" * n``)."""
    end = SENTENCE_END.search(text)
    return not end or not re.search(r"\w", text[end.end():])


def sentences(line: str, lang: str) -> list[str]:
    """``line`` (no line break) cut into sentences, each with the spacing around it:
    they join to ``line``; never inside a URL, e-mail address or number (``a?b=1``)."""
    if one_pass(line):  # one sentence (pysbd costs ~0.3 ms)
        return [line] if line else []
    inside = {i for m in SPAN.finditer(line) for i in range(m.start() + 1, m.end())}
    cuts = sorted({0, len(line)} | {_after_closing(line, s.end)
                                    for s in _segmenter(lang).segment(line)} - inside)
    return [line[a:b] for a, b in zip(cuts, cuts[1:])]  # (by offsets: nothing lost)


def _after_closing(line: str, i: int) -> int:
    """The offset after what closes the sentence before ``line[i:]`` (pysbd's Chinese cuts
    leave it to the next): end tags' stand-ins, closing quotes and brackets, more end marks."""
    while i < len(line) and (line[i] in "”’」』）》】！？。…" or TAGS.match(line, i)
                             and (ord(line[i]) - TAG) % 2):
        i += 1
    return i


def plan(texts: Sequence[str], source: str, cut: bool = True, first: int = 1
         ) -> tuple[list[str], list[list[str | int]], int]:
    """The sentences to translate (in ``source``), each text's parts (a string kept as it
    is; an int: a sentence's index) and how many segments hold no word of ``source``;
    ``cut=False``: each text one sentence, as given. Each text is read :func:`within` its
    time (named as a line, numbered from ``first``)."""
    if not cut:
        return list(texts), [[i] for i in range(len(texts))], 0
    todo: list[str] = []
    plans, kept = [], 0
    _identifier(), _segmenter(source)  # loaded outside any text's time
    for n, text in enumerate(texts, first):
        parts: list[str | int] = []
        with within(text, f"line {n}"):
            for line in text.splitlines(keepends=True):
                body = line.rstrip("\r\n")
                for sent in sentences(body, source):
                    core = sent.strip()
                    lead = sent[:len(sent) - len(sent.lstrip())]
                    trail = sent[len(sent.rstrip()):]
                    if core and in_language(core, source):
                        parts += [lead, len(todo), trail]
                        todo.append(core)
                    else:
                        parts.append(sent)
                        kept += bool(TAGS.sub("", core))  # (tags alone: nothing untranslated)
                parts.append(line[len(body):])
        plans.append(parts)
    return todo, plans, kept


def mask_spans(sentence: str, spells: Callable[[str], bool] | None
               ) -> tuple[str, list[tuple[int, int, str]], list[tuple[int, str]]]:
    """``sentence`` with each span of :data:`SPAN` the model cannot ``spell`` replaced by
    :data:`MASK` (a URL read as 15 unknown pieces derails the model; one unknown does not)
    and the tags' stand-ins (:data:`TAGS`) taken out; every span, as ``(start, end, as
    written)``, and every stand-in, as ``(offset, stand-in)``, in the text returned;
    ``spells`` None: the stand-ins only."""
    out, spans, marks, last = "", [], [], 0
    pattern = TAGS.pattern if spells is None else f"{SPAN.pattern}|{TAGS.pattern}"
    for m in re.finditer(pattern, sentence, re.ASCII):
        out += sentence[last:m.start()]
        last = m.end()
        if TAGS.fullmatch(m.group()):
            marks.append((len(out), m.group()))
            continue
        written = m.group() if spells(m.group()) else MASK
        spans.append((len(out), len(out) + len(written), m.group()))
        out += written
    return out + sentence[last:], spans, marks


def assemble(parts: list[str | int], translations: Sequence[str], target: str) -> str:
    """A text's parts joined, each sentence index replaced by its translation; where a
    translation touches its neighbour (Chinese puts no space between sentences) it gets the
    space ``target`` puts there."""
    out: list[str] = []
    last = None  # the previous part that was not empty
    for part in parts:
        if part == "":
            continue
        piece = translations[part] if isinstance(part, int) else part
        if (target in UNSPACED and isinstance(part, str) and part.isspace()
                and "\n" not in part and isinstance(last, int)):
            continue  # (the spaces after an English sentence, into Chinese)
        if (out and target not in UNSPACED and (isinstance(part, int) or isinstance(last, int))
                and not out[-1][-1:].isspace() and piece[:1] and not piece[:1].isspace()):
            out.append(" ")
        out.append(piece)
        last = part
    return "".join(out)


class _Markup(HTMLParser):
    """HTML as parts: ``(False, markup or text as written)`` or ``(True, text to translate,
    decoded)``, an inline element's tags in its text as stand-ins (:data:`TAGS`, their markup in
    ``tags``); what <script>, <style>, <code>, <pre> hold is kept (html.parser: forgiving)."""

    KEEP = {"script", "style", "code", "pre"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[tuple[bool, str]] = []
        self.kept = 0
        self.tags: dict[int, str] = {}  # a stand-in's code -> its markup (a str.translate table)
        self.open: list[tuple[str, int]] = []  # inline elements open: (tag, code)

    def _inline(self, tag: str, start: bool) -> bool:
        """An inline element's tag (outside kept text) as a stand-in in the text: True."""
        if tag not in INLINE or self.kept or len(self.tags) > 32_000:  # (codes in TAGS)
            return False
        match = next((k for k in reversed(range(len(self.open))) if self.open[k][0] == tag), None)
        code = TAG + 2 * len(self.tags) if start or match is None else self.open.pop(match)[1]
        self.open += [(tag, code)] if start else []
        self.tags[code + (not start)] = self.get_starttag_text() if start else f"</{tag}>"
        self.handle_data(chr(code + (not start)), inline=True)
        return True

    def handle_starttag(self, tag, attrs):
        if self._inline(tag, start=True):
            return
        self.parts.append((False, self.get_starttag_text()))
        self.kept += tag in self.KEEP

    def handle_startendtag(self, tag, attrs):
        self.parts.append((False, self.get_starttag_text()))

    def handle_endtag(self, tag):
        if self._inline(tag, start=False):
            return
        self.parts.append((False, f"</{tag}>"))
        self.kept -= tag in self.KEEP and self.kept > 0

    def handle_data(self, data, inline=False):  # (in <script>, <style> nothing is decoded)
        if self.cdata_elem or self.kept:
            self.parts.append((False, data if self.cdata_elem else escape(data, quote=False)))
        else:  # one text with the inline elements' stand-ins (a client's own: U+FFFD)
            data = data if inline else TAGS.sub("\ufffd", data)
            text = self.parts.pop()[1] if self.parts and self.parts[-1][0] else ""
            self.parts.append((True, text + data))

    def handle_comment(self, data):
        self.parts.append((False, f"<!--{data}-->"))

    def handle_decl(self, decl):
        self.parts.append((False, f"<!{decl}>"))

    def handle_pi(self, data):  # <?php ... ?>: kept as written
        self.parts.append((False, f"<?{data}>"))

    def unknown_decl(self, data):  # <![CDATA[...]]>, <![if ...]>: kept
        self.parts.append((False, f"<![{data}]]>" if data[:6].upper() == "CDATA[" else f"<![{data}]>"))


def html_parts(markup: str) -> tuple[list[tuple[bool, str]], dict[int, str]]:
    """``markup`` as ``(is text to translate, string)`` parts (:class:`_Markup`) and the
    markup of each stand-in in the text: the text is decoded; translated, it is to be
    escaped again (``html.escape``), then ``.translate(tags)`` puts the markup back."""
    parser = _Markup()
    try:
        parser.feed(markup)
        parser.close()
    except AssertionError as e:  # html.parser's refusal: a marked section it does not know
        raise TinyMTError(f"format=html: the markup cannot be read ({e})") from None
    return parser.parts, parser.tags


def read_item(item: str, n: int, source: str, html: bool, cut: bool,
              among: frozenset[str] | None) -> tuple:
    """A client's item ``n`` read :func:`within` its time (the server's readers run this):
    its parts and tags (``html``: :func:`html_parts`, else the one text), the :func:`plan`
    of its text, and its language among ``among`` (:func:`detect`; None: not asked)."""
    _identifier(), _segmenter(source)  # loaded outside the item's time
    with within(item, f"q item {n}", plain=not html):
        parts, tags = html_parts(item) if html else ([(True, item)], {})
        sents, plans, kept = plan([s for is_text, s in parts if is_text], source, cut)
        return (parts, tags), sents, plans, kept, detect(item, among) if among else None


def start_reader(source: str) -> None:
    """A reader process's start: Ctrl-C is the server's, the server's own work goes first,
    the segmenter and py3langid loaded (0.6 s) before any text's time runs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(5)
    plan(["warm-up. 热身。"], source)
