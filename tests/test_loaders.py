"""The one loader of each kind of file, fuzzed: checkpoints (``load_checkpoint``), a data
cache entry (``load_complete``), a run's ``config.yaml`` (``load_config_file``), JSON files
(``files.load_json``: ``metrics.json``, the cache's ``COMPLETE`` and ``stats.json``) and an
export's ``tinymt_export.json`` (``read_meta``).

Every case is damage a file can suffer or, for the files that may come from elsewhere
(checkpoints, configs, exports), a forgery it can carry: truncations at several offsets,
bit flips, junk, an empty file, a FIFO (must not block), a folder, a device, type swaps of
each field of a valid file, size bombs (a huge sparse file, a zip bomb, zip records read
twice, a YAML alias bomb, nesting 100,000 deep). The data cache is tinymt's own: its
damage, not forgeries under a recomputed ``COMPLETE``. The answer is the file loaded (only where
the damage may leave it valid: a flipped bit inside a weight) or one ``TinyMTError`` line
naming the file: never another exception. The size bombs run in a child process whose peak
memory is measured. (tests/test_damaged_files.py: damaged files through the scripts.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import faulthandler
import hashlib
import json
import os
import random
import shutil
import sys
import zipfile
from pathlib import Path

import forked
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from conftest import REPO_ROOT, compose_train, make_pairs, write_text_corpus
from tinymt.checkpoint import FORMAT, MAX_CHECKPOINT_BYTES, load_checkpoint
from tinymt.config import MAX_CONFIG_BYTES, DataConfig, ModelConfig, load_config_file
from tinymt.ct2.engine import read_meta
from tinymt.ct2.export import FORMAT as EXPORT_FORMAT
from tinymt.ct2.export import META, meta_digest
from tinymt.data import prepare
from tinymt.data.cache import COMPLETE, load_complete
from tinymt.errors import TinyMTError
from tinymt.files import load_json
from tinymt.model import Transformer
from tinymt.trainer.state import restore, resume_config, rng_state

GIB = 1 << 30
read_config = lambda p: load_config_file(p, "the run's config")  # noqa: E731
read_metrics = lambda p: load_json(p, "the run's metrics")  # noqa: E731
MEMORY_BOUND_MIB = 64  # what the size bombs may add to the peak memory of the process
QUIET = lambda *_: None  # noqa: E731


# ----------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def watchdog(seconds: float = 60):
    """A loader that blocks (a FIFO opened) ends the process after ``seconds``, with the
    stack of where it blocked, instead of hanging the suite."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def one_line(load, arg, *words: str, named: Path | None = None, case: str = "") -> str:
    """``load(arg)`` refuses in one TinyMTError line naming ``named`` (default: ``arg``, the
    file) and holding ``words``; any other exception fails the test. A FIFO that blocked
    would end the process after 60 s."""
    with watchdog(), pytest.raises(TinyMTError) as e:
        load(arg)
    message = str(e.value)
    assert "\n" not in message and str(named or arg) in message, (case, message)
    for word in words:
        assert word in message, (case, message)
    return message


def loaded_or_one_line(load, path: Path, case: str = "") -> str | None:
    """Bytes that may still be a valid file (a flip inside a weight): loaded, or one line."""
    try:
        load(path)
    except TinyMTError as e:
        assert "\n" not in str(e) and str(path) in str(e), (case, str(e))
        return str(e)
    return None


