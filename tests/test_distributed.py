"""torchrun --nproc_per_node=2 on CPU (gloo): same global batches, same losses as one
process, only rank 0 writes, and the checkpoint resumes in a single process."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY_TRAIN_OVERRIDES

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
# dropout off: with it, each rank would draw masks for its own share of the batch
COMMON = [*TINY_TRAIN_OVERRIDES, "model.dropout=0.0", "trainer.max_steps=12",
          "trainer.valid_every=6", "trainer.valid_sentences=10", "trainer.test_beam=1"]


def _losses(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("train/loss")]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.skipif(not shutil.which(str(TORCHRUN)), reason="torchrun not installed")
def test_torchrun_two_processes_matches_single_process(tmp_path):
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    r = subprocess.run([sys.executable, "scripts/train.py", *COMMON, cache,
                        f"run_dir={single}", f"hydra.run.dir={single}"],
                       capture_output=True, text=True, cwd=ROOT, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]

    r = subprocess.run([str(TORCHRUN), "--standalone", "--nproc_per_node=2", "scripts/train.py",
                        *COMMON, cache, f"run_dir={ddp}", f"hydra.run.dir={ddp}"],
                       capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 processes" in r.stdout

    # rank 0 alone wrote the run dir: one event file, one progress summary
    assert len(list(ddp.glob("events.out.tfevents.*"))) == 1
    assert r.stdout.count("done in") == 1

    # the same global batches give the same losses, up to float summation order
    a, b = _losses(single), _losses(ddp)
    assert len(a) == len(b) == 12
    assert b == pytest.approx(a, rel=1e-4)
    ma = json.loads((single / "metrics.json").read_text())
    mb = json.loads((ddp / "metrics.json").read_text())
    assert mb["best_valid_bleu"] == pytest.approx(ma["best_valid_bleu"], abs=0.5)

    # the 2-process checkpoint resumes in one process and goes on
    r = subprocess.run([sys.executable, "scripts/train.py", f"trainer.resume={ddp}",
                        "trainer.max_steps=15"], capture_output=True, text=True, cwd=ROOT,
                       env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed" in r.stdout and "at step 12" in r.stdout
    assert json.loads((ddp / "metrics.json").read_text())["steps"] == 15
