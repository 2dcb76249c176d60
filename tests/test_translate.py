"""scripts/translate.py on a real (tiny) run: arguments, stdin, files, n-best, references,
attention figures, and every bad-input path (its message; line counts kept).

Most tests call ``translate()`` in this process, the script's own work; the script itself
runs where only a process shows it (argv, its exit status): how a ``TinyMTError`` becomes
one line and exit status 2 is tests/test_cli_errors.py's.
"""

import io
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import forked
import numpy as np
import pytest
import sacrebleu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

import tinymt.config  # noqa: F401
import tinymt.translate
from conftest import compose_translate, run_script_in_process
from tinymt.checkpoint import load_checkpoint, save_checkpoint
from tinymt.config import TranslateConfig
from tinymt.data import normalize
from tinymt.decoding import translate_ids
from tinymt.errors import TinyMTError
from tinymt.files import TEMP_PREFIX
from tinymt.rundir import find_run, load_run
from tinymt.text import SPAN, TAG
from tinymt.tokenizer import UNK_ID
from tinymt.translate import _parts, _place_tags, likelihood, translate

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "translate.py")


def cli(*args, stdin=None):
    return forked.run([sys.executable, SCRIPT, *args], input=stdin, capture_output=True,
                      text=True, cwd=ROOT)