def truncations(data: bytes) -> dict[str, bytes]:
    n = len(data)
    return {"empty": b"", "1 byte": data[:1], "10 bytes": data[:10],
            "a quarter": data[: n // 4], "half": data[: n // 2],
            "three quarters": data[: 3 * n // 4], "all but 22 bytes": data[: n - 22],
            "all but 1 byte": data[: n - 1]}


def junk(data: bytes) -> dict[str, bytes]:
    rng = random.Random(7)
    return {"64 random bytes": rng.randbytes(64), "random bytes, same size": rng.randbytes(len(data)),
            "text": b"hello, world\n", "zeros": bytes(len(data)), "a pickle": b"\x80\x02}q\x00.",
            "zip magic, then junk": b"PK\x03\x04" + rng.randbytes(200)}


def flips(data: bytes, n: int, seed: int = 0) -> dict[str, bytes]:
    rng, out = random.Random(seed), {}
    for _ in range(n):
        b, at = bytearray(data), rng.randrange(len(data))
        b[at] ^= 1 << rng.randrange(8)
        out[f"bit flip at {at}"] = bytes(b)
    return out


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk (a hole): a size bomb."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def not_files(tmp: Path, name: str) -> dict[str, Path]:
    """A FIFO, a folder, a device (through a link) and a missing file, at ``name``."""
    out = {}
    for kind in ("fifo", "folder", "device", "missing"):
        p = tmp / kind / name
        p.parent.mkdir(parents=True)
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "folder":
            p.mkdir()
        elif kind == "device":
            p.symlink_to("/dev/zero")
        out[kind] = p
    return out


# ----------------------------------------------------------------------------- damage
def damage(data: bytes) -> st.SearchStrategy[tuple[str, bytes]]:
    """``(what, damaged bytes)`` of ``data``: a truncation at any offset, one bit flipped
    anywhere, a span overwritten with junk, junk appended or put in front, random bytes
    (at most 4 KiB), the empty file. Every case names itself for the failure report."""
    n = len(data)
    at = st.integers(0, n - 1)
    flip = st.tuples(at, st.integers(0, 7)).map(
        lambda ab: (f"bit {ab[1]} of byte {ab[0]} flipped",
                    data[:ab[0]] + bytes([data[ab[0]] ^ (1 << ab[1])]) + data[ab[0] + 1:]))
    return st.one_of(
        truncation(data),
        flip,
        st.tuples(at, st.binary(min_size=1, max_size=64)).map(
            lambda a: (f"junk over byte {a[0]}", data[:a[0]] + a[1] + data[a[0] + len(a[1]):])),
        st.binary(min_size=1, max_size=64).map(lambda j: ("junk appended", data + j)),
        st.binary(min_size=1, max_size=64).map(lambda j: ("junk in front", j + data)),
        st.binary(max_size=4096).map(lambda b: ("random bytes", b)),
    )


def truncation(data: bytes) -> st.SearchStrategy[tuple[str, bytes]]:
    return st.integers(0, len(data) - 1).map(lambda k: (f"truncated to {k} bytes", data[:k]))


# ----------------------------------------------------------------------------- checkpoints
MC = dataclasses.asdict(ModelConfig(d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                    d_ff=16, max_positions=16))
VOCAB = 20


def valid_state() -> dict:
    """What the trainer writes, for a tiny model (no training needed)."""
    torch.manual_seed(0)
    model = Transformer(OmegaConf.create(MC), VOCAB, VOCAB, shared_vocab=True)
    optim = torch.optim.AdamW(model.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0)
    return {"format": FORMAT, "model": model.state_dict(), "model_config": dict(MC),
            "vocab": {"src_size": VOCAB, "tgt_size": VOCAB, "shared": True},
            "tokenizer_sha256": "ab" * 32, "step": 3,
            "config": {"data": {"name": "x", "source": "builtin", "src_lang": "zh",
                                "tgt_lang": "en", "reverse": False}, "model": dict(MC)},
            "optimizer": optim.state_dict(), "scheduler": schedule.state_dict(),
            "sampler": {"epoch": 0, "position": 3},
            "trainer_state": {"step": 3, "epoch": 0, "best_bleu": 1.5, "best_step": 3,
                              "bad_validations": 0, "train_seconds": 0.5, "skipped_steps": 0},
            "rng": rng_state(),
            "unused": [1, "two", None, 3.5]}


@pytest.fixture(scope="module")
def good_ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "good.pt"
    torch.save(valid_state(), path)
    assert load_checkpoint(path)["step"] == 3
    return path


def _model_with(name: str, value) -> dict:
    model = dict(valid_state()["model"])
    if value is None:
        del model[name]
    else:
        model[name] = value
    return model


def through_load_run(path: Path, monkeypatch) -> None:
    """``path`` as translate, serve and export read it (:func:`tinymt.rundir.load_run`): the
    model built from its ``model_config`` and ``vocab``, its weights loaded strictly (the
    run's tokenizers: of ``VOCAB`` pieces, the digest the checkpoint records)."""
    from types import SimpleNamespace

    from tinymt.rundir import load_run

    tok = SimpleNamespace(vocab_size=VOCAB)
    monkeypatch.setattr("tinymt.rundir.load_tokenizers", lambda folder: (tok, tok))
    monkeypatch.setattr("tinymt.rundir.tokenizer_digest", lambda *a: "ab" * 32)
    load_run(str(path.parent), checkpoint=str(path))


# (what, field, value): the field of a valid checkpoint replaced (None as value: removed;
# a "model" value of None removes the whole field). Refused by load_checkpoint itself;
# those in BUILT by building the model and loading its weights strictly (load_run)
CKPT_SWAPS = [
    ("not a dict", None, [1, 2]), ("format 1", "format", 1), ("format '2'", "format", "2"),
    ("no format", "format", None), ("no model", "model", None),
    ("model a list", "model", [torch.ones(2)]), ("model empty", "model", {}),
    ("model: a string for a tensor", "model", _model_with("output_proj.weight", "x")),
    ("model: a dict for a tensor", "model", _model_with("output_proj.weight", {"a": 1})),
    ("model: an int key", "model", {**valid_state()["model"], 5: torch.ones(1)}),
    ("model: a sparse tensor", "model",
     _model_with("output_proj.weight", torch.eye(VOCAB, 8).to_sparse())),
    ("model: embedding of another size", "model",
     _model_with("src_embed.weight", torch.ones(VOCAB + 1, 8))),
    ("model: output projection missing", "model", _model_with("output_proj.weight", None)),
    ("model: head mask of 3 heads", "model",
     _model_with("head_mask_cross", torch.ones(1, 3))),
    ("model: an extra encoder layer", "model",
     _model_with("encoder_layers.1.norm1.weight", torch.ones(8))),
    ("model: d_ff other than the config's", "model",
     _model_with("encoder_layers.0.ff.linear1.weight", torch.ones(32, 8))),
    ("vocab a string", "vocab", "800"), ("vocab missing", "vocab", None),
    ("vocab.src_size a string", "vocab", {"src_size": "20", "tgt_size": 20, "shared": True}),
    ("vocab.src_size a float", "vocab", {"src_size": 20.0, "tgt_size": 20, "shared": True}),
    ("vocab.tgt_size 0", "vocab", {"src_size": 20, "tgt_size": 0, "shared": False}),
    ("vocab.tgt_size 2**40", "vocab", {"src_size": 20, "tgt_size": 2**40, "shared": False}),
    ("vocab shared, sizes differ", "vocab", {"src_size": 20, "tgt_size": 21, "shared": True}),
    ("model_config a list", "model_config", list(MC.items())),
    ("model_config.d_model a list", "model_config", {**MC, "d_model": [8]}),
    ("model_config missing", "model_config", None),
    ("model_config.n_encoder_layers 10**6", "model_config", {**MC, "n_encoder_layers": 10**6}),
    ("model_config.max_positions 2**40", "model_config", {**MC, "max_positions": 2**40}),
    ("model_config.dropout nan", "model_config", {**MC, "dropout": float("nan")}),
    ("model_config.activation 'os.system'", "model_config", {**MC, "activation": "os.system"}),
    ("model_config: d_model not divisible", "model_config", {**MC, "n_heads": 3}),
    ("model_config: a tensor value", "model_config", {**MC, "name": torch.ones(1)}),
    ("model_config: an unknown key", "model_config", {**MC, "evil": 3}),
    ("tokenizer_sha256 an int", "tokenizer_sha256", 5),
    ("tokenizer_sha256 a megabyte", "tokenizer_sha256", "a" * (1 << 20)),
    ("config a list", "config", [1]), ("config.data a string", "config", {"data": "x"}),
]
BUILT = {"model empty", "model: embedding of another size", "model: output projection missing",
         "model: an extra encoder layer", "model: d_ff other than the config's",
         "model: head mask of 3 heads",
         "vocab.tgt_size 0", "vocab shared, sizes differ", "tokenizer_sha256 an int",
         "tokenizer_sha256 a megabyte"}


@pytest.mark.parametrize("what,field,value", CKPT_SWAPS, ids=[c[0] for c in CKPT_SWAPS])
def test_a_checkpoint_with_a_field_swapped(tmp_path, monkeypatch, what, field, value):
    state = valid_state()
    if field is None:
        state = value
    elif value is None:
        del state[field]
    else:
        state[field] = value
    path = tmp_path / "last.pt"
    torch.save(state, path)
    if what in BUILT:
        assert load_checkpoint(path)
        message = one_line(lambda p: through_load_run(p, monkeypatch), path)
    else:
        message = one_line(load_checkpoint, path)
    if field not in (None, "format", "model", "tokenizer_sha256") and what != "no model":
        assert field.split("_")[0] in message, message  # names the field
    assert "could run code" not in message


def test_a_valid_checkpoint_through_load_run(good_ckpt, monkeypatch):
    """The control of the cases above: the valid checkpoint builds its model."""
    through_load_run(good_ckpt, monkeypatch)


@given(st.data())
def test_checkpoint_bytes_damaged(good_ckpt, tmp_path_factory, data):
    """Any damage to a checkpoint's bytes: one line naming the file (damage, never "could
    run code"), or, where a flip may leave it valid (a bit inside a weight), loaded. A
    truncation, junk in front and random bytes are always refused."""
    good = good_ckpt.read_bytes()
    what, damaged = data.draw(damage(good))
    path = tmp_path_factory.mktemp("ckpt-damage") / "best.pt"
    path.write_bytes(damaged)
    message = loaded_or_one_line(load_checkpoint, path, case=what)
    if what.startswith(("truncated", "random", "junk in front")):
        assert message is not None, f"{what}: loaded"
    if message is not None:
        assert "could run code" not in message, (what, message)


def test_checkpoint_bytes_truncated_junk_flipped(good_ckpt, tmp_path):
    """The named cases (besides the property above): zeros, a pickle that is not torch's,
    zip magic then junk, and enough flips to show that not all land in weights."""
    data = good_ckpt.read_bytes()
    path = tmp_path / "best.pt"
    for what, damaged in junk(data).items():
        path.write_bytes(damaged)
        message = one_line(load_checkpoint, path)
        assert "damaged or truncated, or not a checkpoint" in message, (what, message)
    outcomes = {}
    for what, damaged in flips(data, 48).items():
        path.write_bytes(damaged)
        outcomes[what] = loaded_or_one_line(load_checkpoint, path)
    assert sum(o is not None for o in outcomes.values()) >= 8, outcomes  # not all in weights


def test_only_the_checkpoint_loader_unpickles():
    """Every command that reads a checkpoint (translate, serve, export, analyze_heads,
    average_checkpoints, resuming, the benchmark) reads it through
    :func:`load_checkpoint`: no other module of src/ or scripts/ calls ``torch.load`` or
    an unpickler. (So the loader's properties are every command's; one script proves the
    wiring: test_junk_checkpoint_through_the_real_cli.)"""
    import re

    pattern = re.compile(r"torch\.load\(|pickle\.loads?\(|Unpickler|allow_pickle=True|"
                         r"weights_only=False")
    found = [f"{p.relative_to(REPO_ROOT)}:{n}" for folder in ("src", "scripts")
             for p in sorted((REPO_ROOT / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line.split("#")[0])]
    assert found == ["src/tinymt/checkpoint.py:75"] or (
        len(found) == 1 and found[0].startswith("src/tinymt/checkpoint.py:")), found


def test_checkpoint_that_is_not_a_file(tmp_path):
    for kind, path in not_files(tmp_path, "best.pt").items():
        one_line(load_checkpoint, path,
                 "does not exist" if kind == "missing" else "not")


def test_checkpoint_archive_forgeries(good_ckpt, tmp_path):
    """Zip archives torch.save would never write, whose records torch's reader would unpack
    into more memory than the file holds: refused from their directory alone."""
    # an entry compressed (a zip bomb: 1 MB that would unpack to 256 MiB; level 1 is quick)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z, \
            z.open("archive/data.pkl", "w") as f:
        for _ in range(256):
            f.write(bytes(1 << 20))
    one_line(load_checkpoint, bomb, "its records unpack to 268,435,456 bytes")
    # an entry declaring 2 GiB in a file of 30 kB
    data = bytearray(good_ckpt.read_bytes())
    at = data.rfind(b"PK\x01\x02")  # the last central-directory record
    data[at + 20: at + 28] = (2**31).to_bytes(4, "little") * 2  # compressed, uncompressed size
    liar = tmp_path / "liar.pt"
    liar.write_bytes(bytes(data))
    one_line(load_checkpoint, liar, "its records unpack to")
    # 64 entries naming the one record of a 64 KiB tensor: 4 MiB read from a 70 kB file
    torch.save({**valid_state(), "w": torch.zeros(1 << 14)}, tmp_path / "one.pt")
    twice = tmp_path / "twice.pt"
    with zipfile.ZipFile(tmp_path / "one.pt") as z, zipfile.ZipFile(twice, "w") as w:
        for e in z.infolist():
            w.writestr(e, z.read(e))
        record = max(w.filelist, key=lambda e: e.file_size)
        for i in range(63):
            alias = zipfile.ZipInfo(f"{record.filename}-{i}")
            alias.header_offset, alias.file_size = record.header_offset, record.file_size
            alias.compress_size, alias.CRC = record.compress_size, record.CRC
            w.filelist.append(alias)
    one_line(load_checkpoint, twice, "its records unpack to")
    # a size bomb: refused by its size, nothing read
    huge = sparse(tmp_path / "huge.pt", MAX_CHECKPOINT_BYTES + 1)
    one_line(load_checkpoint, huge, "more than any checkpoint")
    # a zip without data.pkl, and a pickle other than torch's (an object that is not plain)
    empty = tmp_path / "empty_zip.pt"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("archive/version", "3\n")
    one_line(load_checkpoint, empty, "damaged or truncated")
    other = tmp_path / "other.pt"
    torch.save({**valid_state(), "when": datetime.date(2020, 1, 1)}, other)
    one_line(load_checkpoint, other, "objects other than tensors")


# ----------------------------------------------------------------------------- resume
def _training(tmp_path: Path):
    """What ``restore`` reads from the loop's ``Training``, for the tiny model."""
    from types import SimpleNamespace

    from tinymt.batching import TokenBatchSampler

    model = Transformer(OmegaConf.create(MC), VOCAB, VOCAB, shared_vocab=True)
    optim = torch.optim.AdamW(model.parameters())
    return SimpleNamespace(
        run_dir=tmp_path, model=model, optimizer=optim, data=SimpleNamespace(
            src_tokenizer=None, tgt_tokenizer=None),
        scheduler=torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0),
        sampler=TokenBatchSampler([3] * 10, [3] * 10, max_tokens=12, seed=0),
        state={"step": 0, "epoch": 0, "best_bleu": -1.0, "best_step": 0, "bad_validations": 0,
               "train_seconds": 0.0, "skipped_steps": 0}, log=QUIET)


RESUME_SWAPS = [("no optimizer", "optimizer", None), ("no rng", "rng", None),
                ("optimizer of another model", "optimizer",
                 {"state": {}, "param_groups": [{"params": [0, 1]}]}),
                ("scheduler a dict of junk", "scheduler", {"base_lrs": "x", "lr_lambdas": 5}),
                ("sampler.epoch a string", "sampler", {"epoch": "x", "position": 0}),
                ("rng.python a string", "rng", {"python": "x", "torch": torch.ones(1)}),
                ("model of another shape", "model", {"w": torch.ones(1)})]


@pytest.mark.parametrize("what,field,value", RESUME_SWAPS, ids=[c[0] for c in RESUME_SWAPS])
def test_a_resumed_checkpoint_with_a_field_swapped(tmp_path, monkeypatch, what, field, value):
    """What load_checkpoint lets through as types, the loop's objects refuse as values."""
    monkeypatch.setattr("tinymt.trainer.state.check_resume_tokenizer", lambda *a: None)
    ckpt = valid_state()
    if value is None:
        del ckpt[field]
    else:
        ckpt[field] = value
    path = tmp_path / "checkpoints" / "last.pt"
    one_line(lambda t: restore(t, ckpt), _training(tmp_path), named=path)


def test_a_valid_checkpoint_is_restored(tmp_path, monkeypatch):
    monkeypatch.setattr("tinymt.trainer.state.check_resume_tokenizer", lambda *a: None)
    t = _training(tmp_path)
    restore(t, valid_state())
    assert t.state["step"] == 3 and t.state["best_bleu"] == 1.5


# ----------------------------------------------------------------------------- config.yaml
@pytest.fixture(scope="module")
def run_config(tmp_path_factory) -> tuple[Path, bytes]:
    """``(a run dir, its config.yaml)``: the train config as the trainer writes it."""
    tmp = tmp_path_factory.mktemp("cfg")
    cfg = compose_train(tmp)
    text = OmegaConf.to_yaml(cfg).encode()
    assert load_config_file(_write(tmp / "run" / "config.yaml", text), "the run's config")
    return tmp / "run", text


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _bomb(levels: int = 12) -> bytes:
    lines = [b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [b"a%d: &a%d [" % (i, i) + b", ".join([b"*a%d" % (i - 1)] * 10) + b"]"
              for i in range(1, levels)]
    return b"\n".join(lines) + b"\n"  # 10**12 x's once expanded


YAML_FORGERIES = {
    "a list": b"- data\n- model\n", "one value": b"hello\n", "not UTF-8": b"data: \xff\xfe\n",
    "a NUL byte": b"data: {}\x00\n", "a tab indent": b"data:\n\tname: x\n",
    "unclosed": b"model: [unclosed\n  d_model: 3\n", "a Python tag":
    b"data: !!python/object/apply:os.system ['echo pwned']\n", "a duplicate key":
    b"data: {}\ndata: {}\n", "a list key": b"[1, 2]: 3\n", "an alias bomb": _bomb(),
    "nested 100,000 deep (flow)": b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "nested 800 deep (block)": b"".join(b"  " * i + b"k%d:\n" % i for i in range(800)) + b"  " * 800
    + b"x: 1\n", "an interpolation to nothing": b"data: {name: ${nope}}\n",
    "an environment variable": b"data: {name: '${oc.env:TINYMT_NO_SUCH_VARIABLE}'}\n",
}


@given(st.data())
def test_config_yaml_bytes_damaged(run_config, tmp_path_factory, data):
    """Any damage to a run's config.yaml: loaded (YAML may survive a flip or a cut at a
    line's end) or one line naming the file; never another exception."""
    _, text = run_config
    what, damaged = data.draw(damage(text))
    path = _write(tmp_path_factory.mktemp("cfg-damage") / "config.yaml", damaged)
    message = loaded_or_one_line(read_config, path, case=what)
    if what == "truncated to 0 bytes":
        assert message is not None and "is empty" in message, message


def test_config_yaml_forged(run_config, tmp_path):
    """The forgeries no random damage makes (each refused in one line), junk, a size bomb
    and paths that are no regular file."""
    _, text = run_config
    path = tmp_path / "config.yaml"
    for what, damaged in {**junk(text), **YAML_FORGERIES}.items():
        _write(path, damaged)
        assert loaded_or_one_line(read_config, path, case=what), f"{what}: loaded"
    huge = sparse(tmp_path / "huge.yaml", GIB)
    one_line(read_config, huge, "larger than")
    for kind, p in not_files(tmp_path, "config.yaml").items():
        one_line(read_config, p, case=kind)


# the run's config with a group or value swapped, through resume_config
CONFIG_SWAPS = [("model a number", "model", 5), ("data a list", "data", [1, 2]),
                ("trainer a string", "trainer", "x"),
                ("model.d_model a string", "model.d_model", "big"),
                ("model.d_model 10**12", "model.d_model", 10**12),
                ("trainer.max_steps a float", "trainer.max_steps", 1.5),
                ("data.vocab_size a list", "data.vocab_size", [1]),
                ("optim.lr nan", "optim.lr", float("nan")),
                ("an unknown key", "trainer.evil", 1)]


@pytest.mark.parametrize("what,key,value", CONFIG_SWAPS, ids=[c[0] for c in CONFIG_SWAPS])
def test_a_resumed_config_with_a_field_swapped(run_config, tmp_path, what, key, value):
    src, text = run_config
    run = tmp_path / "run"
    shutil.copytree(src, run)
    cfg = OmegaConf.to_container(OmegaConf.create(text.decode()))
    node, *path = key.split(".")
    if path:
        cfg[node][path[0]] = value
    else:
        cfg[node] = value
    saved = _write(run / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(cfg)).encode())
    main = OmegaConf.create({"trainer": {"resume": str(run)}})
    one_line(resume_config, main, "cannot resume", named=saved)


# ----------------------------------------------------------------------------- JSON files
JSON_TEXT = json.dumps({"test_bleu": 12.5, "steps": 40, "files": {"a": "b" * 64}}).encode()


@given(damage(JSON_TEXT))
def test_json_bytes_damaged(tmp_path_factory, case):
    """Any damage to a JSON file tinymt wrote (metrics.json, the cache's stats.json and
    COMPLETE): the object loaded or one line naming the file; a truncation (the closing
    brace gone) and junk in front always refused."""
    what, damaged = case
    path = _write(tmp_path_factory.mktemp("json-damage") / "metrics.json", damaged)
    message = loaded_or_one_line(read_metrics, path, case=what)
    if what.startswith(("truncated", "junk in front")):
        assert message is not None, f"{what}: loaded"


def test_json_files_forged(tmp_path):
    path = tmp_path / "metrics.json"
    cases = {**junk(JSON_TEXT), "NaN": b'{"test_bleu": NaN}', "a list": b"[1, 2]",
             "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
             "not UTF-8": b'{"a": "\xff"}'}
    for what, damaged in cases.items():
        _write(path, damaged)
        one_line(read_metrics, path, case=what)
    huge = sparse(tmp_path / "huge.json", GIB)
    one_line(read_metrics, huge, "larger than")
    for kind, p in not_files(tmp_path, "metrics.json").items():
        one_line(read_metrics, p, case=kind)


# ----------------------------------------------------------------------------- exports
def _export(folder: Path, **changes) -> Path:
    """An export's folder: its files and a signed tinymt_export.json (``changes`` applied
    before signing: a forged digest)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in ("model.bin", "config.json"):
        (folder / name).write_bytes(name.encode())
        files[name] = hashlib.sha256(name.encode()).hexdigest()
    meta = {"format": EXPORT_FORMAT, "quantization": "none",
            "tokenizer_sha256": "ab" * 32, "joint_vocab": True, "max_positions": 64,
            "data": {"name": "x", "src_lang": "zh", "tgt_lang": "en", "reverse": False},
            "model": dict(MC), "files": files}
    meta.update(changes)
    meta = {k: v for k, v in meta.items() if v is not None}
    meta["meta_sha256"] = meta_digest(meta)
    (folder / META).write_text(json.dumps(meta, indent=2))
    return folder


EXPORT_SWAPS = [("data a list", {"data": ["zh"]}), ("data.reverse 'yes'", {"data": {"reverse": "yes"}}),
                ("files a list", {"files": ["model.bin"]}),
                ("files: a path out of the folder", {"files": {"../model.bin": "ab" * 32}}),
                ("format other", {"format": "onnx"})]


@pytest.mark.parametrize("what,changes", EXPORT_SWAPS, ids=[c[0] for c in EXPORT_SWAPS])
def test_an_export_description_with_a_field_swapped(tmp_path, what, changes):
    folder = _export(tmp_path / "export", **changes)
    one_line(read_meta, folder, named=folder / META)


@given(st.data())
def test_export_description_bytes_damaged(tmp_path_factory, data):
    """Any change to what tinymt_export.json holds is refused in one line naming it: its
    meta_sha256 covers every field (a flip in a digest or a quote alike). (White space
    between its tokens, which JSON reads as the same document, is no change.)"""
    folder = _export(tmp_path_factory.mktemp("export-damage") / "export")
    meta = folder / META
    good = meta.read_bytes()

    def changed(case: tuple[str, bytes]) -> bool:
        try:
            return json.loads(case[1]) != json.loads(good)
        except ValueError:  # (not JSON, or not UTF-8)
            return True

    what, damaged = data.draw(damage(good).filter(changed))
    meta.write_bytes(damaged)
    one_line(read_meta, folder, named=meta, case=what)


def test_export_description_not_a_file(tmp_path):
    folder = _export(tmp_path / "export")
    assert read_meta(folder)["max_positions"] == 64
    meta = folder / META
    meta.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    one_line(read_meta, folder, named=meta)
    sparse(meta, GIB)
    one_line(read_meta, folder, "larger than", named=meta)
    for kind in ("fifo", "folder"):
        meta.unlink() if not meta.is_dir() else meta.rmdir()
        os.mkfifo(meta) if kind == "fifo" else meta.mkdir()
        one_line(read_meta, folder, "not a regular file" if kind == "fifo" else "folder",
                 named=meta)


# ----------------------------------------------------------------------------- data cache
@pytest.fixture(scope="module")
def cache_entry(tmp_path_factory) -> tuple[DataConfig, Path]:
    """``(its data config, a complete cache entry)`` of a small text corpus."""
    tmp = tmp_path_factory.mktemp("cache")
    corpus = write_text_corpus(tmp / "corpus", {"train": make_pairs(200, 0),
                                                "valid": make_pairs(20, 1),
                                                "test": make_pairs(20, 2)})
    cfg = DataConfig(name="t", source="text", path=str(corpus), src_lang="de", tgt_lang="en",
                     train_split="train", valid_split="valid", test_split="test",
                     vocab_size=40, cache_dir=str(tmp / "c"))
    data = prepare(cfg, log=QUIET)
    return cfg, Path(data.stats["cache_dir"])


def _copy_entry(entry: Path, tmp: Path) -> Path:
    return Path(shutil.copytree(entry, tmp / "c" / entry.name))


MARKER_DAMAGE = {  # COMPLETE itself (not re-signed: it is the signature)
    "junk": b"\x00junk", "empty": b"", "truncated": None, "a list": b"[]",
    "files a list": b'{"files": []}', "digests numbers": None,
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000, "1 GiB": GIB,
}


@pytest.mark.parametrize("what", list(MARKER_DAMAGE))
def test_a_damaged_cache_marker_is_rebuilt_not_trusted(cache_entry, tmp_path, what):
    entry = _copy_entry(cache_entry[1], tmp_path)
    marker, damage = entry / COMPLETE, MARKER_DAMAGE[what]
    if what == "truncated":
        marker.write_bytes(marker.read_bytes()[:100])
    elif what == "digests numbers":
        files = json.loads(marker.read_text())["files"]
        marker.write_text(json.dumps({"files": dict.fromkeys(files, 5)}))
    elif isinstance(damage, int):
        sparse(marker, damage)
    else:
        marker.write_bytes(damage)
    log: list[str] = []
    assert load_complete(entry, log.append) is None
    assert len(log) == 1 and str(marker) in log[0] and "rebuilding" in log[0], log


@given(st.data())
def test_a_damaged_cache_file_is_never_trusted(cache_entry, data):
    """Any damage to any file of a complete cache entry (its token ids, its tokenizer, its
    stats, its marker): not a hit, one log line naming the entry and "rebuilding" (every
    file is digested into COMPLETE when it is published), and the entry left as it was
    for :func:`publish` to replace. (The rebuild itself, byte for byte, through
    scripts/prepare_data.py: tests/test_damaged_files.py.)"""
    entry = cache_entry[1]
    files = sorted(p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file())
    name = data.draw(st.sampled_from(files))
    path = entry / name
    good = path.read_bytes()
    what, damaged = data.draw(damage(good).filter(lambda c: c[1] != good))
    path.write_bytes(damaged)
    try:
        log: list[str] = []
        assert load_complete(entry, log.append) is None, f"{name}: {what}: trusted"
        assert len(log) == 1 and "\n" not in log[0] and "rebuilding" in log[0], log
        assert str(entry) in log[0], log
        assert path.read_bytes() == damaged  # left for publish to replace
    finally:
        path.write_bytes(good)


def test_a_cache_marker_that_is_not_a_file(cache_entry, tmp_path):
    for kind in ("fifo", "folder"):
        entry = _copy_entry(cache_entry[1], tmp_path / kind)
        (entry / COMPLETE).unlink()
        os.mkfifo(entry / COMPLETE) if kind == "fifo" else (entry / COMPLETE).mkdir()
        log: list[str] = []
        with watchdog():
            assert load_complete(entry, log.append) is None
        assert len(log) == 1 and str(entry) in log[0], log


# ----------------------------------------------------------------------------- size bombs
CHILD = r"""
import gc, json, re, sys
from pathlib import Path
from tinymt.checkpoint import load_checkpoint
from tinymt.ct2.engine import read_meta
from tinymt.data.cache import load_complete
from tinymt.errors import TinyMTError
from tinymt.config import load_config_file
from tinymt.files import load_json

def cache(p):
    log = []
    if load_complete(Path(p), log.append) is not None:
        return None
    raise TinyMTError(log[0])

LOAD = {"checkpoint": load_checkpoint, "config": lambda p: load_config_file(p, "config"),
        "json": lambda p: load_json(p, "json"), "export": lambda p: read_meta(Path(p)),
        "cache": cache}

def kib(key):  # VmRSS: now; VmHWM: the peak since the last reset
    return int(re.search(key + r":\s+(\d+)", open("/proc/self/status").read()).group(1))

def measured(load, path):  # (the outcome, KiB the peak went above the memory at its start)
    gc.collect()
    open("/proc/self/clear_refs", "w").write("5")  # the peak := the present (Linux >= 4.0)
    before = kib("VmRSS")
    try:
        load(path)
        outcome = "loaded"
    except TinyMTError as e:
        outcome = str(e)
    except BaseException as e:
        outcome = f"RAW {type(e).__name__}: {e}"[:300]
    return outcome, kib("VmHWM") - before

warm, bombs = json.loads(sys.argv[1])
warmed = {name: measured(LOAD[kind], path)[0] for name, kind, path in warm}  # imports, caches
out = {name: measured(LOAD[kind], path) for name, kind, path in bombs}
control = measured(lambda p: b"\x01" * (128 << 20), None)[1]  # 128 MiB written do show
print(json.dumps({"warm": warmed, "bombs": out, "control_kib": control}))
"""


@pytest.mark.slow  # a (forked) child process, a 512 MiB zip bomb made: ~3 s
def test_size_bombs_are_refused_in_bounded_memory(good_ckpt, run_config, cache_entry, tmp_path):
    """Each bomb in a child process, its peak memory (VmHWM) measured from a reset to the
    present just before it (each loader ran once on a good file first); every bomb's peak
    stays under MEMORY_BOUND_MIB, while 128 MiB written show as 128 in the same measure.
    Measured (2-core CPU, torch 2.13): 0 to 1.8 MiB a bomb; 3.1 MiB for a valid config
    just under the 1 MiB limit."""
    run, text = run_config
    good_meta = _export(tmp_path / "good_export")
    good_json = _write(tmp_path / "good.json", b'{"a": 1}')
    warm = [("checkpoint", "checkpoint", str(good_ckpt)), ("config", "config", str(run / "config.yaml")),
            ("json", "json", str(good_json)), ("export", "export", str(good_meta)),
            ("cache", "cache", str(cache_entry[1]))]
    zipped = tmp_path / "zip_bomb.pt"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z, \
            z.open("a/data.pkl", "w") as f:  # (level 1: half the time to write)
        for _ in range(512):
            f.write(bytes(1 << 20))
    marker = _copy_entry(cache_entry[1], tmp_path / "marker")
    sparse(marker / COMPLETE, GIB)
    export = _export(tmp_path / "export")
    sparse(export / META, GIB)
    bombs = [
        ("checkpoint 16 GiB + 1 (sparse)", "checkpoint",
         str(sparse(tmp_path / "huge.pt", MAX_CHECKPOINT_BYTES + 1))),
        ("checkpoint zip bomb (512 MiB deflated)", "checkpoint", str(zipped)),
        ("config 1 GiB (sparse)", "config", str(sparse(tmp_path / "huge.yaml", GIB))),
        ("config alias bomb (10**12 nodes)", "config", str(_write(tmp_path / "bomb.yaml", _bomb()))),
        ("config nested 300,000 deep", "config", str(_write(
            tmp_path / "deep.yaml", b"a: " + b"[" * 300_000 + b"]" * 300_000))),
        ("config just under the size limit", "config", str(_write(
            tmp_path / "big.yaml", b"a: " + b"x" * (MAX_CONFIG_BYTES - 10) + b"\n"))),
        ("json 1 GiB (sparse)", "json", str(sparse(tmp_path / "huge.json", GIB))),
        ("json nested 500,000 deep", "json", str(_write(
            tmp_path / "deep.json", b"[" * 500_000 + b"]" * 500_000))),
        ("cache: COMPLETE 1 GiB (sparse)", "cache", str(marker)),
        ("export: tinymt_export.json 1 GiB (sparse)", "export", str(export)),
    ]
    r = forked.run([sys.executable, "-c", CHILD, json.dumps([warm, bombs])],
                   capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(report["warm"].values()) == {"loaded"}, report["warm"]
    for (name, _kind, path), (line, _) in zip(bombs, report["bombs"].values()):
        if name == "config just under the size limit":
            assert line == "loaded", line
            continue
        assert not line.startswith(("RAW", "loaded")) and "\n" not in line, (name, line)
        assert path in line or str(Path(path) / COMPLETE) in line, (name, line)
    peaks = {name: kib / 1024 for name, (_, kib) in report["bombs"].items()}
    print("size bombs, peak memory above the start (MiB): " + ", ".join(
        f"{name} {mib:.1f}" for name, mib in peaks.items())
        + f"; 128 MiB written: {report['control_kib'] / 1024:.0f}")
    assert max(peaks.values()) < MEMORY_BOUND_MIB, peaks
    assert report["control_kib"] > 120 * 1024, report  # the measure sees what is written


# ----------------------------------------------------------------------------- the scripts
@pytest.mark.slow  # a real process: ~5-10 s
def test_junk_checkpoint_through_the_real_cli(tmp_path):
    """``scripts/translate.py checkpoint=<junk>``, a user's process: exit 2, one line."""
    (tmp_path / "run").mkdir()
    junk_file = _write(tmp_path / "junk.pt", b"\x80\x03junk")
    r = forked.run([sys.executable, str(REPO_ROOT / "scripts" / "translate.py"),
                    f"run={tmp_path / 'run'}", f"checkpoint={junk_file}", "device=cpu",
                    "他喜欢猫吗？"], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint "), lines
    assert str(junk_file) in lines[0] and "damaged or truncated, or not a checkpoint" in lines[0]
