"""Every file tinymt reads, truncated or with a bit flipped, through the script that reads
it: one line or a correct result, never a traceback, nothing written on refusal. (The
export's files: tests/test_export.py; input and corpus files: tests/test_translate.py,
tests/test_data.py; values: tests/test_fuzz.py.)"""

import random
import shutil
from pathlib import Path

import pytest

from conftest import copy_run, run_script_in_process
from tinymt.data.cache import _verify_digests


def _damaged(path: Path, how: str, seed: int) -> None:
    data = bytearray(path.read_bytes())
    if how == "empty":
        data = bytearray()
    elif how == "half":
        data = data[: len(data) // 2]
    else:  # "flip": one bit of one byte, the byte drawn by the seed
        rng = random.Random(seed)
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _tree(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _one_line_or_success(status, err) -> None:
    assert "Traceback" not in err, err[-3000:]
    if status != 0:
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]


RUN_CASES = [("checkpoints/best.pt", how, seed) for how, seed in
             [("empty", 0), ("half", 0)] + [("flip", s) for s in range(8)]] + \
            [("tokenizer/spm.model", how, seed) for how, seed in
             [("empty", 0), ("half", 0)] + [("flip", s) for s in range(3)]]


@pytest.mark.slow
@pytest.mark.parametrize("name,how,seed", RUN_CASES,
                         ids=[f"{n}-{h}{s if h == 'flip' else ''}" for n, h, s in RUN_CASES])
def test_a_damaged_run_file_when_translating(tiny_run, tmp_path, capsys, name, how, seed):
    run = copy_run(tiny_run, tmp_path / "run")
    _damaged(run / name, how, seed)
    before = _tree(run)
    status, err = run_script_in_process(
        "translate", [f"run={run}", "device=cpu", f"output={tmp_path / 'out.txt'}",
                      "他喜欢猫吗？"], capsys)
    _one_line_or_success(status, err)
    assert _tree(run) == before
    if status != 0:
        assert not (tmp_path / "out.txt").exists()


CACHE_FILES = ["COMPLETE", "stats.json", "tokenizer/spm.model", "splits/dataset_dict.json",
               "splits/train/state.json", "splits/train/dataset_info.json",
               "splits/valid/data-00000-of-00001.arrow", "splits/train/data-00000-of-00001.arrow"]
CACHE_CASES = [(f, how) for f in CACHE_FILES for how in ("half", "flip")]


@pytest.mark.slow
@pytest.mark.parametrize("name,how", CACHE_CASES, ids=[f"{n}-{h}" for n, h in CACHE_CASES])
def test_a_damaged_cache_file_is_rebuilt(text_corpus, tmp_path, capsys, name, how):
    """Every file of a cache entry is hashed when it is published: any damage is found
    and the entry rebuilt (a flipped token id inside the vocabulary was once trusted)."""
    args = ["data.source=text", f"data.path={text_corpus}", "data.src_lang=de",
            "data.tgt_lang=en", "data.train_split=train", "data.valid_split=valid",
            "data.test_split=test", "data.vocab_size=40", f"data.cache_dir={tmp_path / 'c'}"]
    status, err = run_script_in_process("prepare_data", args, capsys)
    assert status == 0, err
    entry = next(p for p in (tmp_path / "c").iterdir() if not p.name.startswith("."))
    good = _tree(entry)
    assert name in good, sorted(good)
    _damaged(entry / name, how, seed=1)
    status, err = run_script_in_process("prepare_data", args, capsys)
    assert status == 0 and "Traceback" not in err, err[-3000:]
    timed = ("stats.json", "COMPLETE")  # stats hold the build's seconds (COMPLETE: their hash)
    assert {k: v for k, v in _tree(entry).items() if k not in timed} == {
        k: v for k, v in good.items() if k not in timed}  # rebuilt, byte for byte as before
    _verify_digests(entry)  # stats.json too is the one its (new) marker records
    assert [p.name for p in (tmp_path / "c").iterdir()] == [entry.name]  # nothing left over


CONFIG_CASES = [("empty", 0), ("half", 0)] + [("flip", s) for s in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("how,seed", CONFIG_CASES, ids=[f"{h}{s}" for h, s in CONFIG_CASES])
def test_a_damaged_config_yaml_when_resuming(tiny_run, tmp_path, capsys, how, seed):
    run = copy_run(tiny_run, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")  # nothing to train: only the reading is tested
    (run / "checkpoints").mkdir()
    _damaged(run / "config.yaml", how, seed)
    before = _tree(run)
    status, err = run_script_in_process("train", [f"trainer.resume={run}"], capsys)
    assert status == 2, err[-3000:]
    _one_line_or_success(status, err)
    assert _tree(run) == before
