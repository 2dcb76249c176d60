"""Every file of a run tinymt reads, damaged, at the loader every command goes through:
one line or a correct result, never a traceback, nothing written on refusal; then one row
through a real script each (the wiring). The loaders' own properties (checkpoints,
config.yaml, JSON, exports, cache entries): tests/test_loaders.py; the export's files:
tests/test_export.py; input and corpus files: tests/test_translate.py, tests/test_data.py.
"""

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import copy_run, run_script_in_process
from tinymt.data.cache import entry_damage
from tinymt.errors import TinyMTError
from tinymt.rundir import load_run


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_or_success(status, err) -> None:
    assert "Traceback" not in err, err[-3000:]
    if status != 0:
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory) -> Path:
    return copy_run(tiny_run, tmp_path_factory.mktemp("damaged") / "run")


def _damage(data: bytes) -> st.SearchStrategy[tuple[str, bytes]]:
    n = len(data)
    return st.one_of(
        st.integers(0, n - 1).map(lambda k: (f"truncated to {k} bytes", data[:k])),
        st.tuples(st.integers(0, n - 1), st.integers(0, 7)).map(lambda ab: (
            f"bit {ab[1]} of byte {ab[0]} flipped",
            data[:ab[0]] + bytes([data[ab[0]] ^ (1 << ab[1])]) + data[ab[0] + 1:])))


@given(st.data())
def test_a_damaged_run_file_when_loading_the_run(run, data):
    """best.pt or the tokenizer, truncated anywhere or one bit flipped anywhere: the run
    loads (a flip inside a weight, or in what the tokenizer's identity leaves out) or one
    line names a file of the run; the run is left as it was (but for the damage)."""
    name = data.draw(st.sampled_from(["checkpoints/best.pt", "tokenizer/spm.model"]))
    path = run / name
    good = path.read_bytes()
    what, damaged = data.draw(_damage(good))
    path.write_bytes(damaged)
    before = _tree(run)
    try:
        load_run(str(run), "best", "cpu")
    except TinyMTError as e:
        assert "\n" not in str(e) and str(run) in str(e), (name, what, str(e))
    finally:
        after = _tree(run)
        path.write_bytes(good)
    assert after == before, (name, what)


def test_a_damaged_checkpoint_when_translating(tiny_run, tmp_path, capsys):
    """The wiring, through the script: exit status 2, one line, no output file made."""
    run = copy_run(tiny_run, tmp_path / "run")
    best = run / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    before = _tree(run)
    status, err = run_script_in_process(
        "translate", [f"run={run}", "device=cpu", f"output={tmp_path / 'out.txt'}",
                      "他喜欢猫吗？"], capsys)
    assert status == 2, err[-3000:]
    _one_line_or_success(status, err)
    assert str(best) in err and _tree(run) == before
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("name", ["tokenizer/spm.model", "splits/train/data-00000-of-00001.arrow"])
def test_a_damaged_cache_file_is_rebuilt(text_corpus, tmp_path, capsys, name):
    """Every file of a cache entry is hashed when it is published: damage is found (at
    the loader: test_loaders.py's property) and, through scripts/prepare_data.py, the entry
    rebuilt byte for byte as before (a flipped token id inside the vocabulary included)."""
    args = ["data.source=text", f"data.path={text_corpus}", "data.src_lang=de",
            "data.tgt_lang=en", "data.train_split=train", "data.valid_split=valid",
            "data.test_split=test", "data.vocab_size=40", f"data.cache_dir={tmp_path / 'c'}"]
    status, err = run_script_in_process("prepare_data", args, capsys)
    assert status == 0, err
    entry = next(p for p in (tmp_path / "c").iterdir() if not p.name.startswith("."))
    good = _tree(entry)
    assert name in good, sorted(good)
    data = bytearray((entry / name).read_bytes())
    data[len(data) // 3] ^= 0x10
    (entry / name).write_bytes(bytes(data))
    status, err = run_script_in_process("prepare_data", args, capsys)
    assert status == 0 and "Traceback" not in err, err[-3000:]
    timed = ("stats.json", "COMPLETE")  # stats hold the build's seconds (COMPLETE: their hash)
    assert {k: v for k, v in _tree(entry).items() if k not in timed} == {
        k: v for k, v in good.items() if k not in timed}  # rebuilt, byte for byte as before
    assert entry_damage(entry) is None  # stats.json too is the one its (new) marker records
    assert [p.name for p in (tmp_path / "c").iterdir()] == [entry.name]  # nothing left over


def test_a_damaged_config_yaml_when_resuming(tiny_run, tmp_path, capsys):
    """The wiring of the config loader (its property: test_loaders.py) when resuming:
    one line, exit status 2, the run unchanged."""
    import shutil

    run = copy_run(tiny_run, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")  # nothing to train: only the reading is tested
    (run / "checkpoints").mkdir()
    text = (run / "config.yaml").read_bytes()
    (run / "config.yaml").write_bytes(text[: len(text) // 2] + b"\x00")
    before = _tree(run)
    status, err = run_script_in_process("train", [f"trainer.resume={run}"], capsys)
    assert status == 2, err[-3000:]
    _one_line_or_success(status, err)
    assert _tree(run) == before
