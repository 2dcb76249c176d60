"""A run stays resumable whatever happens to it: a rebuilt data cache, a kill at any point
of a validation's publishing. Through scripts/train.py where the bug
was in what a user runs; the kill matrix in-process (the same ``train``), one
real SIGKILL beside it."""

import json
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO_ROOT, compose_train, copy_run, run_script_with_fault
from conftest import TINY_TRAIN_OVERRIDES as TINY
from tinymt.checkpoint import load_checkpoint
from tinymt.errors import Stopped, TinyMTError
from tinymt.rundir import step_checkpoints
from tinymt.trainer import resume_config, train


# ----------------------------------------------------------------------------- rebuilt cache
@pytest.mark.slow
def test_resume_across_a_rebuilt_data_cache(tmp_path, monkeypatch):
    """The tokenizer's digest once covered sentencepiece's build path: the same data config
    built again (cache deleted, another working directory: ``data.cache_dir`` is
    relative) gave another digest, and the run could never be resumed."""
    here, there, run = tmp_path / "here", tmp_path / "there", tmp_path / "run"
    here.mkdir(), there.mkdir()
    monkeypatch.chdir(here)
    train(compose_train(tmp_path, "data.cache_dir=cache", "trainer.max_steps=2",
                        "trainer.valid_every=2", "trainer.valid_sentences=5", "data.test_size=5"))
    shutil.rmtree(here / "cache")
    monkeypatch.chdir(there)
    again = [f"trainer.resume={run}", "trainer.max_steps=4"]
    assert train(resume_config(compose_train(tmp_path, *again), again))["steps"] == 4
    rebuilt = list((there / "cache").glob("*/tokenizer/spm.model"))
    assert len(rebuilt) == 1  # really rebuilt, in the other working directory
    assert rebuilt[0].read_bytes() == (run / "tokenizer" / "spm.model").read_bytes()
    assert json.loads((run / "metrics.json").read_text())["steps"] == 4


# ----------------------------------------------------------------------------- kills
# six steps, a validation every two (a log every three: a log's steps span a checkpoint),
# step checkpoints kept: the publishing of a validation
# is last.pt, best.pt (when BLEU rose), ckpt_<step>.pt; the run ends with metrics.json
KILL_RUN = ["trainer.max_steps=6", "trainer.valid_every=2", "trainer.log_every=3",
            "trainer.keep_last=2",
            "trainer.valid_sentences=10", "trainer.test_beam=1", "data.test_size=10",
            "trainer.attention_images=false"]


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception: no handler catches it)."""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same run, never killed, and the step of its best.pt."""
    tmp = tmp_path_factory.mktemp("kill_ref")
    metrics = train(compose_train(tmp, *KILL_RUN))
    best = load_checkpoint(tmp / "run" / "checkpoints" / "best.pt")
    return tmp, metrics, best["step"]


def _weights(path: Path) -> dict:
    return load_checkpoint(path)["model"]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# (before ckpt.pt is after last.pt: at the step after the best one nothing comes between)
POINTS = [(name, when) for name in ("last.pt", "best.pt", "ckpt.pt", "metrics.json")
          for when in ("before", "after") if (name, when) != ("ckpt.pt", "before")]


@pytest.mark.slow
@pytest.mark.parametrize("name,when", POINTS, ids=[f"{w}-{n}" for n, w in POINTS])
def test_a_kill_at_any_publish_point_resumes_to_the_same_run(uninterrupted, tmp_path,
                                                             monkeypatch, name, when):
    """Killed just before or just after one file of a validation (best.pt: the one that
    made the final best.pt; last.pt, ckpt_<step>.pt: one after the first checkpoint, as
    before it there is nothing to resume) or of the end, then resumed: every published
    file and the metrics are the uninterrupted run's, and the test score is that of the
    best.pt it names. (A kill after last.pt, before best.pt, left best.pt stale for good.)"""
    import tinymt.trainer.loop as loop
    import tinymt.trainer.state as state

    ref, ref_metrics, best_step = uninterrupted
    step = best_step if name == "best.pt" else best_step + 2
    target = f"ckpt_{step}.pt" if name == "ckpt.pt" else name
    real_save = state.save_checkpoint  # checkpoints: trainer.state; metrics.json: loop
    real_text = loop.write_text

    def at(path, publish):
        if Path(path).name == target and (publish is None or publish["step"] == step):
            if when == "before":
                raise Killed
            return True
        return False

    def save(state, path, **kw):
        kill = at(path, state)
        real_save(state, path, **kw)
        if kill:
            raise Killed

    def text(content, path, **kw):
        kill = at(path, None)
        real_text(content, path, **kw)
        if kill:
            raise Killed

    monkeypatch.setattr(state, "save_checkpoint", save)
    monkeypatch.setattr(loop, "write_text", text)
    shutil.copytree(ref / "cache", tmp_path / "cache")  # the same data, not built again
    with pytest.raises(Killed):
        train(compose_train(tmp_path, *KILL_RUN))
    monkeypatch.undo()
    _resume_to_the_same_run(tmp_path, uninterrupted)