def piped(data: bytes):
    """A stdin that is a pipe of these bytes (not a terminal), as the script gets it."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def test_sentences_as_arguments(tiny_run, capsys):
    """The script: every argument not of the form key=value is a sentence, and after ``--``
    every argument is one (``x=1`` too); printed in order, one line each."""
    sentences = ["我请李雷帮我订了去北京的机票。", "他喜欢猫吗？", "Hello"]
    status, err = run_script_in_process(
        "translate", [f"run={tiny_run}", "device=cpu", *sentences, "--", "x=1", "他喜欢猫吗？"],
        capsys)
    assert status == 0, err
    out = capsys.readouterr().out.splitlines()
    # the script prints what the library translates, in order, one line each
    assert out == translate(compose_translate(f"run={tiny_run}"), [*sentences, "x=1", "他喜欢猫吗？"])["translations"]
    assert len(out) == 5


def test_input_is_normalised_like_the_training_text(tiny_run):
    """Full-width punctuation and extra spaces: NFKC and collapsed spaces, as data.normalize."""
    plain = translate(compose_translate(f"run={tiny_run}"), ["他喜欢猫吗?"])["translations"]
    assert translate(compose_translate(f"run={tiny_run}"), ["  他喜欢猫吗？ "])["translations"] == plain


def test_bad_utf8_on_stdin(tiny_run):
    stdin = piped("他喜欢猫吗？\n".encode() + b"\xff\xfe\x00garbage\n")
    with pytest.raises(TinyMTError) as e:
        translate(compose_translate(f"run={tiny_run}"), stdin=stdin, stdout=io.StringIO())
    assert str(e.value) == "stdin: line 2 is not valid UTF-8"


@pytest.mark.slow
def test_bad_utf8_as_argument(tiny_run):
    """Bytes that are not UTF-8 as an argument: the script gets them as Python decodes
    argv (each byte kept as a lone surrogate, PEP 383)."""
    arg = b"\xff\xfe".decode(errors="surrogateescape")  # what sys.argv holds for them
    r = forked.run([sys.executable, SCRIPT, f"run={tiny_run}", arg], capture_output=True,
                   cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.decode().strip().splitlines() == ["error: argument 1 is not valid UTF-8"]


def test_failed_translation_leaves_an_existing_output_file(tiny_run, tmp_path):
    out = tmp_path / "out.en"
    out.write_text("precious\n", encoding="utf-8")
    bad = tmp_path / "bad.zh"
    bad.write_bytes("他喜欢猫吗？\n".encode())
    ref = tmp_path / "missing.en"
    with pytest.raises(TinyMTError):
        translate(compose_translate(f"run={tiny_run}", f"input={bad}", f"output={out}", f"ref={ref}"))
    with pytest.raises(TinyMTError):  # fails while translating: attention= one file, 2 lines
        bad.write_bytes("他喜欢猫吗？\n我们每天去学校。\n".encode())
        translate(compose_translate(f"run={tiny_run}", f"input={bad}", f"output={out}",
                          f"attention={tmp_path / 'one.png'}"))
    assert out.read_text(encoding="utf-8") == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.zh", "out.en"]


def test_stdin_pipe_keeps_line_count_with_empty_lines(tiny_run):
    out = io.StringIO()
    res = translate(compose_translate(f"run={tiny_run}"), stdout=out, stdin=piped(
        "他喜欢猫吗？\n\n   \n那只小猫昨天在公园里追了一只蝴蝶。\n".encode()))
    lines = out.getvalue().split("\n")[:-1]
    assert len(lines) == 4
    assert lines[1] == "" and lines[2] == ""
    assert lines[0] and lines[3]
    assert [lines[0], lines[3]] == translate(compose_translate(f"run={tiny_run}"), [
        "他喜欢猫吗？", "那只小猫昨天在公园里追了一只蝴蝶。"])["translations"]
    assert res["translations"] == lines


def test_a_pipe_is_translated_a_chunk_at_a_time(tiny_run, monkeypatch):
    """A pipe is read PIPE_LINES lines at a time, each chunk printed before the next is
    read (an endless pipe: output as it goes, memory of a chunk), the same lines as whole."""
    monkeypatch.setattr(tinymt.translate, "PIPE_LINES", 2)
    text = ["他喜欢猫吗？", "", "那只小猫昨天在公园里追了一只蝴蝶。", "我们每天去学校。", "他喜欢猫吗？"]
    out, printed = io.StringIO(), []

    class Pipe(io.BytesIO):
        def readline(self, *args):  # what was printed when each line is read
            printed.append(out.getvalue().count("\n"))
            return super().readline(*args)

    res = translate(compose_translate(f"run={tiny_run}"), stdout=out,
                    stdin=Pipe("\n".join(text).encode() + b"\n"))
    assert printed == [0, 0, 2, 2, 4, 4] and out.getvalue().splitlines() == res["translations"]
    assert res["translations"] == translate(compose_translate(f"run={tiny_run}"), text)[
        "translations"]


def test_files_in_and_out_same_line_count(tiny_run, tmp_path):
    src = tmp_path / "in.zh"
    src.write_text("我昨天在公园里看了一本书。\n\n他们会去上海。\n\n", encoding="utf-8")
    out = tmp_path / "out.en"
    res = translate(compose_translate(f"run={tiny_run}", f"input={src}", f"output={out}", "decode.beam=3"))
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == 4 and got[1] == "" and got[3] == ""
    assert got == res["translations"]


def test_overlong_sentence_is_truncated_with_a_warning(tiny_run):
    long_line = "我请李雷帮我订了去北京的机票，" * 20  # one sentence, far over max_positions=64
    warnings, out = [], io.StringIO()
    translate(compose_translate(f"run={tiny_run}"), stdin=piped(f"他喜欢猫吗？\n{long_line}\n".encode()),
              stdout=out, warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith("line 2: ") and "truncat" in warnings[0]
    assert len(out.getvalue().splitlines()) == 2


def test_likelihood_is_the_beam_score_of_the_same_tokens(tiny_run):
    """Teacher-forced in one pass, it equals what beam search summed step by step on its
    cache: ``exp(sum(log p) / n)`` of the best hypothesis at ``len_penalty=1``."""
    run = load_run(str(tiny_run))
    ids = [run.src_tokenizer.encode(s) for s in ("猫", "他喜欢猫吗？", "我请李雷帮我订了机票。")]
    for src, [(out, score)] in zip(ids, translate_ids(run.model, ids, beam=3, max_len_b=5)):
        assert likelihood(run, src, out, "cpu") == pytest.approx(np.exp(score), rel=1e-4)


def test_a_short_line_of_uncertain_language_translated_unlikely_is_flagged(tiny_run,
                                                                          monkeypatch):
    """One short sentence whose language py3langid is unsure of (猫: Serbian at 4 %), with a
    translation below LIKELY, is a warning; a sure language (你好), two sentences or a long
    one are not, whatever their translation; nothing is, with LIKELY at 0."""
    lines = ["猫", "你好", "猫。狗。", "他喜欢猫吗？"]
    run = load_run(str(tiny_run))
    src = run.src_tokenizer.encode("猫")
    out = translate_ids(run.model, [src])[0][0][0]
    assert likelihood(run, src, out, "cpu") < tinymt.translate.LIKELY  # (a 40-step model)
    warnings = []
    translate(compose_translate(f"run={tiny_run}"), lines, stdout=io.StringIO(), warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith(
        "line 1: '猫' is short, of uncertain language (sr 4%), and the model finds its "
        "translation unlikely"), warnings
    monkeypatch.setattr(tinymt.translate, "LIKELY", 0.0)
    translate(compose_translate(f"run={tiny_run}"), lines, stdout=io.StringIO(), warn=warnings.append)
    assert len(warnings) == 1


def test_characters_outside_the_vocabulary_do_not_crash(tiny_run):
    run = load_run(str(tiny_run))
    assert UNK_ID in run.src_tokenizer.encode("龘靐齉爩 🙂")  # really unknown to the model
    warnings = []
    res = translate(compose_translate(f"run={tiny_run}"), ["龘靐齉爩 🙂 ǅ", "他喜欢猫吗？"], warn=warnings.append)
    assert warnings == []  # unknown characters are no reason to warn, only to map to <unk>
    assert len(res["translations"]) == 2
    assert res["translations"][1] == translate(compose_translate(f"run={tiny_run}"), ["他喜欢猫吗？"])[
        "translations"][0]  # the batch neighbour is unaffected


def test_nbest_output(tiny_run, capsys):
    translate(compose_translate(f"run={tiny_run}", "decode.beam=3", "decode.nbest=3"), ["他喜欢猫吗？", ""])
    out = capsys.readouterr().out.split("\n")
    # 3 scored lines + blank for the sentence, then one empty-hypothesis block
    scores = [float(line.split("\t")[0]) for line in out[:3]]
    assert scores == sorted(scores, reverse=True)
    assert out[3] == ""


def test_beam_rule_reaches_the_search(tiny_run, capsys):
    """decode.beam_rule picks the search: each n-best list is that rule's, read back from
    the printed lines and compared with translate_ids on the same ids."""
    run = load_run(str(tiny_run), "best", "cpu")
    lines = ["他喜欢猫吗？", "那只小猫昨天在公园里追了一只蝴蝶。", "我们每天去学校。"]
    ids = [run.src_tokenizer.encode(normalize(s)) for s in lines]
    printed = {}
    for rule in ("shrink", "full"):
        translate(compose_translate(f"run={tiny_run}", "decode.beam=4", "decode.nbest=4",
                          f"decode.beam_rule={rule}"), lines)
        printed[rule] = capsys.readouterr().out
        want = translate_ids(run.model, ids, beam=4, nbest=4, beam_rule=rule)
        blocks = printed[rule].split("\n\n")[: len(lines)]
        for block, hyps in zip(blocks, want):
            got = [(float(s), text) for s, text in (ln.split("\t") for ln in block.split("\n"))]
            assert [x for x, _ in got] == pytest.approx([s for _, s in hyps], abs=1e-4)
            assert [x for _, x in got] == [run.tgt_tokenizer.decode(h) for h, _ in hyps]
    assert printed["shrink"] != printed["full"]  # scores differ at least (normalisers)
    translate(compose_translate(f"run={tiny_run}", "decode.beam=4", "decode.nbest=4"), lines)
    assert capsys.readouterr().out == printed["shrink"]  # the torch engine's own rule


def test_ref_prints_sacrebleu(tiny_run, tmp_path, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("他喜欢猫吗？\n我们每天去学校。\n", encoding="utf-8")
    ref.write_text("Does he like cats?\nWe go to school every day.\n", encoding="utf-8")
    res = translate(compose_translate(f"run={tiny_run}", f"input={src}", f"ref={ref}"))
    expected = sacrebleu.corpus_bleu(res["translations"],
                                     [["Does he like cats?", "We go to school every day."]])
    assert res["bleu"] == pytest.approx(expected.score)
    assert "BLEU" in capsys.readouterr().err


def test_ref_with_wrong_line_count_leaves_output_as_it_was(tiny_run, tmp_path, capsys):
    """scripts/translate.py ref= with the wrong line count: one line, and output= untouched
    (it was replaced by the translations before the count was checked)."""
    from conftest import run_script_in_process

    ref, out = tmp_path / "ref.txt", tmp_path / "out.txt"
    ref.write_text("one\ntwo\n", encoding="utf-8")
    out.write_text("precious\n", encoding="utf-8")
    status, err = run_script_in_process("translate", [
        f"run={tiny_run}", "device=cpu", f"ref={ref}", f"output={out}", "他喜欢猫吗？"], capsys)
    assert status == 2 and "has 2 lines but the input has 1" in err, err
    assert out.read_text(encoding="utf-8") == "precious\n"


def test_a_killed_translations_temp_file_is_harmless(tiny_run, tmp_path, capsys):
    """A translation killed while writing output= leaves a temp file (tinymt.files): never
    read, the next translation writes beside it (sentences and input= together are
    refused)."""
    from conftest import run_script_in_process

    out = tmp_path / "out.txt"
    (tmp_path / f"{TEMP_PREFIX}0123456789abcdef").write_text("half a transl")
    status, err = run_script_in_process("translate", [
        f"run={tiny_run}", "device=cpu", f"output={out}", "他喜欢猫吗？"], capsys)
    assert status == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{TEMP_PREFIX}0123456789abcdef",
                                                           "out.txt"]
    status, err = run_script_in_process("translate", [
        f"run={tiny_run}", "device=cpu", f"input={out}", "他喜欢猫吗？"], capsys)
    assert status == 2 and "give one" in err, err


def test_attention_figure_file_and_folder(tiny_run, tmp_path, monkeypatch):
    png = tmp_path / "one.png"
    translate(compose_translate(f"run={tiny_run}", f"attention={png}"), ["我请李雷帮我订了去北京的机票。"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    folder = tmp_path / "maps"
    translate(compose_translate(f"run={tiny_run}", f"attention={folder}",
                      "attention_kinds=[cross,decoder_self,encoder_self]"),
              ["他喜欢猫吗？", "", "我们每天去学校。他喜欢猫吗？"])
    assert sorted(p.name for p in folder.iterdir()) == ["line1.png", "line3.1.png", "line3.2.png"]
    out = io.StringIO()  # one file for two sentences: refused before anything is translated
    with pytest.raises(TinyMTError, match="give a folder"):
        translate(compose_translate(f"run={tiny_run}", f"attention={png}"),
                  ["他喜欢猫吗？", "我们每天去学校。"], stdout=out)
    assert out.getvalue() == ""
    monkeypatch.setattr(tinymt.translate, "PIPE_LINES", 1)  # a pipe: counted over its chunks
    with pytest.raises(TinyMTError, match="one file but there are 2 sentences"):
        translate(compose_translate(f"run={tiny_run}", f"attention={png}"),
                  stdin=piped("他喜欢猫吗？\n我们每天去学校。\n".encode()), stdout=io.StringIO())
    warnings = []  # no sentence to draw: said, nothing written
    translate(compose_translate(f"run={tiny_run}", f"attention={tmp_path / 'none.png'}"),
              stdin=piped(b"\n \n"), stdout=io.StringIO(), warn=warnings.append)
    assert warnings == [f"attention={tmp_path / 'none.png'}: no sentence to draw"]
    assert not (tmp_path / "none.png").exists()


def test_run_latest_picks_the_newest(tiny_run, tmp_path):
    root = tmp_path / "outputs"
    older, newer = root / "a" / "run", root / "b" / "run"
    shutil.copytree(tiny_run, older)
    shutil.copytree(tiny_run, newer)
    (newer / "checkpoints" / "last.pt").touch()
    assert find_run("latest", str(root)) == newer
    with pytest.raises(TinyMTError, match="no trained run"):
        find_run("latest", str(tmp_path / "empty"))


# ----------------------------------------------------------------------------- errors
def error_of(cfg, sentences=("他喜欢猫吗？",)) -> str:
    with pytest.raises(TinyMTError) as e:
        translate(cfg, list(sentences), stdout=io.StringIO())
    return str(e.value)


def test_missing_run_dir_is_a_clear_error(tmp_path):
    assert error_of(compose_translate(f"run={tmp_path / 'nope'}")) == f"run dir {tmp_path / 'nope'} does not exist"


def test_missing_checkpoint_names_the_expected_path(tiny_run):
    assert str(tiny_run / "checkpoints" / "avg.pt") in error_of(compose_translate(f"run={tiny_run}",
                                                                         "checkpoint=avg"))


def test_missing_tokenizer_is_a_clear_error(tiny_run, tmp_path):
    broken = tmp_path / "run"
    shutil.copytree(tiny_run, broken)
    shutil.rmtree(broken / "tokenizer")
    assert str(broken / "tokenizer") in error_of(compose_translate(f"run={broken}"))


def test_truncated_checkpoint_is_a_clear_error(tiny_run, tmp_path):
    broken = tmp_path / "run"
    shutil.copytree(tiny_run, broken)
    best = broken / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[:1000])
    assert "damaged or truncated" in error_of(compose_translate(f"run={broken}"))


def _resized(state: dict, size: int) -> None:
    """The checkpoint of a model of another vocabulary size (load_checkpoint refuses sizes
    that its own tensors contradict: a run's checkpoint holds both alike)."""
    state["vocab"].update(src_size=size, tgt_size=size)
    for name in ("src_embed.weight", "tgt_embed.weight", "output_proj.weight"):
        state["model"][name] = state["model"][name].new_zeros(size, state["model"][name].shape[1])


@pytest.mark.parametrize("forge,words", [
    (lambda s: _resized(s, 900), "vocab sizes 900/900"),
    (lambda s: s.update(tokenizer_sha256="0" * 64), "another tokenizer"),
], ids=["vocab sizes", "tokenizer"])
def test_checkpoint_from_another_config_is_a_clear_error(tiny_run, tmp_path, forge, words):
    """A checkpoint of another run (forged: the tiny run's own, its vocabulary sizes or its
    tokenizer's digest changed) next to this run's tokenizer."""
    state = load_checkpoint(tiny_run / "checkpoints" / "best.pt")
    forge(state)
    other = tmp_path / "other.pt"
    save_checkpoint(state, other)
    message = error_of(compose_translate(f"run={tiny_run}", f"checkpoint={other}"))
    assert message.startswith(f"{other} was trained with {words}")
    assert message.endswith("the checkpoint belongs to another run")


def test_input_file_errors(tiny_run, tmp_path):
    with pytest.raises(TinyMTError, match="file not found: .*missing.txt"):
        translate(compose_translate(f"run={tiny_run}", f"input={tmp_path / 'missing.txt'}"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes("他喜欢猫吗？\n".encode() + b"\xff\xfe broken\n")
    with pytest.raises(TinyMTError, match="line 2 is not valid UTF-8"):
        translate(compose_translate(f"run={tiny_run}", f"input={bad}"))


@pytest.mark.slow
def test_help_shows_the_examples_and_every_option():
    """--help: configs/translate.yaml's header (the examples) and footer, and every key of
    the translate config with its default; not train.py's config groups (model=, ...),
    which it would refuse."""
    r = cli("--help")
    assert r.returncode == 0, r.stderr
    help_ = OmegaConf.load(ROOT / "configs" / "translate.yaml").hydra.help
    assert r.stdout.startswith(help_.header) and help_.footer.strip() in r.stdout
    assert "Configuration groups" not in r.stdout and "\nmodel:" not in r.stdout
    config = r.stdout.split("== Config ==", 1)[1]
    composed = compose_translate("run=latest")
    for key in TranslateConfig.__dataclass_fields__:
        assert f"\n{key}:" in config, key
    assert f"  beam: {composed.decode.beam}\n" in config


def test_a_paragraph_is_translated_sentence_by_sentence(tiny_run):
    """A line of several sentences (Chinese: no spaces between them) gives each sentence's
    own translation, joined by a space, on one line; what holds no Chinese word is kept and
    counted in a warning; the line count stays the input's."""
    from conftest import sample_pairs

    sents = [p.zh for _, p in sample_pairs(3, 4)]
    alone = translate(compose_translate(f"run={tiny_run}"), sents)["translations"]
    warnings, out = [], io.StringIO()
    res = translate(compose_translate(f"run={tiny_run}"), ["".join(sents[:3]), f"{sents[3]} 123 :)", "https://x.org"],
                    stdout=out, warn=warnings.append)
    assert res["translations"] == [" ".join(alone[:3]), f"{alone[3]} 123 :)", "https://x.org"]
    assert out.getvalue().splitlines() == res["translations"]
    assert len(warnings) == 1 and warnings[0].startswith("2 segment(s)"), warnings


def test_a_span_the_vocabulary_cannot_spell_replaces_the_word_that_looks_at_it(tiny_run):
    """Luong et al.'s unknown-word replacement, written plainly: a number (no digit is in
    the built-in vocabulary) is read as one <unk>, and the output word whose pieces give
    that <unk> the most cross-attention (the last layer's heads averaged) is replaced by it; a URL inside the sentence is one span, not cut at its ``?``."""
    import torch

    from conftest import sample_pairs

    run = load_run(tiny_run, "best", "cpu", "outputs")
    run.model.eval()
    lines, expected = [], []
    for n, (_, pair) in enumerate(sample_pairs(12, 5)):
        at = 1 + n % (len(pair.zh) - 1)
        lines.append(f"{pair.zh[:at]}{n + 7}{pair.zh[at:]}")
        src = run.src_tokenizer.encode(normalize(f"{pair.zh[:at]}\ue000{pair.zh[at:]}"))
        out = translate_ids(run.model, [src])[0][0][0]
        with torch.no_grad():
            _, attn = run.model(torch.tensor([[*src, 3]]), torch.tensor([[2, *out]]),
                                need_weights=True)
        k = src.index(UNK_ID)
        looks = attn["cross"][-1][0].mean(0)[:len(out), k]  # the last layer's heads
        words = []  # output words as piece positions
        for i, piece in enumerate(run.tgt_tokenizer.pieces(out)):
            if piece.startswith("\u2581") or not words:
                words.append([])
            words[-1].append(i)
        best = max(range(len(words)), key=lambda w: float(sum(looks[i] for i in words[w])))
        texts = [run.tgt_tokenizer.decode([out[i] for i in w]) for w in words]
        lead, _, trail = re.fullmatch(r"(\W*)(.*?)(\W*)", texts[best]).groups()
        texts[best] = f"{lead}{n + 7}{trail}"  # the word replaced, its punctuation kept
        expected.append(" ".join(texts))
    got = translate(compose_translate(f"run={tiny_run}"), [*lines, "请看 https://x.org/a?b=1 的机票。"])
    assert got["translations"][:-1] == expected
    assert "https://x.org/a?b=1" in got["translations"][-1]


SPANS = st.one_of(st.integers(0, 10**6).map(str), st.builds(
    "{}.{}".format, st.integers(0, 999), st.integers(0, 99)), st.sampled_from(
    ["https://x.org/a?b=1", "www.tinymt.org", "li.lei@x.org", "10:30", "2,5"]))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spans=st.lists(SPANS, min_size=1, max_size=4), at=st.integers(0, 8))
def test_every_number_and_url_comes_back(tiny_run, spans, at):
    """Whatever the model writes, every number, URL and address of the source is in the
    translation as written: several placed on one word all stay (the one word's one span
    would keep only the last), and with no word to place them on they follow the text."""
    zh = "我请李雷帮我订了去北京的机票。"
    line = zh[:at] + " ".join(spans) + zh[at:]
    got = translate(compose_translate(f"run={tiny_run}"), [line], stdout=io.StringIO())["translations"][0]
    assert Counter(m.group() for m in SPAN.finditer(got)) >= Counter(spans), (line, got)


def test_a_span_past_what_the_model_reads_follows_the_text(tiny_run):
    """A number in the tail cut off an over-long sentence (the model never read it) is
    put after the translation, not in place of a word; the warning names the input line."""
    long = "我请李雷帮我订了去北京的机票" * 8  # one sentence of more pieces than the model takes
    warnings = []
    alone, got = (translate(compose_translate(f"run={tiny_run}"), ["他喜欢猫吗？", line],
                            stdout=io.StringIO(), warn=warnings.append)["translations"][1]
                  for line in (long, long + "12345"))
    assert got.endswith(" 12345") and got.count("12345") == 1
    assert got.split()[0] == alone.split()[0]
    assert warnings[0].startswith("line 2: a sentence of ") and "longer than the model" in \
        warnings[0]


@given(st.text())
def test_a_words_punctuation_is_cut_off_as_the_plain_pattern_does(word):
    """Property: an output word's punctuation before and after, scanned in linear time, is
    what the plain pattern ``(\\W*)(.*?)(\\W*)`` matches."""
    assert _parts(word) == re.fullmatch(r"(\W*)(.*?)(\W*)", word, re.DOTALL).groups()


# ----------------------------------------------------------------------------- inline markup
@given(st.lists(st.sampled_from(["char", "char", "open", "close"]), max_size=30), st.data())
def test_tags_go_around_the_words_that_read_their_element(ops, data):
    """Property: any well-formed inline markup in a source sentence (elements nested, some
    closed in the sentence after, some opened in the one before), any output words and any
    word order (which output word reads each source character): the tags come out once
    each, well-formed, the words unchanged between them; in order (a word to a character at
    most), each element wraps exactly the words that read its characters (punctuation
    outside; at the source's start or end: the output's), an empty one none."""
    marks, stack, n, pairs = [], [], 0, 0
    for op in ops:  # the source: characters and tags, a stand-in's code 2k / 2k + 1
        if op == "char":
            n += 1
        elif op == "open" or not stack:
            marks.append((n, chr(TAG + 2 * pairs + (op == "close"))))
            stack += [marks[-1][1]] if op == "open" else []
            pairs += 1
        else:
            marks.append((n, chr(ord(stack.pop()) + 1)))
    n = max(n, 1)
    in_order = data.draw(st.booleans())
    words = data.draw(st.lists(st.text(alphabet="ab.,(", min_size=1, max_size=4),
                               min_size=n if in_order else 1, max_size=2 * n))
    word_of = [i * len(words) // n for i in range(n)] if in_order else \
        data.draw(st.lists(st.integers(0, len(words) - 1), min_size=n, max_size=n))

    def readers(a, b):  # the output words reading source characters a..b
        return sorted({word_of[i] for i in range(a, b)}) or [0]
    out = _place_tags(list(words), marks, n, readers)
    text = "".join(out)
    assert sorted(c for c in text if ord(c) >= TAG) == sorted(m for _, m in marks)
    assert [re.sub("[\U000f0000-\U000ffffd]", "", t) for t in out] == words
    where, open_ = {m for _, m in marks}, []
    for c in (c for c in text if ord(c) >= TAG):  # well-formed: nested, lone end tags outside
        if (ord(c) - TAG) % 2 == 0:
            open_.append(c)
        elif chr(ord(c) - 1) in where:
            assert open_.pop() == chr(ord(c) - 1), text
        else:
            assert not open_, text
    if in_order:  # a word to a character at most
        for offset, mark in marks:
            close = chr(ord(mark) + 1)
            if (ord(mark) - TAG) % 2 or close not in where:
                continue
            end = next(o for o, m in marks if m == close)
            inside = re.search(f"{mark}(.*){close}", text).group(1)
            got = re.sub("[\U000f0000-\U000ffffd]", "", inside)
            assert end > offset or got == "", text  # an empty element wraps nothing
            if end > offset:
                want = readers(offset, end)  # (from the output's start / to its end)
                lo, hi = 0 if offset == 0 else want[0], len(words) if end == n else want[-1] + 1
                assert got.strip(".,(") == "".join(words[lo:hi]).strip(".,("), (text, offset, end)
