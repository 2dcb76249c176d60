"""tinymt.text: a paragraph is cut into its sentences and put back with its own spacing;
what holds no word of the model's language is kept as it is."""

import resource
import signal
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinymt.corpus import generate_splits
from tinymt.errors import TinyMTError
from tinymt.text import MASK, assemble, detect, html_parts, in_language, mask_spans, plan

TEST = generate_splits(train_size=0, valid_size=0, test_size=200)["test"]
GAPS = st.sampled_from(["", " ", "  ", "\n", "\n\n", " \n ", "\r\n", "\t"])
SPANS = st.sampled_from(["3", "25,50", "10:30", "1990", "https://example.com/a?b=1.c",
                         "www.tinymt.org/x", "li.lei@example.com"])


@given(st.lists(st.sampled_from(TEST), min_size=1, max_size=5), st.data())
def test_a_paragraph_is_its_sentences_and_its_spacing(pairs, data):
    """Chinese sentences of the built-in test set, some quoted or bracketed or with a second
    end mark, joined by any spacing (none, spaces, line breaks, blank lines): plan finds
    exactly those sentences, in order, each with what closes it, and assemble puts the
    translations back in the input's spacing (English needs a space where Chinese had
    none); English sentences (a space at least between two) come back unchanged."""
    gaps = [data.draw(GAPS) for _ in range(len(pairs) + 1)]
    marks = [data.draw(st.sampled_from(["", "", "“”", "（）", "！"])) for _ in pairs]
    zhs = [m[:-1] + p.zh + m[-1:] for p, m in zip(pairs, marks)]
    zh = gaps[0] + "".join(z + g for z, g in zip(zhs, gaps[1:]))
    sents, (parts,), kept = plan([zh], "zh")
    assert sents == zhs and kept == 0
    between = [g or " " for g in gaps[1:-1]]
    expected = gaps[0] + "".join(p.en + g for p, g in zip(pairs, [*between, gaps[-1]]))
    assert assemble(parts, [p.en for p in pairs], "en") == expected
    en = gaps[0] + "".join(p.en + (g or " ") for p, g in zip(pairs, gaps[1:]))
    sents, (parts,), _ = plan([en], "en")
    assert sents == [p.en for p in pairs]
    assert assemble(parts, sents, "en") == en
    # cut=False (the server's text=false, translate.py's n-best): each text one sentence
    assert plan([zh, en], "zh", cut=False) == ([zh, en], [[0], [1]], 0)


@pytest.mark.parametrize("source, text, kept", [
    ("zh", "123 :)", True), ("zh", "https://example.com/a?b=1", True),
    ("zh", "li.lei@example.com", True), ("zh", "🙂👍", True), ("zh", "3.14", True),
    ("zh", "Clever people go to school every day.", True), ("zh", "", True),
    ("zh", "他喜欢猫吗？", False), ("zh", "我喜欢Python。", False),
    ("zh", "私は猫が好きです。", True),  # Japanese: Chinese characters and kana
    ("de", "Clever people go to school every day.", True), ("de", "他喜欢猫吗？", True),
    ("de", "Ein Hund rennt durch den Schnee.", False), ("de", "Hund", False),
    # a corpus's own names (text_files: src, tgt): letters are enough; zh-CN is zh
    ("src", "Ein Hund rennt durch den Schnee.", False), ("src", "w12 w3", False),
    ("src", "123 :)", True), ("zh-CN", "他喜欢猫吗？", False), ("zh_Hans", "Hello there.", True),
])
def test_what_holds_no_word_of_the_source_language_is_kept(source, text, kept):
    assert in_language(text, source) is not kept
    sents, (parts,), n = plan([f"{text}\n"], source)
    assert (sents == []) is kept and (n >= 1) == (kept and bool(text))
    assert assemble(parts, ["<t>"] * len(sents), "en") == (f"{text}\n" if kept else "<t>\n")


def test_detection_names_the_language_with_a_probability():
    for text, lang in [("他喜欢猫吗？", "zh"), ("Ein Hund rennt durch den Schnee.", "de"),
                       ("Un homme fait du vélo.", "fr"), ("Clever people go to school.", "en")]:
        found, p = detect(text)
        assert found == lang and 0.5 < p <= 1.0


def test_a_kept_segment_next_to_a_sentence_gets_the_target_s_space():
    sents, (parts,), kept = plan(["他喜欢猫吗？https://x.org\t123"], "zh")
    assert sents == ["他喜欢猫吗？"] and kept == 1
    assert assemble(parts, ["Does he like cats?"], "en") == "Does he like cats? https://x.org\t123"
    sents, (parts,), _ = plan(["Does he like cats? Yes."], "en")
    assert assemble(parts, ["他喜欢猫吗？", "喜欢。"], "zh") == "他喜欢猫吗？喜欢。"