def _resume_to_the_same_run(tmp_path: Path, uninterrupted) -> None:
    """Resume ``tmp_path``'s run: its published files, metrics and loss curve are the
    uninterrupted run's."""
    ref, ref_metrics, best_step = uninterrupted
    run = tmp_path / "run"
    cfg = compose_train(tmp_path, *KILL_RUN, f"trainer.resume={run}")
    metrics = train(resume_config(cfg, [f"trainer.resume={run}"]))
    ckpts = ref / "run" / "checkpoints"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
        p.name for p in ckpts.iterdir())
    for f in ckpts.iterdir():
        assert _same_weights(run / "checkpoints" / f.name, f), f.name
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    assert best["step"] == best_step == metrics["test_checkpoint_step"]
    assert best["trainer_state"]["best_bleu"] == metrics["best_valid_bleu"]
    on_disk = json.loads((run / "metrics.json").read_text())
    for key in ("best_valid_bleu", "test_bleu", "test_checkpoint_step", "steps"):
        assert on_disk[key] == metrics[key] == ref_metrics[key], key
    curves = []
    for folder in (run, ref / "run"):
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        events.Reload()
        curves.append([(e.step, e.value) for e in events.Scalars("train/loss")])
    assert curves[0] == curves[1] and [s for s, _ in curves[0]] == [3, 6]


@pytest.mark.slow
@pytest.mark.parametrize("sig,cli", [(signal.SIGTERM, True), (signal.SIGINT, False)],
                         ids=["SIGTERM-through-the-cli", "Ctrl-C-in-process"])
def test_a_signal_saves_the_step_under_way_and_resumes_to_the_same_run(
        uninterrupted, tmp_path, monkeypatch, sig, cli):
    """SIGTERM (scripts/train.py, as a scheduler sends it) or Ctrl-C at step 5, one step
    after the validation of step 4: the run publishes last.pt at step 5, marked stopped, no
    ckpt_5.pt, says how to go on, exits 128 + the signal; resumed, every published file and
    the metrics are the uninterrupted run's. (Once, a signal lost every step since the
    last validation; a resume from a last.pt of step 5 would publish a ckpt_5.pt, which
    keep_last and the final average would then take for a validation's.)"""
    import tinymt.trainer.loop as loop

    ref = uninterrupted[0]
    shutil.copytree(ref / "cache", tmp_path / "cache")  # the same data, not built again
    run = tmp_path / "run"
    fault = ("import os, tinymt.trainer.loop as loop\n"
             "real = loop.optimizer_step\n"
             "def step(t):\n"
             "    grad_norm = real(t)\n"
             "    if t.state['step'] == 5:\n"
             f"        os.kill(os.getpid(), {int(sig)})\n"
             "    return grad_norm\n"
             "loop.optimizer_step = step\n")
    if cli:
        done = run_script_with_fault("train", [*TINY, f"data.cache_dir={tmp_path / 'cache'}",
                                               f"run_dir={run}", f"hydra.run.dir={run}",
                                               *KILL_RUN], fault)
        assert done.returncode == 128 + sig, done.stderr[-2000:]
        message = done.stderr.strip().splitlines()[-1]
    else:
        before = signal.getsignal(sig)
        fault_ns: dict = {}
        exec(fault.removesuffix("loop.optimizer_step = step\n"), fault_ns)
        monkeypatch.setattr(loop, "optimizer_step", fault_ns["step"])
        with pytest.raises(Stopped) as stopped:
            train(compose_train(tmp_path, *KILL_RUN))
        monkeypatch.undo()
        assert stopped.value.signum == sig
        assert signal.getsignal(sig) is before  # the handler is given back
        message = stopped.value.message
    assert message == (f"stopped by {signal.Signals(sig).name} after step 5: saved in "
                       f"{run / 'checkpoints' / 'last.pt'}; go on with: "
                       f"python scripts/train.py trainer.resume={run}")
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["step"] == 5 and last["stopped"] is True
    assert [p.name for p in step_checkpoints(run)] == ["ckpt_2.pt", "ckpt_4.pt"]  # no ckpt_5
    assert not (run / "metrics.json").exists()
    # a resume within the second the killed run's event file was made in, by a smaller pid:
    # TensorBoard reads a run's files in name order (second, host, pid), the resumed one last
    killed, = run.glob("events.out.tfevents.*")
    killed.rename(run / f"events.out.tfevents.{int(time.time()) + 1}.host.99999999.0")
    _resume_to_the_same_run(tmp_path, uninterrupted)


