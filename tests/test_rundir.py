"""Run dirs: claimed atomically, never overwritten, checkpoints bound to their tokenizer,
loading never runs code, a failed resume leaves the run byte-identical."""

import hashlib
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import tinymt.config  # noqa: F401  (registers the schemas)
from conftest import TINY_TRAIN_OVERRIDES, compose_train, run_script_in_process
from tinymt.checkpoint import average_checkpoints, load_checkpoint
from tinymt.corpus import sample_pairs
from tinymt.errors import TinyMTError
from tinymt.heads import analyze
from tinymt.rundir import RUN_MARKER, claim_run_dir, load_run, step_checkpoints
from tinymt.tokenizer import Tokenizer
from tinymt.trainer import resume_config, train
from tinymt.translate import translate

ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def compose_cfg(name: str, *overrides):
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        return compose(config_name=name, overrides=list(overrides))


# ----------------------------------------------------------------------------- claiming
def _claim(args):
    path, barrier = args
    barrier.wait()
    return str(claim_run_dir(path, unique=True))


def test_runs_started_at_once_get_their_own_folders(tmp_path):
    """Eight processes claim the same clock-named folder at the same moment."""
    n = 8
    with multiprocessing.Manager() as m:
        barrier = m.Barrier(n)
        with multiprocessing.get_context("fork").Pool(n) as pool:
            got = pool.map(_claim, [(tmp_path / "12-00-00", barrier)] * n)
    assert len(set(got)) == n
    assert sorted(Path(p).name for p in got) == ["12-00-00"] + [f"12-00-00_{i}"
                                                                for i in range(1, n)]
    for p in got:
        assert (Path(p) / RUN_MARKER).is_file()


def test_a_named_folder_holding_a_run_is_refused(tiny_run, tmp_path):
    before = snapshot(tiny_run)
    with pytest.raises(TinyMTError, match="already holds a run: continue it with trainer.resume"):
        claim_run_dir(tiny_run, unique=False)
    assert snapshot(tiny_run) == before


def test_train_into_an_existing_run_is_an_error_and_changes_nothing(tiny_run, tmp_path,
                                                                    capsys):
    """scripts/train.py with hydra.run.dir naming a finished run: one line, no writes."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = snapshot(run)
    status, err = run_script_in_process("train", [
        *TINY_TRAIN_OVERRIDES, f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run}",
        "trainer.max_steps=2"], capsys)
    assert status == 2, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("error: ")
    assert "already holds a run" in err and "Traceback" not in err
    assert snapshot(run) == before


@pytest.mark.slow
def test_clock_named_folder_in_use_moves_the_run_beside_it(tiny_run, tmp_path):
    run = tmp_path / "10-00-00"
    shutil.copytree(tiny_run, run)
    before = snapshot(run)
    cfg = compose_train(tmp_path, f"run_dir={run}", "trainer.max_steps=2",
                        "trainer.valid_every=2", "trainer.valid_sentences=2",
                        "trainer.test_beam=1")
    metrics = train(cfg, unique_run_dir=True)
    assert metrics["run_dir"] == str(tmp_path / "10-00-00_1")
    assert (tmp_path / "10-00-00_1" / "checkpoints" / "best.pt").is_file()
    assert snapshot(run) == before


# ----------------------------------------------------------------------------- resume
@pytest.mark.parametrize("overrides,expected", [
    (["data.train_size=10000", "data.split_seed=99"], "data.split_seed, data.train_size"),
    (["model.d_model=64"], "model.d_model"),
    (["model=small"], "cannot be applied to an existing run"),
    (["+trainer.foo=1"], "cannot be applied to an existing run"),
])
def test_failed_resume_leaves_the_run_byte_identical(tiny_run, tmp_path, capsys, overrides,
                                                     expected):
    """scripts/train.py trainer.resume=<run> with overrides the run cannot take."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    before = snapshot(run)
    status, err = run_script_in_process("train", [f"trainer.resume={run}", *overrides], capsys)
    assert status == 2, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert snapshot(run) == before


def test_resume_with_a_malformed_config_yaml(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "config.yaml").write_text("model: [unclosed\n  d_model: 3\n")
    before = snapshot(run)
    cfg = compose_train(tmp_path, f"trainer.resume={run}")
    with pytest.raises(TinyMTError, match="config.yaml is not valid YAML"):
        resume_config(cfg, [f"trainer.resume={run}"])
    assert snapshot(run) == before


