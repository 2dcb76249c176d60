"""torchrun --nproc_per_node=2 on CPU (gloo): same global batches (subword regularization
drawn alike on every rank), same losses, the same
function (logits to float rounding) and the same translations as one process; only rank 0
writes, and the checkpoint resumes in a single process. The ranks decide the wall-clock
budget together, even when one of them runs slower."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import forked
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY_TRAIN_OVERRIDES, compose_train
from tinymt.batching import collate
from tinymt.corpus import SHOWCASE, generate_splits
from tinymt.data import normalize
from tinymt.decoding import translate_ids
from tinymt.rundir import load_run
from tinymt.trainer import resume_config, train

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
# dropout off: with it, each rank would draw masks for its own share of the batch.
# Subword regularization on, over 150 pairs (a few batches an epoch): each rank draws
# every epoch's segmentation itself, and the losses agree only if the draws do.
COMMON = [*TINY_TRAIN_OVERRIDES, "model.dropout=0.0", "trainer.max_steps=12",
          "trainer.valid_every=6", "trainer.valid_sentences=10", "trainer.test_beam=1",
          "data.sampling_alpha=0.1", "data.train_size=150"]


def _losses(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("train/loss")]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _sentences(run) -> list[list[int]]:
    """Source ids of the run's test split and the showcase sentences."""
    d = run.config["data"]
    splits = generate_splits(seed=d["split_seed"], train_size=d["train_size"],
                             valid_size=d["valid_size"], test_size=d["test_size"])
    zh = [p.zh for p in splits["test"]] + [p.zh for p in SHOWCASE]
    return [run.src_tokenizer.encode(normalize(s)) for s in zh]


def _translations(run, src_ids):
    """Greedy tokens, beam-3 tokens and beam-3 scores of every sentence."""
    greedy = [out[0][0] for out in translate_ids(run.model, src_ids, beam=1)]
    beam = translate_ids(run.model, src_ids, beam=3, nbest=3)
    return greedy, [[t for t, _ in hyps] for hyps in beam], [[s for _, s in hyps] for hyps in beam]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(str(TORCHRUN)), reason="torchrun not installed")
