"""scripts/export.py and translate.py engine=ct2 against our own decoder.

The float32 export is exact: CTranslate2's log-probabilities of forced targets are ours, its
greedy output is ours token for token, and its beam search is ours with its rule
(``beam_rule=full``: the beam stays full) token for token, n-best lists and scores. Every architecture option converts exactly; int8 differs little;
refusals and failures are one line and leave nothing behind; loading runs no code.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import forked
import numpy as np
import pytest
import torch

import tinymt.config  # noqa: F401  (registers the schemas)
from conftest import (
    NO_CT2,
    REPO_ROOT,
    compose_translate,
    make_pairs,
    run_script_in_process,
    sample_pairs,
)
from tinymt.batching import collate
from tinymt.checkpoint import load_checkpoint, save_checkpoint
from tinymt.config import ModelConfig
from tinymt.ct2 import export_attention, export_run, load_export, translate_export_ids
from tinymt.ct2.export import meta_digest
from tinymt.data import normalize
from tinymt.decoding import max_output_length, translate_ids
from tinymt.errors import TinyMTError
from tinymt.heads.gates import prune_weights
from tinymt.model import Transformer
from tinymt.rundir import LoadedRun, load_run
from tinymt.tokenizer import Tokenizer
from tinymt.translate import translate

# tinymt.ct2 imports ctranslate2 only when used: the imports above work without it
pytest.importorskip("ctranslate2", reason="CTranslate2 is the optional extra .[ct2] "
                    "(make test installs it): pip install -e '.[ct2]'")

SCRIPTS = REPO_ROOT / "scripts"
SCORE_TOL = 1e-4  # n-best scores, CTranslate2 vs the reference on our decoder (measured 3.5e-6)
LOGP_TOL = 1e-4  # per-token log-probabilities of forced targets (measured 1.7e-6)


def cli(script: str, *args: str, env: dict | None = None, cwd: Path = REPO_ROOT,
        prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {**(env or os.environ)}
    env.pop("HYDRA_FULL_ERROR", None)
    return forked.run([sys.executable, *prefix, str(SCRIPTS / f"{script}.py"), *args],
                      capture_output=True, text=True, cwd=cwd, env=env, timeout=180)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def run(tiny_run) -> LoadedRun:
    return load_run(str(tiny_run), "best", "cpu")


@pytest.fixture(scope="module")
def exports(tiny_run, run, tmp_path_factory) -> dict[str, Path]:
    """The tiny run exported, float32 through the real script, int8 by ``export_run``."""
    tmp = tmp_path_factory.mktemp("exports")
    r = cli("export", f"run={tiny_run}", f"out={tmp / 'none'}")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"-> {tmp / 'none'}" in r.stdout
    return {"none": tmp / "none", "int8": export_run(run, tmp / "int8", "int8")}


@pytest.fixture(scope="module")
def src_ids(run) -> list[list[int]]:
    """Built-in corpus sentences (the tiny run's language pair), as our source ids."""
    return [run.src_tokenizer.encode(normalize(p.zh)) for _, p in sample_pairs(7, 80)]


# ----------------------------------------------------------------------------- exactness
def test_the_export_folder(exports):
    names = {p.name for p in exports["none"].iterdir()}
    assert names == {"model.bin", "config.json", "shared_vocabulary.json", "spm.model",
                     "tinymt_export.json"}
    assert (exports["int8"] / "model.bin").stat().st_size < \
        0.6 * (exports["none"] / "model.bin").stat().st_size  # 8-bit weights


def test_forced_targets_score_as_in_our_model(run, exports, src_ids):
    """Per-token log p of our greedy outputs (EOS included), teacher-forced in our model and
    scored by CTranslate2: the numbers themselves, before any search."""
    ex = load_export(exports["none"], "cpu", threads=1)
    hyps = [h[0][0] for h in translate_ids(run.model, src_ids, beam=1)]
    results = ex.translator.score_batch([run.src_tokenizer.pieces(s) for s in src_ids],
                                        [run.tgt_tokenizer.pieces(h) for h in hyps])
    b = collate(src_ids, hyps)
    with torch.inference_mode():
        logits = run.model.logits(run.model(b.src, b.tgt_in)[0])
    ours = logits.log_softmax(-1).gather(-1, b.tgt_out[..., None])[..., 0]  # (B, T)
    worst = 0.0
    for k, r in enumerate(results):
        assert len(r.log_probs) == len(hyps[k]) + 1  # + EOS: the source EOS was added too
        worst = max(worst, max(abs(a - c) for a, c in zip(ours[k].tolist(), r.log_probs)))
    assert worst < LOGP_TOL


def test_the_alignment_heads_are_our_last_layer_s_cross_attention(run, exports, src_ids):
    """What the span copying reads (tinymt.translate.copy_spans): CTranslate2's attention,
    teacher-forced, is our last decoder layer's cross-attention, its heads averaged."""
    ex = load_export(exports["none"], "cpu", threads=1)
    for src, (hyp, _) in zip(src_ids[:12], (h[0] for h in translate_ids(run.model, src_ids[:12]))):
        b = collate([src], [hyp])
        with torch.inference_mode():
            cross = run.model(b.src, b.tgt_in, need_weights=True)[1]["cross"][-1][0]  # (h, T, S)
        ours = cross.mean(0)[:len(hyp), :len(src)].numpy()
        assert np.abs(export_attention(ex, src, hyp) - ours).max() < 1e-4


def test_greedy_is_ours_token_for_token(run, exports, src_ids):
    ex = load_export(exports["none"], "cpu", threads=1)
    ours = translate_ids(run.model, src_ids, beam=1, batch_tokens=300)
    theirs = translate_export_ids(ex, src_ids, beam=1, batch_tokens=300)
    assert [h[0][0] for h in theirs] == [h[0][0] for h in ours]
    caps = [max_output_length(len(s) + 1, 1.5, 10, run.model.max_positions) for s in src_ids]
    assert any(len(h[0][0]) == c for h, c in zip(ours, caps))  # the cap is exercised too


@pytest.mark.parametrize("beam,nbest,len_penalty", [(5, 5, 1.0), (5, 1, 1.0), (3, 3, 0.6),
                                                    (4, 2, 0.0)])
def test_beam_search_is_ours_token_for_token(run, exports, src_ids, beam, nbest, len_penalty):
    """CTranslate2's beam search against ours with its rule (``beam_rule=full``): the n-best
    lists token for token, the scores within ``SCORE_TOL``. Ours with its default rule
    (``shrink``) may differ on a few sentences: counted, not asserted."""
    ex = load_export(exports["none"], "cpu", threads=1)
    theirs = translate_export_ids(ex, src_ids, beam=beam, nbest=nbest, len_penalty=len_penalty)
    full = translate_ids(run.model, src_ids, beam=beam, nbest=nbest, len_penalty=len_penalty,
                         beam_rule="full")
    shrink = translate_ids(run.model, src_ids, beam=beam, len_penalty=len_penalty)
    assert [[h for h, _ in hyps] for hyps in theirs] == [[h for h, _ in hyps] for hyps in full]
    assert all(len(hyps) == nbest for hyps in theirs)
    worst = max(abs(a - b) for got, want in zip(theirs, full)
                for (_, a), (_, b) in zip(got, want))
    assert worst < SCORE_TOL
    caps = [max_output_length(len(s) + 1, 1.5, 10, run.model.max_positions) for s in src_ids]
    differ = sum(a[0][0] != b[0][0] for a, b in zip(theirs, shrink))
    print(f"beam {beam}: max n-best score difference {worst:.1e}; {differ} of {len(src_ids)} "
          f"best outputs differ from beam_rule=shrink; "
          f"{sum(len(h[0][0]) == c for h, c in zip(theirs, caps))} reach the cap")


def test_int8_differs_little(run, exports, src_ids):
    f32 = load_export(exports["none"], "cpu", threads=1)
    int8 = load_export(exports["int8"], "cpu", threads=1)
    same = sum(a[0][0] == b[0][0] for a, b in zip(translate_export_ids(f32, src_ids),
                                                  translate_export_ids(int8, src_ids)))
    assert same >= 0.9 * len(src_ids), f"int8 greedy equals float32 on {same} of {len(src_ids)}"


# ----------------------------------------------------------------------------- every option
OPTIONS = {
    "post-LN": dict(norm_first=False),
    "gelu, learned positions": dict(activation="gelu", positional="learned"),
    "untied embeddings": dict(tie_embeddings=False),
    "separate vocabularies, tied": dict(shared=False),
    "separate vocabularies, untied, post-LN": dict(shared=False, tie_embeddings=False,
                                                    norm_first=False),
    "pruned heads": dict(pruned=True),
}


@pytest.fixture(scope="module")
def toy_tokenizers(tmp_path_factory) -> tuple[Tokenizer, Tokenizer]:
    tmp = tmp_path_factory.mktemp("toy_spm")
    pairs = make_pairs(300, 0)
    return (Tokenizer.train([p[0] for p in pairs], tmp / "src.model", 48),
            Tokenizer.train([p[1] for p in pairs], tmp / "tgt.model", 40))


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_architecture_option_converts_exactly(name, run, toy_tokenizers, tmp_path):
    """A model of each option with every weight random (biases, norms, embeddings too):
    forced targets score the same, greedy output is the same."""
    opts = dict(OPTIONS[name])
    shared, pruned = opts.pop("shared", True), opts.pop("pruned", False)
    src_tok, tgt_tok = (run.src_tokenizer, run.tgt_tokenizer) if shared else toy_tokenizers
    cfg = ModelConfig(d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=48,
                      max_positions=40, **opts)
    torch.manual_seed(0)
    model = Transformer(cfg, src_tok.vocab_size, tgt_tok.vocab_size, shared_vocab=shared).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        if pruned:  # heads switched off: their W_O columns are zero
            model.load_state_dict(prune_weights(model.state_dict(), [
                ("encoder_self", 0, 1), ("encoder_self", 1, 3), ("cross", 0, 0)], 4))
    state = {"model_config": dataclasses.asdict(cfg), "step": 0}
    loaded = LoadedRun(model, src_tok, tgt_tok, {"data": {}}, tmp_path, tmp_path / "x.pt", state)
    ex = load_export(export_run(loaded, tmp_path / "export"), "cpu", threads=1)

    g = torch.Generator().manual_seed(1)
    srcs = [torch.randint(4, src_tok.vocab_size, (n,), generator=g).tolist() for n in range(2, 14)]
    tgts = [torch.randint(4, tgt_tok.vocab_size, (n,), generator=g).tolist() for n in range(2, 14)]
    results = ex.translator.score_batch([src_tok.pieces(s) for s in srcs],
                                        [tgt_tok.pieces(t) for t in tgts])
    b = collate(srcs, tgts)
    with torch.inference_mode():
        logits = model.logits(model(b.src, b.tgt_in)[0])
    ours = logits.log_softmax(-1).gather(-1, b.tgt_out[..., None])[..., 0]
    for k, r in enumerate(results):
        assert ours[k, : len(tgts[k]) + 1].tolist() == pytest.approx(r.log_probs, abs=LOGP_TOL)
    assert [h[0][0] for h in translate_export_ids(ex, srcs)] == [
        h[0][0] for h in translate_ids(model, srcs)]


@pytest.mark.slow
def test_an_option_the_export_does_not_know_is_refused(tiny_run, tmp_path):
    """Through the real script: a checkpoint whose model config has an option or a value
    this tinymt does not know (as a newer tinymt might write), refused by the checkpoint's
    loader in one line naming it; no folder. (Every value it knows converts exactly.)"""
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    best = copy / "checkpoints" / "best.pt"
    state = load_checkpoint(best)
    for key, value in (("rotary_positions", True), ("activation", "swish")):
        save_checkpoint({**state, "model_config": {**state["model_config"], key: value}}, best)
        r = cli("export", f"run={copy}", f"out={tmp_path / 'out'}")
        line = one_error_line(r)
        assert str(best) in line and key in line, line
        assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- translate.py
@pytest.mark.slow
def test_translate_engine_ct2_files_and_ref(tiny_run, exports, tmp_path):
    """The real script with input=, output= and ref=: the lines of the torch engine (greedy
    is the same search), the BLEU line, one output line per input line."""
    src, ref, out = tmp_path / "in.zh", tmp_path / "ref.en", tmp_path / "out.en"
    lines = ["他喜欢猫吗？", "", "我们每天去学校。", "那只小猫昨天在公园里追了一只蝴蝶。"]
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("Does he like cats?\n\nWe go to school every day.\nThe kitten chased a "
                   "butterfly in the park yesterday.\n", encoding="utf-8")
    r = cli("translate", "engine=ct2", f"model_dir={exports['none']}", f"input={src}",
            f"output={out}", f"ref={ref}")
    assert r.returncode == 0, r.stderr[-2000:]
    torch_engine = translate(compose_translate(f"run={tiny_run}", f"input={src}", f"ref={ref}"))
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == torch_engine["translations"]
    assert f"BLEU {torch_engine['bleu']:.2f}" in r.stderr


def test_translate_engine_ct2_nbest(exports, capsys):
    res = translate(compose_translate("engine=ct2", f"model_dir={exports['none']}",
                                  "decode.beam=3", "decode.nbest=3"), ["他喜欢猫吗？", ""])
    out = capsys.readouterr().out.split("\n")
    scores = [float(line.split("\t")[0]) for line in out[:3]]
    assert scores == sorted(scores, reverse=True) and all(s < 0 for s in scores)
    assert out[3] == "" and out[4].startswith("nan\t")  # the empty line's block
    assert res["engine"] == "ct2" and res["model"] == str(exports["none"])


@pytest.mark.slow
def test_export_help_shows_examples():
    r = cli("export", "--help")
    assert r.returncode == 0 and "quantization=int8" in r.stdout and "engine=ct2" in r.stdout
    assert "out" in r.stdout and "checkpoint" in r.stdout


# ----------------------------------------------------------------------------- failures
@pytest.mark.slow
def test_without_ctranslate2_one_line_and_tinymt_still_works(tiny_run, exports, tmp_path,
                                                             monkeypatch):
    r = cli("export", f"run={tiny_run}", f"out={tmp_path / 'out'}", prefix=("-c", NO_CT2))
    assert one_error_line(r) == "error: CTranslate2 is not installed: pip install -e '.[ct2]'"
    assert not (tmp_path / "out").exists()
    with monkeypatch.context() as m:  # (in this process: an import of it fails the same way)
        m.setitem(sys.modules, "ctranslate2", None)
        with pytest.raises(TinyMTError) as e:
            translate(compose_translate("engine=ct2", f"model_dir={exports['none']}"), ["他喜欢猫吗？"])
    assert str(e.value) == "CTranslate2 is not installed: pip install -e '.[ct2]'"
    # the torch engine is lazy about it
    r = cli("translate", f"run={tiny_run}", "device=cpu", "他喜欢猫吗？", prefix=("-c", NO_CT2))
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]