@given(st.lists(st.tuples(st.sampled_from(TEST), SPANS, st.integers(1, 30)), min_size=1,
                max_size=4), st.sets(SPANS))
def test_numbers_urls_and_addresses_are_masked_and_never_cut(rows, spelled):
    """A span put inside a sentence: the sentence is not cut at its ``?`` or ``.``; it is
    masked unless the model spells it, and the mask stands for it."""
    sents = [p.zh[:min(at, len(p.zh) - 1)] + f" {w} " + p.zh[min(at, len(p.zh) - 1):]
             for p, w, at in rows]
    found, _, _ = plan(["".join(sents)], "zh")
    assert found == [s.strip() for s in sents]
    for sent, (_, written, _) in zip(found, rows):
        text, spans, _ = mask_spans(sent, lambda s: s in spelled)
        assert [w for *_, w in spans] == [written]
        (start, end, w), = spans
        assert text[start:end] == (w if w in spelled else MASK)
        assert text[:start] + w + text[end:] == sent


# what POST /detect is held to: language, file under ../shared/data, its tab-separated column
DETECT_SETS = [("zh", "tatoeba-cmn-eng/cmn-eng.tsv.gz", 1), ("en", "tatoeba-cmn-eng/cmn-eng.tsv.gz", 0),
               *((lang, f"multi30k/test_2016_flickr.{lang}.gz", 0) for lang in ("en", "de", "fr"))]


def test_detect_names_the_language_of_the_shared_test_sets(shared_data):
    """What ``POST /detect`` answers (:func:`tinymt.text.detect` among LibreTranslate's
    languages) on 500 lines
    spread over each of Tatoeba's zh and en and Multi30k's en, de and fr test sets: at
    least 98 % of each detected as its language (docs/serve.md: 99.6-100 % measured)."""
    import gzip

    from tinymt.text import LIBRETRANSLATE

    accuracy = {}
    for lang, name, column in DETECT_SETS:
        if not (shared_data / name).is_file():
            pytest.skip(f"{shared_data / name} is missing")
        with gzip.open(shared_data / name, "rt", encoding="utf-8-sig") as f:
            texts = [line.split("\t")[column].strip() for line in f if line.strip()]
        texts = texts[::len(texts) // 500][:500]
        assert len(texts) == 500
        found = [detect(t, LIBRETRANSLATE)[0] for t in texts]
        accuracy[lang, name] = sum(f == lang for f in found) / len(texts)
    assert min(accuracy.values()) >= 0.98, accuracy



MARKUP = st.sampled_from(["<p>", "</p>", "<b>", "</b>", '<a href="x">', "<br/>", "<!-- c -->",
                          "<![CDATA[x < y]]>", "<?php echo 1 ?>", "<![if !IE]>", "<![endif]>",
                          "<!DOCTYPE html>", "<code>", "</code>"])


@given(st.lists(st.one_of(MARKUP, st.text(alphabet="猫a .!?", max_size=6)), max_size=8),
       st.text(alphabet="<>&;![]-/a?", max_size=24))
@example(["<p>我喜欢<b>猫</b>。</p>"], "<![foo[x")
def test_html_parts_lose_nothing(pieces, junk):
    """Any mix of tags, comments, CDATA, processing instructions, conditional sections and
    text: the parts join to the markup (nothing dropped); any string at all is parts or one
    line refusing it (a marked section html.parser does not know), never another error."""
    markup = "".join(pieces)
    parts, tags = html_parts(markup)
    assert "".join(s for _, s in parts).translate(tags) == markup
    try:
        html_parts(junk)
    except TinyMTError as e:
        assert str(e).startswith("format=html: the markup cannot be read") and "\n" not in str(e)


@pytest.mark.slow  # up to ~0.4 s an example
@settings(max_examples=25, deadline=None)
@given(st.text(alphabet='<a !-[]?/="。.x猫\n1', min_size=1, max_size=6), st.integers(1, 10_000),
       st.booleans(), st.booleans())
@example("<a ", 3334, True, False)  # html.parser's quadratic markup: ~1.1 s
@example("。", 10_000, False, True)  # a punctuation run
def test_reading_any_text_ends_within_its_time(unit, times, html, auto):
    """Property: whatever the text (runs of markup, punctuation, lines, words, up to 10,000
    characters), reading it (cut, parsed as HTML, its language found) ends within its time:
    read, or refused in one line. The allowance cut to ``READ_S`` (0.25 s) alone, so that
    the slowest texts (html.parser's quadratic markup) overrun it."""
    from unittest.mock import patch

    from tinymt import text

    item = (unit * times)[:10_000]
    text.read_item("猫。", 1, "zh", False, True, frozenset({"zh", "en"}))  # loaded: not timed
    start = time.process_time()  # the deadline's clock: CPU time
    try:
        with patch.object(text, "READ_S_PER_CHAR", 0.0):
            text.read_item(item, 1, "zh", html, True, frozenset({"zh", "en"}) if auto else None)
    except TinyMTError as e:
        assert str(e).startswith(("q item 1: reading its", "format=html: the markup cannot"))
        assert "\n" not in str(e)
    assert time.process_time() - start < text.READ_S + 0.1


def test_a_deadline_dropped_once_is_raised_again(monkeypatch):
    """Python drops an exception raised in a weakref callback or ``__del__`` ("Exception
    ignored in ..."; a library's ``except Exception`` would too): the deadline fires again
    0.01 s of CPU later, until its error lands. Seen in the suite: a GC callback took
    the first, and translate.py read 12,000 characters on past its time. Once it has
    landed, a firing before the timer is disarmed (an exit on its way) raises nothing."""
    from tinymt import text

    monkeypatch.setattr(text, "READ_S", 0.1)
    monkeypatch.setattr(text, "READ_S_PER_CHAR", 0.0)

    def spin(cpu_seconds: float) -> None:  # until an error, or this much CPU more
        end = time.process_time() + cpu_seconds
        while time.process_time() < end:
            pass

    with pytest.raises(TinyMTError, match="reading its 2,000 characters took over 0.10 s") as e:
        with text.within("猫。" * 1000, "a text", plain=False):
            with pytest.raises(TinyMTError):
                spin(5.0)  # the first error, dropped here as Python drops it
            try:
                spin(2.0)
            except TinyMTError:  # landed: a firing on its way out raises no other
                signal.getsignal(signal.SIGPROF)(signal.SIGPROF, None)
                raise
    assert e.value.__context__ is None
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)  # disarmed after


