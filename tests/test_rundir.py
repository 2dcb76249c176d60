"""Run dirs: claimed atomically, never overwritten, checkpoints bound to their tokenizer,
loading never runs code, a failed resume leaves the run byte-identical."""

import contextlib
import hashlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked
import pytest
import torch
from hydra import compose, initialize_config_dir

import tinymt.config  # noqa: F401  (registers the schemas)
from conftest import (
    TINY_TRAIN_OVERRIDES,
    compose_train,
    copy_run,
    run_script_in_process,
    run_script_with_fault,
    sample_pairs,
)
from tinymt.checkpoint import load_checkpoint
from tinymt.errors import TinyMTError
from tinymt.rundir import claim_run_dir, load_run
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
def _claim_at_once(path: Path, n: int, within_s: float = 60) -> list[str]:
    """``claim_run_dir(path, unique=True)`` in ``n`` processes let go at the same moment: the
    folders they got. Plain forks that make no call but the claim and leave by ``os._exit``:
    this process has threads (pytest-xdist's, torch's), and a fork copies none of them, so a
    child that took a lock one of them held (a Pool's workers and queues, a Manager's barrier)
    would wait forever; every wait here has a deadline."""
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:  # the child: wait for the start, claim, report, leave
            try:
                os.read(go_r, 1)
                try:
                    got = str(claim_run_dir(path, unique=True))
                except Exception as e:  # (one line, as the test's failure shows it)
                    got = f"error: {e!r}"
                os.write(out_w, f"{got}\n".encode())
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(out_w)
    os.write(go_w, b"x" * n)  # all of them at once
    got, end = b"", time.monotonic() + within_s
    try:
        while got.count(b"\n") < n and select.select([out_r], [], [], end - time.monotonic())[0]:
            if not (chunk := os.read(out_r, 1 << 16)):
                break
            got += chunk
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for fd in (go_r, go_w, out_r):
            os.close(fd)
    return got.decode().splitlines()


@pytest.mark.parametrize("made_by_hydra", [False, True])
def test_runs_started_at_once_get_their_own_folders(tmp_path, made_by_hydra):
    """Eight processes claim the same clock-named folder at the same moment (Hydra makes
    it, empty, before each of them starts)."""
    n, path = 8, tmp_path / "12-00-00"
    if made_by_hydra:
        path.mkdir()
    got = _claim_at_once(path, n)
    assert len(set(got)) == n
    assert sorted(Path(p).name for p in got) == ["12-00-00"] + [f"12-00-00_{i}"
                                                                for i in range(1, n)]
    for p in got:
        assert [c.name for c in Path(p).iterdir()] == ["checkpoints"]