@pytest.mark.slow
def test_sigkill_between_last_and_best_is_repaired_on_resume(tmp_path, capsys):
    """The real thing once: scripts/train.py killed (SIGKILL) right after the first
    validation published last.pt, before best.pt; resumed, the run's best.pt is the model of the validation that last raised BLEU (step
    2, unless step 4 did)."""
    run = tmp_path / "run"
    fault = ("import os, signal, tinymt.trainer.state as state\n"
             "real = state.save_checkpoint\n"
             "def save(state, path, **kw):\n"
             "    real(state, path, **kw)\n"
             "    if path.name == 'last.pt':\n"
             "        os.kill(os.getpid(), signal.SIGKILL)\n"
             "state.save_checkpoint = save\n")
    common = [*TINY, f"data.cache_dir={tmp_path / 'cache'}", "trainer.max_steps=4",
              "trainer.valid_every=2", "trainer.valid_sentences=5", "data.test_size=5",
              "trainer.attention_images=false"]
    killed = run_script_with_fault("train", [*common, f"run_dir={run}"], fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (run / "checkpoints" / "best.pt").exists()
    at_2 = tmp_path / "step2.pt"
    shutil.copyfile(run / "checkpoints" / "last.pt", at_2)
    capsys.readouterr()
    train(resume_config(compose_train(tmp_path, f"trainer.resume={run}"),
                        [f"trainer.resume={run}"]))
    step4 = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("step      4"))
    best = load_checkpoint(run / "checkpoints" / "best.pt")
    if step4.endswith("*"):  # BLEU rose at step 4: best.pt is that model
        assert best["step"] == 4
    else:
        assert best["step"] == 2 and _same_weights(run / "checkpoints" / "best.pt", at_2)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["best_valid_bleu"] == best["trainer_state"]["best_bleu"]


@pytest.mark.slow  # a training
def test_a_resume_trains_with_the_optimizer_settings_it_is_given(tmp_path):
    """``optim.*`` may change on resume: from there on the optimizer has this config's peak
    lr (on the schedule, at its step), betas, weight decay and kernel (the fused one after
    the plain one), not the checkpoint's; an override in Hydra's grammar (``int(3)``) reads
    as in a new run."""
    from tinymt.trainer.optim import lr_factor

    run, short = tmp_path / "run", ["trainer.valid_sentences=5", "data.test_size=5"]
    train(compose_train(tmp_path, "trainer.max_steps=2", "trainer.valid_every=2", *short,
                        "optim.fused=false"))
    again = [f"trainer.resume={run}", "trainer.max_steps=int(3)", "optim.lr=1e-3",
             "optim.betas=[0.5,0.6]", "optim.weight_decay=0.25", "optim.fused=true", *short]
    assert train(resume_config(compose_train(tmp_path, *again), again))["steps"] == 3
    saved = load_checkpoint(run / "checkpoints" / "last.pt")
    [group] = saved["optimizer"]["param_groups"]
    assert (group["betas"], group["weight_decay"], group["fused"]) == ((0.5, 0.6), 0.25, True)
    assert group["lr"] == pytest.approx(1e-3 * lr_factor(4, 10, "inverse_sqrt", 3, 0.0))
    assert saved["scheduler"]["base_lrs"] == [1e-3]


@pytest.mark.slow  # a training
def test_an_early_stopped_run_resumed_stays_stopped(tmp_path):
    """A run early stopping ended (``patience``) and resumed unchanged trains no step: its
    checkpoints and average stay those of the run that stopped."""
    common = ["trainer.patience=1", "trainer.valid_every=2", "trainer.max_steps=8",
              "optim.lr=1e-5", "trainer.valid_sentences=5", "data.test_size=5"]
    stopped = train(compose_train(tmp_path, *common))
    assert stopped["stop_reason"] == "no BLEU gain in 1 validations" and stopped["steps"] < 8
    again = [*common, f"trainer.resume={tmp_path / 'run'}"]
    resumed = train(resume_config(compose_train(tmp_path, *again), again))
    assert (resumed["steps"], resumed["stop_reason"]) == (stopped["steps"],
                                                          stopped["stop_reason"])


