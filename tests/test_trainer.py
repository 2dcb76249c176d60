"""The training loop end to end on tiny configs: loss goes down, TensorBoard holds what we
promise (read back with TensorBoard's own reader; the real server serves a run in
tests/test_viewer.py), runs killed with SIGKILL resume exactly, and bad configs fail with
one line (the script's bad values: tests/test_cli_errors.py)."""

import json
import sys
from pathlib import Path

import forked
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TINY_TRAIN_OVERRIDES as TINY
from conftest import compose_train, copy_run
from tinymt.checkpoint import load_checkpoint
from tinymt.corpus import SHOWCASE
from tinymt.errors import TinyMTError
from tinymt.trainer import resume_config, train
from tinymt.viewer.summary import decode

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("encoder_self", "decoder_self", "cross")


def scalars(run_dir, tag):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.fixture(scope="module")
def finished_run(tiny_run):
    """The shared tiny run (40 steps, validations at 20 and 40) and its metrics."""
    return tiny_run, json.loads((tiny_run / "metrics.json").read_text())


def test_a_few_steps_lower_the_loss(finished_run):
    run_dir, metrics = finished_run
    losses = [v for _, v in scalars(run_dir, "train/loss")]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert metrics["steps"] == 40


def test_metrics_give_the_target_tokens_trained_a_second(finished_run, tmp_path):
    """``train_tokens_per_s``: the target tokens (EOS included, padding not) of the run's
    40 batches, counted here from its data and batch order, over its training seconds (as
    TensorBoard holds them: metrics.json rounds them to 0.1 s)."""
    from tinymt.batching import TokenBatchSampler
    from tinymt.data import prepare

    run_dir, metrics = finished_run
    [*_, (step, seconds)] = scalars(run_dir, "valid/train_seconds")  # unrounded, at the end
    cfg = compose_train(tmp_path)  # the tiny run's data, batch budget and seed
    data = prepare(cfg.data, log=lambda *a: None)
    order = TokenBatchSampler(*data.lengths("train"), max_tokens=cfg.trainer.max_tokens,
                              seed=cfg.trainer.seed).batches(0)
    tgt = data.ids("train")[1]
    tokens = sum(len(tgt[i]) + 1 for batch in order[:40] for i in batch)
    assert step == 40 and metrics["train_tokens_per_s"] == pytest.approx(tokens / seconds,
                                                                         abs=1)  # rounded


def test_run_dir_layout(finished_run):
    run_dir, metrics = finished_run
    for name in ("config.yaml", "metrics.json", "tokenizer", "checkpoints/last.pt",
                 "checkpoints/best.pt"):
        assert (run_dir / name).exists(), name
    assert metrics["bleu_signature"].startswith("nrefs:1")
    assert metrics["steps"] == 40 and metrics["test_beam"] == 2
    # keep_last=2: the two newest step checkpoints survive
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("ckpt_*.pt")) == [
        "ckpt_20.pt", "ckpt_40.pt"]