def test_a_named_folder_must_be_new_or_empty(tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir()
    full.mkdir()
    (full / "notes.txt").write_text("mine\n")
    assert claim_run_dir(empty, unique=False) == empty
    assert claim_run_dir(tmp_path / "new" / "run", unique=False) == tmp_path / "new" / "run"
    with pytest.raises(TinyMTError, match="is not an empty folder"):
        claim_run_dir(full, unique=False)
    assert [p.name for p in full.iterdir()] == ["notes.txt"]


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
    (["run_dir=elsewhere"], "a resumed run goes on in its own folder"),
    (["+trainer.foo=1"], "trainer.foo: Key 'foo' not in 'TrainerConfig'"),
    # the Attention tab's probe_<k> would show another sentence after the resume
    (["trainer.probe_sentences=['我喜欢猫。']"], "trainer.probe_sentences would make another"),
    (["trainer.n_probes=3", "trainer.seed=7"], "trainer.n_probes, trainer.seed would make"),
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


# every command reads checkpoints through load_checkpoint (the one unpickler of src/ and
# scripts/: tests/test_loaders.py::test_only_the_checkpoint_loader_unpickles): the loader,
# and one command through it
LOADERS = {
    "load_checkpoint": lambda run, ckpt, tmp: load_checkpoint(ckpt),
    "translate checkpoint=": lambda run, ckpt, tmp: translate(
        compose_cfg("translate", f"run={run}", f"checkpoint={ckpt}", "device=cpu"), ["他"]),
}
PLANTED_FILE = {"load_checkpoint": "best.pt", "translate checkpoint=": "best.pt"}


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
@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(kib)``: a real, tiny tmpfs that fills up (needs root; skips without)."""
    mounted = []

    def mount(kib: int) -> Path:
        mnt = tmp_path / f"small{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()}): needs root")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_keeps_the_previous_checkpoint(small_disk):
    """A real full file system (a 256 KiB tmpfs): one line, old file intact, no temp left."""
    from tinymt.checkpoint import save_checkpoint

    mnt = small_disk(256)
    save_checkpoint({"model": {"w": torch.ones(1000)}, "step": 1}, mnt / "last.pt")
    before = (mnt / "last.pt").read_bytes()
    with pytest.raises(TinyMTError) as e:
        save_checkpoint({"model": {"w": torch.ones(100_000)}, "step": 2}, mnt / "last.pt")
    assert str(e.value) == (f"no space left on device while writing {mnt / 'last.pt'}; "
                            "the previous version is intact")
    assert (mnt / "last.pt").read_bytes() == before
    with pytest.raises(TinyMTError) as e:  # a new file: there was no previous version
        save_checkpoint({"model": {"w": torch.ones(100_000)}, "step": 2}, mnt / "best.pt")
    assert str(e.value).endswith("; nothing was left there")
    assert sorted(p.name for p in mnt.iterdir()) == ["last.pt"]


def test_disk_full_while_a_new_run_writes_its_files(small_disk, tmp_path, capsys):
    """scripts/train.py into a folder with room for its checkpoints folder but not its
    tokenizer: a traceback, and a half-made run (config.yaml, no tokenizer) that could
    neither be resumed nor reused. Now one line, nothing left, and the folder free for the
    retry."""
    run = small_disk(12) / "run"
    status, err = run_script_in_process("train", [
        *TINY_TRAIN_OVERRIDES, f"data.cache_dir={tmp_path / 'cache'}", f"run_dir={run}",
        "trainer.max_steps=2"], capsys)
    assert status == 2, err[-2000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and "no space left on device" in line, err[-2000:]
    assert "Traceback" not in err
    assert list(run.iterdir()) == []  # nothing left (scripts/train.py removes the folder)
    assert claim_run_dir(run, unique=False) == run  # free for the retry


def test_disk_full_while_preparing_data(small_disk, text_corpus, capsys):
    """scripts/prepare_data.py with its cache on a full disk: one line, nothing left."""
    cache = small_disk(64) / "cache"
    status, err = run_script_in_process("prepare_data", [
        "data.source=text", f"data.path={text_corpus}", "data.src_lang=de",
        "data.tgt_lang=en", "data.train_split=train", "data.valid_split=valid",
        "data.test_split=test", "data.vocab_size=40", f"data.cache_dir={cache}"], capsys)
    assert status == 2, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "no space left on device" in lines[0], err[-2000:]
    assert [p.name for p in cache.iterdir()] == []


# ----------------------------------------------------------------------------- outputs
# every file of a run's state, through links: the property
# tests/test_files.py::test_a_run_s_own_state_is_never_an_output; here the script's wiring
RUN_STATE = ["checkpoints/last.pt", "checkpoints"]


@pytest.mark.parametrize("target", RUN_STATE)
def test_averaging_never_writes_over_the_run_state(tiny_run, tmp_path, capsys, target):
    """average_checkpoints.py output=<run>/checkpoints/last.pt (best.pt, config.yaml, ...)
    is refused: an optimizer-less average there would leave a run that cannot resume."""
    run = copy_run(tiny_run, tmp_path / "run")
    before = snapshot(run)
    status, err = run_script_in_process("average_checkpoints", [
        f"run={run}", "last=2", f"output={run}/{target}"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: output="), lines
    assert snapshot(run) == before


def test_averaging_into_avg_pt_stays_allowed(tiny_run, tmp_path, capsys):
    run = copy_run(tiny_run, tmp_path / "run")
    before = snapshot(run)
    status, err = run_script_in_process("average_checkpoints", [
        f"run={run}", "last=2", f"output={run}/checkpoints/avg.pt"], capsys)
    assert status == 0, err[-2000:]
    assert snapshot(run) == {**before, "checkpoints/avg.pt": snapshot(run)["checkpoints/avg.pt"]}


# ----------------------------------------------------------------------------- leftovers
def test_a_run_may_not_start_in_a_folder_holding_runs(tiny_run, tmp_path, capsys):
    """run_dir= naming a folder that holds runs (run=latest would then find the wrong one):
    one line, nothing written."""
    outer = tmp_path / "outer"
    shutil.copytree(tiny_run, outer / "run")
    before = snapshot(outer)
    status, err = run_script_in_process("train", [
        *TINY_TRAIN_OVERRIDES, f"data.cache_dir={tmp_path / 'cache'}", f"run_dir={outer}",
        "trainer.max_steps=2"], capsys)
    assert status == 2, err[-2000:]
    assert err.strip().startswith("error: ") and "is not an empty folder" in err, err[-2000:]
    assert snapshot(outer) == before


@pytest.mark.slow
def test_a_run_that_failed_before_writing_leaves_its_folder_free(tmp_path, capsys):
    """A run that fails after claiming its folder (here: a vocabulary too large for the
    corpus; SIGTERM while its data is prepared) leaves it free, not a folder that can
    neither be resumed nor reused. The retry, as a user types it, trains there; and
    run_dir= leaves no empty outputs/<date>/<time>."""
    run = tmp_path / "run"
    common = [*TINY_TRAIN_OVERRIDES, f"data.cache_dir={tmp_path / 'cache'}", f"run_dir={run}"]
    status, err = run_script_in_process("train", [*common, "data.vocab_size=90000"], capsys)
    assert status == 2 and "data.vocab_size=90000 does not suit" in err, err[-2000:]
    fault = ("import os, signal, tinymt.trainer.loop as loop\n"
             "def prepare(*args, **kwargs):\n"
             "    os.kill(os.getpid(), signal.SIGTERM)\n"
             "loop.prepare = prepare\n")
    stopped = run_script_with_fault("train", common, fault, cwd=tmp_path)
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == "stopped by SIGTERM"
    done = forked.run([sys.executable, str(ROOT / "scripts" / "train.py"), *common,
                       "trainer.max_steps=2", "trainer.valid_sentences=4",
                       "data.test_size=4"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (run / "metrics.json").is_file()
    assert not (tmp_path / "outputs").exists()


def test_a_run_that_stopped_before_its_first_checkpoint_says_what_to_do(tiny_run, tmp_path,
                                                                         capsys):
    """Neither "already holds a run" (then resume says config.yaml... not found) nor a
    resume that cannot be: both say there is nothing to resume and what to do."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()  # made when the run claimed its folder
    new = [*TINY_TRAIN_OVERRIDES, f"data.cache_dir={tmp_path / 'cache'}", f"run_dir={run}"]
    for args in (new, [f"trainer.resume={run}", f"data.cache_dir={tmp_path / 'cache'}"]):
        status, err = run_script_in_process("train", args, capsys)
        assert status == 2, err[-2000:]
        assert "stopped before its first checkpoint" in err and f"rm -r {run}" in err, err


def test_checkpoint_pruned_is_named(tiny_run, capsys):
    """checkpoint=pruned of a run never pruned: the message names the run's pruned.pt (it
    was taken for a file called "pruned")."""
    status, err = run_script_in_process("translate", [f"run={tiny_run}", "checkpoint=pruned",
                                                      "device=cpu", "他喜欢猫吗？"], capsys)
    assert status == 2
    assert f"checkpoint {tiny_run / 'checkpoints' / 'pruned.pt'} does not exist" in err, err


def test_run_latest_skips_a_folder_removed_while_it_looks(tmp_path, monkeypatch):
    """``run=latest`` walks outputs/ while other runs come and go (a sweep, a user's
    ``rm -r``): a folder gone under the walk, or a ``last.pt`` gone before its time is read,
    is skipped, not an internal error (FileNotFoundError)."""
    from tinymt.rundir import find_run

    for name in ("a", "b", "c"):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / name / "checkpoints" / "last.pt").write_bytes(b"x")
    real_scandir, real_stat = os.scandir, os.stat

    def scandir(path="."):  # "a" is removed as the walk reaches it
        if Path(path).name == "a":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_scandir(path)

    def stat(path, *args, **kwargs):  # c's last.pt is removed after it was listed
        if Path(path).parent.parent.name == "c":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", stat)
    assert find_run("latest", str(tmp_path)) == tmp_path / "b"