# ----------------------------------------------------------------------------- tokenizer
def test_checkpoint_of_another_run_with_the_same_vocab_size_is_refused(tiny_run, tmp_path):
    """Another tokenizer of exactly the same size, trained on other sentences."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    size = load_run(str(run)).src_tokenizer.vocab_size
    pairs = [pair for _, pair in sample_pairs(77, 3000)]
    other = Tokenizer.train([p.zh for p in pairs] + [p.en for p in pairs],
                            tmp_path / "other" / "spm.model", vocab_size=size)
    assert other.vocab_size == size
    shutil.copyfile(other.model_path, run / "tokenizer" / "spm.model")
    with pytest.raises(TinyMTError, match="trained with another tokenizer"):
        load_run(str(run))
    with pytest.raises(TinyMTError, match="trained with another tokenizer"):
        translate(compose_cfg("translate", f"run={run}", "device=cpu"), ["他喜欢猫吗？"])


# ----------------------------------------------------------------------------- pickles
class Planted:
    """Unpickling this object creates a folder (it could as well delete one)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def plant(path: Path, marker: Path) -> None:
    """A checkpoint file with a real state dict beside a code-running object."""
    real = torch.load(path, weights_only=True) if path.is_file() else {"format": 2}
    torch.save({**real, "extra": Planted(marker)}, path)


def test_the_planted_object_would_run_if_loaded_unsafely(tiny_run, tmp_path):
    """The check of the check: with weights_only=False the plant does create its folder."""
    path, marker = tmp_path / "evil.pt", tmp_path / "pwned"
    shutil.copyfile(tiny_run / "checkpoints" / "last.pt", path)
    plant(path, marker)
    torch.load(path, weights_only=False)
    assert marker.is_dir()


LOADERS = {
    "load_checkpoint": lambda run, ckpt, tmp: load_checkpoint(ckpt),
    "translate checkpoint=": lambda run, ckpt, tmp: translate(
        compose_cfg("translate", f"run={run}", f"checkpoint={ckpt}", "device=cpu"), ["他"]),
    "translate run=latest (best.pt)": lambda run, ckpt, tmp: translate(
        compose_cfg("translate", "run=latest", f"outputs_root={run.parent}", "device=cpu"),
        ["他"]),
    "analyze_heads": lambda run, ckpt, tmp: analyze(
        compose_cfg("analyze_heads", f"run={run}", "checkpoint=best", "device=cpu",
                    "max_sentences=4"), progress=False, log=lambda m: None),
    "train trainer.resume=": lambda run, ckpt, tmp: train(resume_config(
        compose_train(tmp, f"trainer.resume={run}"), [f"trainer.resume={run}"])),
    "average_checkpoints": lambda run, ckpt, tmp: average_checkpoints(step_checkpoints(run)),
}
PLANTED_FILE = {"load_checkpoint": "best.pt", "translate checkpoint=": "best.pt",
                "translate run=latest (best.pt)": "best.pt", "analyze_heads": "best.pt",
                "train trainer.resume=": "last.pt", "average_checkpoints": "ckpt_40.pt"}


@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_planted_pickle_never_runs(tiny_run, tmp_path, loader):
    run = tmp_path / "outputs" / "run"
    shutil.copytree(tiny_run, run)
    ckpt = run / "checkpoints" / PLANTED_FILE[loader]
    marker = tmp_path / "pwned"
    plant(ckpt, marker)
    with pytest.raises(TinyMTError, match="objects other than tensors") as e:
        LOADERS[loader](run, ckpt, tmp_path)
    assert str(ckpt) in str(e.value)
    assert not marker.exists()


# ----------------------------------------------------------------------------- disk full
def test_disk_full_keeps_the_previous_checkpoint(tmp_path):
    """A real full file system (a 256 KiB tmpfs): one line, old file intact, no temp left."""
    from tinymt.checkpoint import save_checkpoint

    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}): needs root")
    try:
        save_checkpoint({"model": {"w": torch.ones(1000)}, "step": 1}, mnt / "last.pt")
        before = (mnt / "last.pt").read_bytes()
        with pytest.raises(TinyMTError) as e:
            save_checkpoint({"model": {"w": torch.ones(100_000)}, "step": 2}, mnt / "last.pt")
        assert str(e.value) == (f"no space left on device while writing {mnt / 'last.pt'}; "
                                "the previous checkpoint is intact")
        assert (mnt / "last.pt").read_bytes() == before
        assert sorted(p.name for p in mnt.iterdir()) == ["last.pt"]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