def test_tensorboard_holds_scalars_images_text(finished_run):
    run_dir, _ = finished_run
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0,
                                                         "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    for t in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "valid/loss",
              "valid/ppl", "valid/bleu", "valid/chrf", "valid/train_seconds", "test/bleu"):
        assert t in tags["scalars"], t
    # training seconds at each validation: the x axis of valid BLEU against training time
    seconds = [(e.step, e.value) for e in acc.Scalars("valid/train_seconds")]
    assert [s for s, _ in seconds] == [20, 40]
    assert 0 < seconds[0][1] < seconds[1][1] <= finished_run[1]["train_seconds"] + 0.1
    n_layers = {"encoder_self": 2, "decoder_self": 1, "cross": 1}
    for kind in KINDS:
        for layer in range(n_layers[kind]):
            # one image per kind x layer (and probe), at each validation (steps 20 and 40)
            img_tags = [t for t in tags["images"] if t.startswith(f"attention/{kind}/layer_{layer}/")]
            assert img_tags, (kind, layer)
            assert [e.step for e in acc.Images(img_tags[0])] == [20, 40]
        assert not any(t.startswith(f"attention/{kind}/layer_{n_layers[kind]}/")
                       for t in tags["images"])
    # probes: the two showcase sentences of the built-in corpus, then n_probes=1 valid one;
    # each head's entropy in the Attention tab's record of every layer
    for p, sentence in enumerate([pair.zh for pair in SHOWCASE]):
        doc = decode(acc.Tensors(f"probe_{p}")[-1].tensor_proto.string_val[0])
        assert doc["sentence"] == sentence and doc["step"] == 40
        assert [len(doc["kinds"][kind]["entropy"]) for kind in KINDS] == [2, 1, 1]
        assert all(len(heads) == 2 for kind in KINDS for heads in doc["kinds"][kind]["entropy"])
        assert any(t.startswith("attention/cross/") and t.endswith(f"/probe_{p}")
                   for t in tags["images"])
    assert any(t.endswith("/probe_2") for t in tags["images"])
    assert not any(t.endswith("/probe_3") for t in tags["images"])
    samples = acc.Tensors("samples/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert samples.count("\n") == 2 + 3 - 1  # header, rule, n_text_samples=3 rows


def _train_cmd(tmp_path, *overrides):
    return [sys.executable, str(ROOT / "scripts" / "train.py"), *TINY,
            f"data.cache_dir={tmp_path / 'cache'}", *overrides]


@pytest.mark.slow  # a training
@pytest.mark.parametrize("budget", ["trainer.max_epochs=1", "trainer.max_epochs=1,accumulate=2",
                                    "trainer.max_minutes=0.01"])
def test_a_budget_ends_on_a_step_validated_saved_and_logged(tmp_path, budget):
    """Whichever budget ends the run, its last step is validated, published as last.pt and
    logged (here no log falls due before it); ``max_epochs=1`` trains the epoch's batches
    (as the sampler plans them) and no batch of the next, ``accumulate`` at a time (the
    last step: what is left)."""
    from tinymt.batching import TokenBatchSampler
    from tinymt.data import prepare

    budget, _, accumulate = budget.partition(",accumulate=")
    cfg = compose_train(tmp_path, "data.train_size=1000", budget, "trainer.max_steps=100000",
                        "trainer.valid_every=1000", "trainer.log_every=1000",
                        f"trainer.accumulate={accumulate or 1}")
    metrics = train(cfg)
    n = metrics["steps"]
    for tag in ("valid/bleu", "train/loss"):
        assert [step for step, _ in scalars(tmp_path / "run", tag)] == [n], tag
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert last["step"] == n
    if "epochs" in budget:
        data = prepare(cfg.data, log=lambda *a: None)
        epoch = TokenBatchSampler(*data.lengths("train"), max_tokens=cfg.trainer.max_tokens,
                                  seed=cfg.trainer.seed).batches(0)
        a = int(accumulate or 1)
        assert (metrics["stop_reason"], n, metrics["epochs"]) == (
            "max_epochs", -(-len(epoch) // a), 1)
        assert last["sampler"] == {"epoch": 1, "position": 0} and len(epoch) % 2  # (odd)
    else:
        assert metrics["stop_reason"] == "max_minutes" and metrics["train_seconds"] >= 0.6


def test_nan_loss_stops_naming_the_step(tmp_path):
    cfg = compose_train(tmp_path, "optim.lr=10", "optim.weight_decay=10", "optim.warmup_steps=0",
                        "optim.clip_grad_norm=0", "trainer.max_steps=20")
    # before the first validation: no "the last checkpoint is intact" (there is none)
    with pytest.raises(TinyMTError, match=r"at step \d+; no checkpoint was written yet"):
        train(cfg)


def test_the_host_reads_the_device_once_per_log_every_steps(tmp_path, monkeypatch, host_reads):
    """Every host read of a tensor by our code (conftest's ``host_reads``), counted while
    the loop trains (validations and probes, which must read, not counted): 14 steps,
    ``log_every=4``, one read at each log (steps 4, 8, 12 and the last, 14) and one before
    the validation of step 6, which waits anyway; the loss is logged at the logs only, each
    over the steps since the one before."""
    import tinymt.trainer.loop as loop

    def switched(real, on):
        def call(*args, **kwargs):
            host_reads.on = on
            try:
                return real(*args, **kwargs)
            finally:
                host_reads.on = not on
        return call

    host_reads.on = False
    monkeypatch.setattr(loop, "run_loop", switched(loop.run_loop, True))
    monkeypatch.setattr(loop, "validate_and_checkpoint",
                        switched(loop.validate_and_checkpoint, False))
    monkeypatch.setattr(loop.validation, "log_probes", switched(loop.validation.log_probes, False))
    train(compose_train(tmp_path, "trainer.max_steps=14", "trainer.log_every=4",
                        "trainer.valid_every=6", "trainer.probe_every=3"))
    assert host_reads == ["tolist in read_steps"] * 5
    assert [step for step, _ in scalars(tmp_path / "run", "train/loss")] == [4, 8, 12, 14]


def test_a_non_finite_step_changes_no_weight_and_skip_goes_on(tmp_path, monkeypatch, capsys):
    """``nan_policy=skip``, step 3's loss made NaN: that step leaves every weight and the
    optimizer's moments as they were (with nothing read on the host in the step), the
    steps around it change them, the run finishes, the step is counted and named."""
    import tinymt.trainer.loop as loop

    real_loss, real_step, calls, changed = loop.linear_cross_entropy, loop.optimizer_step, [], {}

    def loss(*args, **kwargs):
        calls.append(1)
        return real_loss(*args, **kwargs) * (float("nan") if len(calls) == 3 else 1.0)

    def step(t):
        def state():
            moments = [s[k] for s in t.optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
            return [x.detach().clone() for x in (*t.model.parameters(), *moments)]
        before = state()
        norm = real_step(t)
        changed[t.state["step"]] = any(not torch.equal(a, b) for a, b in zip(before, state()))
        return norm

    monkeypatch.setattr(loop, "linear_cross_entropy", loss)
    monkeypatch.setattr(loop, "optimizer_step", step)
    metrics = train(compose_train(tmp_path, "trainer.max_steps=5", "trainer.valid_every=5",
                                  "trainer.nan_policy=skip"))
    assert changed == {1: True, 2: True, 3: False, 4: True, 5: True}
    assert metrics["steps"] == 5
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert last["trainer_state"]["skipped_steps"] == 1
    assert "warning: loss became nan at step 3: step skipped" in capsys.readouterr().out


@pytest.mark.slow  # a training
def test_non_finite_steps_in_a_row_are_counted_across_a_resume(tmp_path, monkeypatch):
    """``nan_policy=skip`` gives up after ``MAX_SKIPS`` non-finite steps in a row, however
    many of them a resume comes between."""
    import tinymt.trainer.loop as loop
    import tinymt.trainer.stopping as stopping

    real_loss, step = loop.linear_cross_entropy, {"n": 0}

    def loss(*args, **kwargs):  # steps 2 to 4 non-finite
        step["n"] += 1
        return real_loss(*args, **kwargs) * (float("nan") if step["n"] >= 2 else 1.0)

    monkeypatch.setattr(loop, "linear_cross_entropy", loss)
    monkeypatch.setattr(stopping, "MAX_SKIPS", 2)
    common = ["trainer.valid_every=3", "trainer.nan_policy=skip"]
    train(compose_train(tmp_path, "trainer.max_steps=3", *common))
    run = tmp_path / "run"
    resume = [f"trainer.resume={run}", "trainer.max_steps=6"]
    with pytest.raises(TinyMTError, match="non-finite for 2 steps in a row at step 4"):
        train(resume_config(compose_train(tmp_path, *common, *resume), resume))


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_the_optimizer_step_is_the_core_update_on_finite_gradients(clip):
    """The loop's ``optimizer_step`` (its own clip and step, to set fused AdamW's
    ``found_inf``) against the core's ``tinymt.step.update``: the same norm, weights and
    schedule after three steps of finite gradients."""
    from types import SimpleNamespace

    import tinymt.trainer.loop as loop
    from tinymt.step import update

    def setup():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1))
        return model, opt, sched

    (a, opt_a, sched_a), (b, opt_b, sched_b) = setup(), setup()
    t = SimpleNamespace(model=b, optimizer=opt_b, scheduler=sched_b, state={"step": 0},
                        cfg=SimpleNamespace(optim=SimpleNamespace(clip_grad_norm=clip)))
    for _ in range(3):
        grads = [torch.randn_like(p) for p in a.parameters()]
        for model in (a, b):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
        assert torch.equal(loop.optimizer_step(t), update(a, opt_a, sched_a, clip))
    assert t.state["step"] == 3 and sched_b.get_last_lr() == sched_a.get_last_lr()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_pairs_longer_than_the_model_are_a_config_error(tmp_path):
    cfg = compose_train(tmp_path, "data.max_len=128", "model.max_positions=16",
                        "trainer.max_steps=1")
    with pytest.raises(TinyMTError, match="lower data.max_len to 15"):
        train(cfg)


@pytest.mark.slow
def test_multirun_puts_runs_side_by_side(tmp_path):
    """`-m model.n_heads=1,3,2`: runs side by side under one sweep dir, each its own folder;
    the bad value in the middle (32 is not divisible by 3) is one line naming its job, and
    does not stop the job after it (it once ended the whole sweep). Exit status 2."""
    sweep = tmp_path / "sweep"
    cmd = _train_cmd(tmp_path, "model.n_heads=1,3,2", "trainer.max_steps=4",
                     "trainer.valid_every=4", "trainer.valid_sentences=4",
                     "trainer.test_beam=1", f"hydra.sweep.dir={sweep}")
    cmd.insert(2, "-m")  # flags before the overrides
    r = forked.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and "job 1 (" in errors[0] and "model.n_heads=3" in errors[0], errors
    assert "not divisible" in errors[0] and "1 job(s) of the sweep failed" in errors[1]
    assert "Traceback" not in r.stderr
    assert (sweep / "multirun.yaml").is_file()
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())  # the failed job left none
    assert [p.name[:2] for p in runs] == ["0_", "2_"]
    for run, heads in zip(runs, (1, 2)):
        acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
        acc.Reload()
        doc = decode(acc.Tensors("probe_0")[-1].tensor_proto.string_val[0])
        assert len(doc["kinds"]["cross"]["entropy"][0]) == heads
        assert (run / "metrics.json").is_file()


@pytest.mark.slow  # the script in its own process: ~3 s
def test_a_sweep_whose_every_job_is_bad_leaves_no_folder(tmp_path):
    """`-m model.n_heads=3,5` (32 is divisible by neither): every job's config is checked
    before Hydra makes the sweep folder, so none is made; one line a job, then the sweep's
    line, exit 2. (A sweep with a good job goes on: test_multirun_puts_runs_side_by_side.)"""
    sweep = tmp_path / "sweeps" / "s"
    cmd = _train_cmd(tmp_path, "model.n_heads=3,5", f"hydra.sweep.dir={sweep}")
    cmd.insert(2, "-m")
    r = forked.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines), lines
    for line, job, heads in zip(lines, ("job 0 (", "job 1 ("), (3, 5)):
        assert job in line and f"model.n_heads={heads}" in line and "not divisible" in line
    assert lines[2] == "error: all 2 job(s) of the sweep failed: none was run"
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.slow  # a resume in the script's own process: ~12 s
def test_a_resume_sweep_leaves_no_empty_job_folder(tiny_run, tmp_path):
    """`-m trainer.resume=<run> trainer.max_steps=44` (a sweep of one job): the job goes on in
    the run's own folder; the job folder Hydra made for it is not left behind empty (the
    sweep's folder keeps its multirun.yaml, as every sweep's)."""
    from tinymt.checkpoint import load_checkpoint

    run, sweep = copy_run(tiny_run, tmp_path / "run"), tmp_path / "sweeps" / "s"
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "-m", f"trainer.resume={run}",
           "trainer.max_steps=44", f"hydra.sweep.dir={sweep}"]
    r = forked.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [p.name for p in sweep.iterdir()] == ["multirun.yaml"]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["step"] == 44