def test_torchrun_two_processes_matches_single_process(tmp_path, capsys):
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    train(compose_train(tmp_path, *COMMON, cache, f"run_dir={single}"))  # one process: this one

    r = forked.run([sys.executable, str(TORCHRUN), "--standalone", "--nproc_per_node=2",
                    "scripts/train.py", *COMMON, cache, f"run_dir={ddp}", f"hydra.run.dir={ddp}"],
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

    # ... and the same model: after 12 steps both compute the same function to float
    # rounding, and translate every sentence into the same tokens. (Not every weight
    # agrees: Adam divides each gradient by its own running size, so an element whose
    # gradient is ~0, e.g. the key bias that softmax ignores, moves by about lr in a
    # direction set by summation-order noise; such elements do not change the outputs.)
    run_a, run_b = load_run(str(single), "last", "cpu"), load_run(str(ddp), "last", "cpu")
    assert run_a.state["step"] == run_b.state["step"] == 12
    assert run_a.model.state_dict().keys() == run_b.model.state_dict().keys()
    src_ids = _sentences(run_a)
    assert src_ids == _sentences(run_b) and len(src_ids) == 42
    batch = collate(src_ids, src_ids)  # any target text: the logits are compared
    with torch.no_grad():
        logits_a, _ = run_a.model.eval()(batch.src, batch.tgt_in)
        logits_b, _ = run_b.model.eval()(batch.src, batch.tgt_in)
    torch.testing.assert_close(logits_b, logits_a, rtol=1e-4, atol=1e-4)
    greedy_a, beam_a, scores_a = _translations(run_a, src_ids)
    greedy_b, beam_b, scores_b = _translations(run_b, src_ids)
    assert greedy_b == greedy_a
    assert beam_b == beam_a
    assert scores_b == [pytest.approx(s, abs=1e-4) for s in scores_a]
    assert len({tuple(g) for g in greedy_a}) > 1  # not one output for every input
    # validation translated the same sentences into the same text: the same BLEU
    ma = json.loads((single / "metrics.json").read_text())
    mb = json.loads((ddp / "metrics.json").read_text())
    assert mb["best_valid_bleu"] == ma["best_valid_bleu"]
    assert ma["epochs"] == mb["epochs"] >= 1  # an epoch boundary crossed: a second draw

    # the 2-process checkpoint resumes in one process and goes on
    capsys.readouterr()
    resume = [f"trainer.resume={ddp}", "trainer.max_steps=15"]
    train(resume_config(compose_train(tmp_path, *resume), resume))
    out = capsys.readouterr().out
    assert "resumed" in out and "at step 12" in out
    assert json.loads((ddp / "metrics.json").read_text())["steps"] == 15


def test_a_collective_failing_is_one_line_naming_the_rank():
    """gloo's error when another rank died: "rank <r>: another rank stopped (<why>)", its
    source path and advice left out; any other exception, or one outside torchrun: None."""
    from tinymt.runtime import Runtime, rank_lost

    gloo = RuntimeError("[/src/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
                        "[127.0.0.1]:43188: Connection reset by peer. This is typically caused "
                        "by a remote worker hanging. GLHF!\nmore")
    rt = Runtime(torch.device("cpu"), None, rank=1, world_size=2, distributed=True)
    assert rank_lost(rt, gloo) == ("rank 1: another rank stopped (Read error [127.0.0.1]:43188: "
                                   "Connection reset by peer)")
    assert rank_lost(rt, torch.distributed.DistBackendError("NCCL error")).startswith("rank 1: ")
    assert rank_lost(rt, RuntimeError("shape mismatch")) is None
    assert rank_lost(rt, KeyboardInterrupt()) is None
    assert rank_lost(Runtime(torch.device("cpu"), None), gloo) is None


def _torchrun_logged(log: Path, *args: str) -> int:
    """``torchrun --nproc_per_node=2 <args>`` (its ranks' output into ``log``: a file, not a
    pipe, which ranks that outlive torchrun could block); its exit status, or the test
    fails with the log's end after 300 s."""
    with log.open("w") as f:
        proc = forked.popen([sys.executable, str(TORCHRUN), "--standalone", "--nproc_per_node=2",
                             *args], cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # torchrun stops its ranks
            proc.wait(timeout=60)
            pytest.fail(f"the ranks hung (stopped after 300 s):\n{log.read_text()[-3000:]}")


# scripts/train.py under torchrun, rank 1 SIGKILLed (as the kernel's OOM killer would: no
# cleanup, no word) once the first checkpoint is published and the ranks have met after it
KILL_RANK_1 = """
import os, runpy, signal, sys
import tinymt.cli
import tinymt.trainer.loop as loop
checkpoint = loop.validate_and_checkpoint
def then_die(*args):
    stop = checkpoint(*args)
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return stop
loop.validate_and_checkpoint = then_die
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(str(TORCHRUN)), reason="torchrun not installed")
def test_a_killed_rank_leaves_one_line_from_the_other(tmp_path):
    """torchrun, rank 1 SIGKILLed after the first checkpoint (``KILL_RANK_1``): rank 0, its
    collective failing, ends in one line naming itself and the intact last.pt; no rank
    prints a traceback, and last.pt loads."""
    run, log, driver = tmp_path / "run", tmp_path / "torchrun.log", tmp_path / "kill.py"
    driver.write_text(KILL_RANK_1)
    code = _torchrun_logged(log, str(driver), "scripts/train.py", *COMMON,
                            "trainer.max_steps=100000", "trainer.valid_every=3",
                            f"data.cache_dir={tmp_path / 'cache'}", f"run_dir={run}",
                            f"hydra.run.dir={run}")
    out = log.read_text()
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code != 0 and len(errors) == 1, out[-3000:]
    assert errors[0].startswith("error: rank 0: another rank stopped (") and \
        f"{run}/checkpoints/last.pt is intact" in errors[0], errors
    # torch prefixes a rank's traceback with [rank<r>]:; torchrun's own report may stay
    assert "[rank" not in out and 'scripts/train.py", line' not in out, out[-3000:]
    assert load_run(str(run), "last", "cpu").state["step"] >= 3
    assert all(p.suffix == ".pt" for p in (run / "checkpoints").iterdir())


# train(cfg) under torchrun, each rank writing the metrics it returns to <dir>/rank<r>.json
DRIVER = """
import json, os, sys
from hydra import compose, initialize_config_dir
import tinymt.config
from tinymt.trainer import train
with initialize_config_dir(version_base="1.3", config_dir=sys.argv[1]):
    cfg = compose(config_name="train", overrides=sys.argv[3:])
metrics = train(cfg)
with open(os.path.join(sys.argv[2], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(metrics, f)
"""
# rank 1 sleeps 0.1 s after the losses are summed (read_steps' all-reduce at each log, the
# last collective of that step), outside its timed part: rank 0 waits for it inside the
# next step (the gradients' all-reduce), and its clock runs ahead
SLOW_RANK_1 = """
import os, time
import tinymt.runtime as runtime
reduce = runtime.all_reduce
def slow(rt, values, op="sum"):
    out = reduce(rt, values, op)
    if op == "sum":
        time.sleep(0.1)
    return out
if os.environ["RANK"] == "1":
    runtime.all_reduce = slow
"""


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(str(TORCHRUN)), reason="torchrun not installed")
def test_torchrun_ranks_share_one_clock_for_the_budget(tmp_path):
    """``trainer.max_minutes`` under torchrun with rank 1 sleeping 0.1 s at each log (every
    third step; outside its timed part: ``SLOW_RANK_1``), so that rank 0's own clock
    (which waits for rank 1 in the gradient all-reduce) runs far ahead of rank 1's. The
    ranks agree on the clock at each log only, and the run still ends cleanly, the budget
    spent, both ranks at the same step with the same training seconds. Each rank deciding
    by its own clock, rank 0 validated and stopped while rank 1 trained on, and the two
    hung in mismatched collectives."""
    driver = tmp_path / "drive.py"
    driver.write_text(SLOW_RANK_1 + DRIVER)
    overrides = [o for o in TINY_TRAIN_OVERRIDES if not o.startswith("trainer.max_minutes=")]
    overrides += ["data.train_size=150",  # (COMMON's: a quicker start, an epoch a few steps)
                  "model.dropout=0.0", "trainer.max_minutes=0.05", "trainer.max_steps=100000",
                  "trainer.log_every=3",
                  "trainer.valid_every=100000", "trainer.valid_sentences=10",
                  "trainer.test_beam=1", f"data.cache_dir={tmp_path / 'cache'}",
                  f"run_dir={tmp_path / 'run'}"]
    log = tmp_path / "torchrun.log"
    code = _torchrun_logged(log, str(driver), str(ROOT / "configs"), str(tmp_path), *overrides)
    assert code == 0, log.read_text()[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [m["stop_reason"] for m in ranks] == ["max_minutes"] * 2
    assert ranks[0]["steps"] == ranks[1]["steps"] > 5
    assert ranks[0]["train_seconds"] == ranks[1]["train_seconds"] >= 3.0
    assert ranks[0]["steps"] % 3 == 0  # the budget is seen where the ranks agree
    assert ranks[0]["train_seconds"] >= 0.1 * (ranks[0]["steps"] // 3 - 1)  # rank 0 waited


def test_each_torchrun_rank_takes_its_own_gpu(monkeypatch):
    """``device=cuda`` names no GPU: rank ``LOCAL_RANK`` takes ``cuda:LOCAL_RANK`` (NCCL
    needs an index for ``torch.cuda.set_device``); an index past the GPUs is one line. The
    GPU count is faked: the rule is arithmetic, and tests/test_cuda.py runs it on a GPU."""
    from tinymt.errors import TinyMTError
    from tinymt.runtime import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert pick_device("cuda", 1) == torch.device("cuda", 1)
    assert pick_device("cuda:0", 1) == torch.device("cuda", 0)
    with pytest.raises(TinyMTError, match="2 CUDA GPU"):
        pick_device("cuda:2")