@pytest.mark.slow
def test_a_failed_export_leaves_nothing(tiny_run, tmp_path):
    """A real write failure halfway (a file-size limit: model.bin cannot be written whole):
    one line, no out folder, no temp folder."""
    limit = ("import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN);"
             " resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000)); "
             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
    r = cli("export", f"run={tiny_run}", f"out={tmp_path / 'out'}", prefix=("-c", limit))
    line = one_error_line(r)
    assert f"cannot write {tmp_path / 'out'}" in line and "nothing was left there" in line
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_never_overwritten(run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep\n")
    with pytest.raises(TinyMTError, match="already exists"):
        export_run(run, out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


class Planted:
    """Unpickling this object creates a folder."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.slow
def test_loading_never_runs_code(tiny_run, exports, tmp_path):
    marker = tmp_path / "pwned"
    # the checkpoint to export: tensors only (weights_only), a planted object is refused
    evil = tmp_path / "evil.pt"
    state = torch.load(tiny_run / "checkpoints" / "best.pt", weights_only=True)
    torch.save({**state, "extra": Planted(marker)}, evil)
    r = cli("export", f"run={tiny_run}", f"checkpoint={evil}", f"out={tmp_path / 'out'}")
    assert "objects other than tensors" in one_error_line(r)
    # the export: plain JSON and CTranslate2's binary; a pickle put in its place is refused
    copy = tmp_path / "copy"
    shutil.copytree(exports["none"], copy)
    torch.save({"w": Planted(marker)}, copy / "model.bin")
    with pytest.raises(TinyMTError, match="model.bin was changed after export"):
        load_export(copy, "cpu")
    (copy / "tinymt_export.json").write_text("{'format': __import__('os')}")
    with pytest.raises(TinyMTError, match="is not valid JSON"):
        load_export(copy, "cpu")
    assert not marker.exists() and not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- integrity
SENTENCE = "他喜欢猫吗？"


def private_export(exports, tmp_path) -> Path:
    """A copy of the float32 export to damage."""
    return Path(shutil.copytree(exports["none"], tmp_path / "export"))


def translate_ct2_refused(model_dir: Path, capsys) -> str:
    """scripts/translate.py engine=ct2 model_dir=... (Hydra composition and main, in this
    process): its one error line."""
    status, err = run_script_in_process("translate", [
        "engine=ct2", f"model_dir={model_dir}", "device=cpu", SENTENCE], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    return lines[0]


def test_an_edited_vocabulary_is_refused(exports, tmp_path, capsys):
    """Only the sentencepiece model was hashed: two pieces swapped in shared_vocabulary.json
    changed the translations silently."""
    export = private_export(exports, tmp_path)
    vocab_file = export / "shared_vocabulary.json"
    vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    vocab[10], vocab[11] = vocab[11], vocab[10]
    vocab_file.write_text(json.dumps(vocab), encoding="utf-8")
    line = translate_ct2_refused(export, capsys)
    assert str(vocab_file) in line and "was changed after export; re-export" in line


def test_a_truncated_or_missing_model_file_is_one_line(exports, tmp_path, capsys):
    """model.bin cut short, then config.json missing: one line naming the file."""
    export = private_export(exports, tmp_path)
    model = export / "model.bin"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    line = translate_ct2_refused(export, capsys)
    assert str(model) in line and "was changed after export; re-export" in line
    shutil.copyfile(exports["none"] / "model.bin", model)
    (export / "config.json").unlink()
    line = translate_ct2_refused(export, capsys)
    assert str(export / "config.json") in line and "missing" in line and "re-export" in line


def _meta(export: Path) -> dict:
    return json.loads((export / "tinymt_export.json").read_text(encoding="utf-8"))


def sign(meta: dict) -> dict:
    """``meta`` with a matching ``meta_sha256``, as a forger would."""
    return {**meta, "meta_sha256": meta_digest(meta)}


def flip(data: bytes, text: str) -> bytes:
    """``data`` with the lowest bit of the first byte of ``text`` in it flipped."""
    i = data.index(text.encode())
    return data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]


META_DAMAGE = {  # how tinymt_export.json is damaged -> words of the one line
    "truncated": (lambda b, m: b[: len(b) // 2], "is not valid JSON"),
    "not JSON": (lambda b, m: b"format: tinymt-ct2\n", "is not valid JSON"),
    "not UTF-8": (lambda b, m: b.replace(b'"format"', b'"\xff\xfermat"'), "not valid UTF-8"),
    "a list": (lambda b, m: b"[1, 2]", "not a tinymt CTranslate2 export"),
    "bit-flipped digest": (lambda b, m: flip(b, m["files"]["model.bin"]),
                           "was changed after export"),
    "bit-flipped run dir": (lambda b, m: flip(b, m["from"]["run_dir"]),
                            "was changed after export"),
    "max_positions a string": (lambda b, m: {**m, "max_positions": "64"}, "max_positions"),
    "data a number": (lambda b, m: {**m, "data": 5}, "data"),
    "files missing": (lambda b, m: {k: v for k, v in m.items() if k != "files"}, "files"),
    "files a list": (lambda b, m: {**m, "files": list(m.get("files", {}))}, "files"),
    "a file outside": (lambda b, m: {**m, "files": {**m.get("files", {}),
                                                    "../x.bin": "0" * 64}}, "files"),
    "a digest that is not one": (lambda b, m: {**m, "files": {**m["files"], "model.bin": 5}},
                                 "model.bin was changed after export"),
    "another quantization": (lambda b, m: {**m, "quantization": "int4"}, "quantization"),
    "max_positions not the model's": (lambda b, m: {**m, "max_positions": 63},
                                      "max_positions: 63, expected 64"),
    "a model option unknown": (lambda b, m: {**m, "model": {**m["model"], "rotary": True}},
                               "tinymt_export.json is damaged (bad model_config: rotary"),
    "another model": (lambda b, m: {**m, "model": {**m["model"], "n_heads": 4}},
                      "model.bin is not what scripts/export.py writes"),
}


@pytest.mark.parametrize("damage", list(META_DAMAGE))
def test_a_damaged_export_description_is_one_line(exports, tmp_path, capsys, damage):
    """tinymt_export.json truncated, bit-flipped, of the wrong shape or types: one line
    through translate.py engine=ct2, never a traceback and never a silent load. (A
    description edited into another valid one is re-signed here, as a forger would:
    its shape is checked all the same.)"""
    export = private_export(exports, tmp_path)
    file = export / "tinymt_export.json"
    edit, words = META_DAMAGE[damage]
    got = edit(file.read_bytes(), _meta(export))
    if isinstance(got, dict):
        got = json.dumps(sign(got), indent=2).encode()
    assert got != file.read_bytes()
    file.write_bytes(got)
    line = translate_ct2_refused(export, capsys)
    assert words in line, line


def test_every_bit_flip_of_the_description_is_caught(exports, tmp_path):
    """Any one bit of tinymt_export.json flipped: a one-line error, or (an escape spelt
    differently) the same description."""
    export = private_export(exports, tmp_path)
    file = export / "tinymt_export.json"
    good, original = file.read_bytes(), _meta(export)
    with open(file, "r+b", buffering=0) as f:  # one byte rewritten in place: fast
        for i, byte in enumerate(good):
            f.seek(i)
            f.write(bytes([byte ^ 1 << (i % 8)]))
            try:
                load_export(export, "cpu", threads=1)
                assert _meta(export) == original, f"byte {i} flipped was loaded"
            except TinyMTError:
                pass
            f.seek(i)
            f.write(bytes([byte]))


def resign(export: Path, name: str, data: bytes) -> Path:
    """``export/name`` rewritten as ``data``, its digest and the description's recomputed, as
    a forger would: every digest matches."""
    import hashlib

    (export / name).write_bytes(data)
    meta = _meta(export)
    meta["files"][name] = hashlib.sha256(data).hexdigest()
    (export / "tinymt_export.json").write_text(json.dumps(sign(meta)))
    return export / name


def parse_model_bin(data: bytes) -> tuple[list, list, list]:
    """A model.bin as CTranslate2's ``ModelSpec._serialize`` writes it, all of it: ``[version,
    spec name, revision]``, ``[[name, shape, type id, bytes]]``, ``[[alias, target]]``."""
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        pos += n
        return data[pos - n:pos]

    def num(fmt: str) -> int:
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    def string() -> str:
        return take(num("<H"))[:-1].decode()

    head = [num("<I"), string(), num("<I")]
    variables = [[string(), [num("<I") for _ in range(num("<B"))], num("<B"), take(num("<I"))]
                 for _ in range(num("<I"))]
    return head, variables, [[string(), string()] for _ in range(num("<I"))]


def write_model_bin(head: list, variables: list, aliases: list) -> bytes:
    """:func:`parse_model_bin`'s inverse."""
    def string(s: str) -> bytes:
        return struct.pack("<H", len(s.encode()) + 1) + s.encode() + b"\0"

    out = struct.pack("<I", head[0]) + string(head[1]) + struct.pack("<II", head[2],
                                                                      len(variables))
    for name, shape, dtype, raw in variables:
        out += string(name) + struct.pack(f"<B{len(shape)}IBI", len(shape), *shape, dtype,
                                          len(raw)) + raw
    return out + struct.pack("<I", len(aliases)) + b"".join(string(a) + string(t)
                                                            for a, t in aliases)


def _edit_bin(edit):
    """A model.bin forgery: ``edit(head, {name: variable}, aliases)`` changes them in place."""
    def forge(data: bytes) -> bytes:
        head, variables, aliases = parse_model_bin(data)
        assert write_model_bin(head, variables, aliases) == data  # the forger's tools are exact
        edit(head, {v[0]: v for v in variables}, aliases)
        return write_model_bin(head, variables, aliases)
    return forge


def _var(name: str, field: int, value):
    """A model.bin forgery: the variable ``name``'s field (0 name, 1 shape, 2 type id,
    3 bytes) set to ``value``."""
    return _edit_bin(lambda head, variables, aliases: variables[name].__setitem__(field, value))


def _json(edit):
    """A config.json forgery: ``edit(config)`` returns the new one."""
    return lambda data: json.dumps(edit(json.loads(data)), indent=2).encode()


def _set(key: str, value):
    return _json(lambda c: {**c, key: value})


FFN = "encoder/layer_0/ffn/linear_0/weight"  # (d_ff, d_model)
VOCAB = "shared_vocabulary.json"
STRUCTURE_FORGERIES = {  # re-signed: file, how it is rewritten, the words naming the change
    "an empty vocabulary": (VOCAB, _json(lambda v: []), "0: none, expected '<pad>'"),
    "all <unk>": (VOCAB, _json(lambda v: ["<unk>"] * len(v)), "0: '<unk>', expected '<pad>'"),
    "cut to 5 tokens": (VOCAB, _json(lambda v: v[:5]), "5: none"),
    "two pieces swapped": (VOCAB, _json(lambda v: [*v[:4], v[5], v[4], *v[6:]]), "4: "),
    "source bos added": ("config.json", _set("add_source_bos", True), "add_source_bos"),
    "source bos 1 for true": ("config.json", _set("add_source_eos", 1), "add_source_eos"),
    "another epsilon": ("config.json", _set("layer_norm_epsilon", 0.1), "layer_norm_epsilon"),
    "another decoder start": ("config.json", _set("decoder_start_token", "</s>"),
                              "decoder_start_token"),
    "another unk": ("config.json", _set("unk_token", "<pad>"), "unk_token"),
    "a field added": ("config.json", _set("zz_extra", 1), "zz_extra"),
    "a field removed": ("config.json", _json(lambda c: {k: v for k, v in c.items()
                                                        if k != "eos_token"}), "eos_token"),
    "more heads": ("model.bin", _var("encoder/num_heads", 3, struct.pack("<h", 4)),
                   "encoder/num_heads: ((), 'int16', 2, b'\\x04\\x00'), expected"),
    "post-LN": ("model.bin", _var("decoder/pre_norm", 3, b"\0"), "decoder/pre_norm"),
    "gelu": ("model.bin", _var("encoder/activation", 3, b"\1"), "encoder/activation"),
    "a variable renamed": ("model.bin", _var(FFN, 0, FFN.replace("layer_0", "layer_9")),
                           f"{FFN}: none, expected ((64, 32), 'float32', 8192, None)"),
    "a shape transposed": ("model.bin", _var(FFN, 1, [32, 64]), f"{FFN}: ((32, 64),"),
    "another dtype": ("model.bin", _var(FFN, 2, 3), f"{FFN}: ((64, 32), 'int32'"),
    "an alias dropped": ("model.bin", _edit_bin(lambda h, v, a: a.pop()),
                         "encoder/position_encodings"),
    "an alias to nothing": ("model.bin", _edit_bin(lambda h, v, a: a[0].__setitem__(1, "x")),
                            "decoder/projection/weight"),
    "another revision": ("model.bin", _edit_bin(lambda h, v, a: h.__setitem__(2, 6)),
                         "format: (6, 'TransformerSpec', 6)"),
    "a header cut short": ("model.bin", lambda data: data[:40], "truncated or malformed at "
                           "byte 40"),
    "bytes after the end": ("model.bin", lambda data: data + b"\0", "truncated or malformed"),
}


@pytest.mark.parametrize("forgery", STRUCTURE_FORGERIES)
def test_a_forged_model_is_refused_before_ctranslate2_reads_it(exports, tmp_path, capsys,
                                                                monkeypatch, forgery):
    """A vocabulary, config.json or model.bin rewritten and every digest recomputed, as a
    forger would: CTranslate2 would load most of these and translate otherwise, silently.
    Each is checked against what scripts/export.py writes for the model the description
    names, before CTranslate2 reads the folder: one line naming the file and the first
    difference, exit 2."""
    import ctranslate2

    name, forge, words = STRUCTURE_FORGERIES[forgery]
    export = private_export(exports, tmp_path)
    file = resign(export, name, forge((export / name).read_bytes()))
    monkeypatch.setattr(ctranslate2, "Translator", lambda *a, **k: pytest.fail("loaded"))
    line = translate_ct2_refused(export, capsys)
    assert f"{file} is not what scripts/export.py writes for this model with CTranslate2 " \
        f"{ctranslate2.__version__} (" in line, line
    assert words in line and line.endswith("re-export the model"), line
    if forgery == "more heads":  # the script in its own process too: exit 2, the same line
        assert one_error_line(cli("translate", "engine=ct2", f"model_dir={export}",
                                  "device=cpu", SENTENCE)) == line


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_weights_stored_once_load_all_the_same(run, tmp_path, quantization):
    """CTranslate2 stores an array equal to an earlier one as an alias of it (int8: with the
    earlier one's scale alone): two equal weight matrices, which an untrained model of the
    config has not, export to another model.bin layout; it loads all the same."""
    model = copy.deepcopy(run.model)
    with torch.no_grad():
        model.encoder_layers[1].ff.linear1.weight.copy_(model.encoder_layers[0].ff.linear1.weight)
    export = export_run(dataclasses.replace(run, model=model), tmp_path / "x", quantization)
    aliases = parse_model_bin((export / "model.bin").read_bytes())[2]
    assert ["encoder/layer_1/ffn/linear_0/weight", FFN] in aliases
    ex = load_export(export, "cpu", threads=1)
    src = [run.src_tokenizer.encode(normalize(SENTENCE))]
    if quantization == "none":  # (exact)
        assert translate_export_ids(ex, src)[0][0][0] == translate_ids(model, src)[0][0][0]