def test_a_short_plain_item_is_read_with_no_clock(monkeypatch):
    """The server reads a short plain one-pass item on its own event loop, beside the
    batcher thread's model, where the process's CPU clock counts that thread's work too: such
    text is bounded before it starts, so no clock runs while it is read (neither the item's
    nor its line's: a 13-character request was refused on a busy CPU). Markup, a longer text
    or one pysbd cuts is read against the clock."""
    from tinymt import text

    clocks, real = [], text.sentences

    def sentences(line, lang):  # (as each line is cut: is a clock running?)
        clocks.append(signal.getitimer(signal.ITIMER_PROF)[0] > 0)
        return real(line, lang)

    monkeypatch.setattr(text, "sentences", sentences)
    text.read_item("他喜欢猫吗？", 1, "zh", False, True, frozenset({"zh"}))
    text.plan(["他喜欢猫吗？"], "zh")
    text.read_item("<b>他喜欢猫吗？</b>", 2, "zh", True, True, None)
    text.read_item("他喜欢猫" * 300, 3, "zh", False, True, None)  # 1,200 characters
    text.read_item("他喜欢猫。她喜欢狗。", 4, "zh", False, True, None)
    assert clocks == [False, False, True, True, True]
    assert signal.getitimer(signal.ITIMER_PROF)[0] == 0


MALFORMED = ('<a ' * 1667)[:5000]  # html.parser reads it in quadratic time: ~0.4 s, 4x: 7 s


def test_reading_a_text_stops_at_its_time(monkeypatch, tiny_run, capsys):
    """A text is read (cut, identified, parsed) within its time (``text.within``) or
    stopped there in one line: on a server's reader (an item), and in ``translate.py``
    (exit 2). The allowance cut to 0.25 s here, so that markup read in quadratic time and
    a long punctuated line both overrun it."""
    from conftest import run_script_in_process
    from tinymt import text

    monkeypatch.setattr(text, "READ_S_PER_CHAR", 0.0)
    def cpu():  # this thread's: the allowance is CPU time (a busy machine's wall time is longer)
        r = resource.getrusage(resource.RUSAGE_THREAD)
        return r.ru_utime + r.ru_stime

    text.read_item("你好。<b>猫</b>", 1, "zh", True, True, None)  # the readers loaded: not timed
    start = cpu()
    with pytest.raises(TinyMTError, match="^q item 3: reading its 5,000 characters took "
                                          r"over 0.25 s \(sentences, language, markup\)"):
        text.read_item(MALFORMED, 3, "zh", True, True, None)
    assert cpu() - start < 0.4
    status, err = run_script_in_process("translate", [f"run={tiny_run}", "--", "你好。",
                                                      "他喜欢猫吗？" * 2000], capsys)
    assert status == 2 and err.startswith("error: line 2: reading its 12,000 characters took "
                                          "over 0.25 s") and len(err.splitlines()) == 1