@pytest.mark.slow  # a training
def test_a_signal_during_the_last_validation_stops_the_run_there(tmp_path, monkeypatch):
    """SIGTERM while the last step validates: the run stops after it (status 143, last.pt
    of that step) instead of going on to the test as if not asked."""
    import os

    import tinymt.trainer.loop as loop
    real = loop.validate_and_checkpoint

    def validate(t, bar):
        if t.state["step"] == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(t, bar)

    monkeypatch.setattr(loop, "validate_and_checkpoint", validate)
    with pytest.raises(Stopped) as stop:
        train(compose_train(tmp_path, "trainer.max_steps=4", "trainer.valid_every=2",
                            "trainer.valid_sentences=5", "data.test_size=5"))
    assert stop.value.signum == signal.SIGTERM
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 4
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow  # a training
def test_a_stopped_run_resumed_past_its_budget_validates_its_last_step(tmp_path, monkeypatch):
    """Ctrl-C after step 3 (validations every 2), then resumed with ``max_steps=3``: no step
    is left to train, and step 3, which no validation saw, is validated and published as a
    validation's (``last.pt`` not marked stopped, ``ckpt_3.pt``) before the test."""
    import os

    import tinymt.trainer.loop as loop
    real = loop.optimizer_step

    def step(t):
        norm = real(t)
        if t.state["step"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return norm

    monkeypatch.setattr(loop, "optimizer_step", step)
    common = ["trainer.valid_every=2", "trainer.keep_last=2", "trainer.valid_sentences=5",
              "data.test_size=5"]
    with pytest.raises(Stopped):
        train(compose_train(tmp_path, "trainer.max_steps=6", *common))
    monkeypatch.undo()
    run, again = tmp_path / "run", [f"trainer.resume={tmp_path / 'run'}", "trainer.max_steps=3"]
    metrics = train(resume_config(compose_train(tmp_path, *common, *again), again))
    assert metrics["steps"] == 3 and "stopped" not in load_checkpoint(
        run / "checkpoints" / "last.pt")
    assert [p.name for p in step_checkpoints(run)] == ["ckpt_2.pt", "ckpt_3.pt"]


# ----------------------------------------------------------------------------- edited config
def _may_change_on_resume() -> set[str]:
    """The keys docs/usage.md lists as what may change on resume (``optim.*``: that group)."""
    text = (REPO_ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    listed = text.split("What may change on resume", 1)[1].split("Any other setting", 1)[0]
    return set(re.findall(r"`((?:data|optim|trainer)\.[\w*]+)`", listed))


@given(data=st.data())
def test_any_setting_a_resume_may_not_change_is_refused(data):
    """Property, at the one check a resume makes before writing anything: whichever setting
    differs from the checkpoint's own config, to whatever value, is refused in one line
    naming it unless docs/usage.md lists it as one a resume may change (``data.cache_dir``,
    ``optim.*``, the trainer's budgets, intervals and outputs). (The end-to-end rows below:
    the run and the cache untouched.)"""
    from omegaconf import OmegaConf

    from tinymt.config import TrainConfig
    from tinymt.trainer.state import check_against_checkpoint

    may = _may_change_on_resume()
    assert {"data.cache_dir", "optim.*", "trainer.max_steps"} <= may and "trainer.seed" not in may
    base = OmegaConf.to_container(OmegaConf.structured(TrainConfig))
    group = data.draw(st.sampled_from(["model", "data", "trainer", "optim"]))
    key = data.draw(st.sampled_from(sorted(base[group])))
    value = data.draw(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8),
                                st.floats(allow_nan=False)).filter(lambda v: v != base[group][key]))
    edited = {**base, group: {**base[group], key: value}}
    path = Path("/runs/r/checkpoints/last.pt")
    if f"{group}.{key}" in may or f"{group}.*" in may:
        check_against_checkpoint(OmegaConf.create(edited), {"config": base}, path)
        return
    with pytest.raises(TinyMTError) as e:
        check_against_checkpoint(OmegaConf.create(edited), {"config": base}, path)
    assert "\n" not in str(e.value) and f": {group}.{key} (" in str(e.value)


@pytest.mark.parametrize("group, key, value", [("model", "activation", "gelu"),
                                               ("model", "dropout", 0.5),
                                               ("data", "max_len", 20),
                                               ("trainer", "probe_sentences", ["我喜欢猫。"])])
def test_resume_trusts_the_checkpoint_not_an_edited_config_yaml(tiny_run, tmp_path, group,
                                                                key, value):
    """config.yaml edited after the run (a model, data or probe setting): the resume is
    refused in one line naming the key, before any file of the run changes or a data cache
    is built."""
    run = copy_run(tiny_run, tmp_path / "run")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg[group][key] != value
    cfg[group][key] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    cache = Path(cfg["data"]["cache_dir"])

    def files():
        return {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}

    before, cached = files(), set(cache.iterdir())
    with pytest.raises(TinyMTError) as e:
        train(resume_config(compose_train(tmp_path, f"trainer.resume={run}"),
                            [f"trainer.resume={run}"]))
    assert "\n" not in str(e.value) and f"{group}.{key} (" in str(e.value)
    assert files() == before and set(cache.iterdir()) == cached
