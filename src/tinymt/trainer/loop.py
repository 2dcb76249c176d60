"""The training loop: ``train(cfg) -> metrics``. The loop comes first (steps 2-4, each
step the core's :mod:`tinymt.step` with accumulation, several processes and the CPU's fast
loss around it); the set-up (step 1) is at the end of the file.

1. :func:`setup`: devices and ranks, the run dir, the data (tokenizer, batches), the
   model, optimizer and schedule; on resume everything is restored and checked before
   anything is written
2. :func:`run_loop`: token-budget batches -> :func:`train_step` (loss, backward) ->
   :func:`optimizer_step` (clip, step, schedule) -> :func:`log_train`
3. every ``valid_every`` steps :func:`validate_and_checkpoint`: loss / ppl / BLEU / chrF,
   attention maps and entropy to TensorBoard, ``last.pt`` (+ ``best.pt`` on a BLEU gain,
   + ``ckpt_<step>.pt``), early stopping; every ``probe_every`` steps the probes' records
4. :func:`finish`: test BLEU with the best (or averaged) checkpoint, ``metrics.json``

The run dir's layout is :mod:`tinymt.rundir`'s; every file goes through :mod:`tinymt.files`.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter

from tinymt import runtime
from tinymt.batching import TokenBatchSampler, collate
from tinymt.checkpoint import average_checkpoints, load_checkpoint, save_checkpoint
from tinymt.config import as_train_config
from tinymt.data import PreparedData, TrainSegments, prepare
from tinymt.errors import TinyMTError
from tinymt.files import write_text
from tinymt.labels import LabelSample
from tinymt.model import Transformer, count_parameters
from tinymt.rundir import (
    METRICS,
    checkpoint_path,
    claim_run_dir,
    clock_run_dir,
    step_checkpoints,
    unclaim_run_dir,
)
from tinymt.speed import linear_cross_entropy, use_bit_dropout
from tinymt.trainer import validation
from tinymt.trainer.optim import build_optimizer
from tinymt.trainer.state import (
    check_against_checkpoint,
    check_resumable,
    checkpoint_state,
    finish_publishing,
    publish_checkpoints,
    restore,
    write_run_files,
)
from tinymt.trainer.stopping import StopRequest, skip_or_stop, stop_here
from tinymt.trainer.validation import log_validation, probe_sentences, validate


@dataclass
class Training:
    """Everything the loop reads and updates, built once by :func:`setup`."""

    cfg: DictConfig
    rt: runtime.Runtime
    run_dir: Path
    data: PreparedData
    model: Transformer  # the bare model: what checkpoints hold
    train_model: torch.nn.Module  # the same, compiled and/or wrapped in DDP
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: TokenBatchSampler
    segments: TrainSegments  # the train ids of each epoch (subword regularization)
    writer: SummaryWriter | None  # rank 0 only
    probes: list[str]
    sample: LabelSample | None  # the head labels' sentences (rank 0, with probes)
    state: dict = field(default_factory=lambda: {
        "run": uuid.uuid4().hex,  # the run's id: in each of its checkpoints (averaging checks it)
        "step": 0, "epoch": 0, "best_bleu": -1.0, "best_step": 0, "bad_validations": 0,
        "train_seconds": 0.0, "train_tokens": 0, "skipped_steps": 0, "skipped_in_a_row": 0,
        "window": []})  # the steps read since the last log (checkpointed: a resumed run's curve)
    t_start: float = field(default_factory=time.monotonic)
    saved_step: int = -1  # the step of the last.pt this process last published
    validated: bool = True  # last.pt's step was validated (a resumed stopped run's was not)

    def log(self, *args, **kwargs) -> None:
        if self.rt.is_main:
            print(*args, **kwargs)


# ----------------------------------------------------------------------------- entry
def train(cfg, unique_run_dir: bool = False) -> dict:
    """Train as ``cfg`` says and return the final metrics.

    ``unique_run_dir``: ``cfg.run_dir`` was named by the clock (Hydra's default), so a
    folder already holding a run is replaced by a fresh ``<run_dir>_<n>``; otherwise
    such a folder is an error (continue a run with ``trainer.resume``).
    """
    cfg = as_train_config(cfg)
    rt = runtime.setup(cfg.trainer.device, cfg.trainer.precision, cfg.trainer.num_threads)
    claimed: list[Path] = []  # the folder a new run claimed
    t = None
    try:
        t = setup(cfg, rt, unique_run_dir, claimed)
        stop_reason = run_loop(t)
        return finish(t, stop_reason)
    except BaseException as e:
        for run_dir in claimed:
            unclaim_run_dir(run_dir)  # a new run that wrote nothing leaves its folder free
        lost = runtime.rank_lost(rt, e)
        if lost:  # not a fault of ours: one line, with where the run stands
            last = checkpoint_path(t.run_dir, "last") if t else None
            if last and last.is_file():
                lost += f"; {last} is intact: go on with trainer.resume={t.run_dir}"
            raise TinyMTError(lost) from e
        raise
    finally:
        if t is not None:
            t.segments.close()
        runtime.teardown(rt)


# ----------------------------------------------------------------------------- 2. loop
def global_batches(t: Training):
    """Global batches forever, epoch after epoch, as ``(indices, src_ids, tgt_ids)`` with
    the train ids of the batch's epoch; the sampler remembers where it is."""
    while True:
        src_ids, tgt_ids = t.segments.ids(t.sampler.epoch)
        for indices in t.sampler:
            t.state["epoch"] = t.sampler.epoch  # one more with an epoch's last batch
            yield indices, src_ids, tgt_ids


def run_loop(t: Training) -> str:
    """Train until a budget runs out; returns why it stopped. Every rank decides alike (steps,
    epochs and losses agree by construction; ``train_seconds`` adds the slowest rank's time
    since the last agreement), or one would stop while another waits in a collective. Nothing in
    a step waits for the device but the clock of one whose loss is read next: losses and
    gradient norms stay there until :func:`read_steps` reads them at once."""
    tc, state = t.cfg.trainer, t.state
    budget_s = tc.max_minutes * 60 if tc.max_minutes > 0 else math.inf
    share = runtime.CoreShare(on=t.rt.device.type == "cpu" and not tc.num_threads)
    batches = global_batches(t)
    pending: list[tuple[torch.Tensor, int, float]] = []  # ((loss, grad norm), tokens, seconds)
    window: list[tuple[float, int, float, float]] = state["window"]  # the same, read, unlogged
    unclocked = 0.0  # this rank's seconds of training the ranks have not yet agreed on
    patience, why, first = f"no BLEU gain in {tc.patience} validations", "max_steps", state["step"]
    t.model.train()
    with StopRequest() as stop, runtime.progress_bar(
            None, total=tc.max_steps, initial=state["step"], disable=not t.rt.is_main,
            desc="train") as bar:
        while state["step"] < tc.max_steps:
            # a budget spent before a step: a resumed run's (others stop at their validation)
            if state["epoch"] >= tc.max_epochs or state["train_seconds"] >= budget_s or \
                    tc.patience and state["bad_validations"] >= tc.patience:
                why = "max_epochs" if state["epoch"] >= tc.max_epochs else "max_minutes" \
                    if state["train_seconds"] >= budget_s else patience
                break
            share()  # the CPU's threads: the cores other processes leave idle
            t0 = time.monotonic()
            epoch, micro = state["epoch"], []  # the micro-batches of one epoch (its last: fewer)
            while len(micro) < tc.accumulate and state["epoch"] == epoch:
                micro.append(next(batches))
            loss_sum, n_tokens = train_step(t, micro)
            grad_norm = optimizer_step(t)
            last = state["step"] == tc.max_steps or state["epoch"] >= tc.max_epochs
            log_step, dt = state["step"] % tc.log_every == 0 or last, time.monotonic() - t0
            if t.rt.device.type != "cpu" and (log_step or state["train_seconds"] + dt >= budget_s):
                torch.accelerator.synchronize(t.rt.device)  # its loss is read below (a log,
                dt = time.monotonic() - t0  # the budget's end): the clock counts what is queued
            pending.append((torch.stack([loss_sum, grad_norm.float()]), n_tokens, dt))
            state["train_tokens"] += n_tokens  # target tokens of the global batch
            bar.update(1)
            step, unclocked, signum = state["step"], unclocked + dt, 0
            # one clock for all ranks, and a signal to any rank stops them all after the same
            # step: agreed on every step, or at each log under torchrun (a collective waits)
            if not t.rt.distributed or log_step:
                slowest, signum = runtime.all_reduce(t.rt, [unclocked, stop.signum], "max")
                state["train_seconds"] += slowest
                unclocked = 0.0
            validating = step % tc.valid_every == 0 or last or state["train_seconds"] >= budget_s
            if log_step or validating or signum:
                window += read_steps(t, pending)
                pending = []
            if window and (log_step or state["train_seconds"] >= budget_s):
                log_train(t, bar, window)
                window.clear()
            if validating:
                if validate_and_checkpoint(t, bar):
                    why = patience
                    break
                t.model.train()
            elif tc.probe_every and step % tc.probe_every == 0 and t.rt.is_main and t.probes:
                # the probes' view documents and entropy only (no BLEU, no PNG grids)
                t.model.eval()
                validation.log_probes(t.writer, t.model, t.cfg, t.data, t.probes, t.rt, step,
                                      t.sample, full=False)
                t.model.train()
            if signum:
                stop_here(t, int(signum))  # last.pt at this step, then exit 128 + signum
        if not t.validated and state["step"] == first:  # resumed past its budget: its last
            validate_and_checkpoint(t, bar)  # step, stopped by a signal, is validated here
        [signum] = runtime.all_reduce(t.rt, [stop.signum], "max")  # one during the last
        if signum:  # validation: no test decoding, the run stops as asked
            stop_here(t, int(signum))
    return why


def train_step(t: Training, micro: list[tuple[list[int], list, list]]) -> tuple[torch.Tensor, int]:
    """Forward and backward over the micro-batches of one optimizer step.

    Every rank knows the whole global batch, so the token count needs no collective; each
    rank takes every ``world_size``-th sentence. Returns this rank's summed token loss
    (label smoothing included; a tensor on the device, not read here) and the number of
    target tokens of the global batch.
    """
    rt = t.rt
    n_tokens = sum(len(tgt[i]) + 1 for idx, _, tgt in micro for i in idx)
    step_loss = torch.zeros((), device=rt.device)
    t.optimizer.zero_grad(set_to_none=True)
    for k, (indices, train_src, train_tgt) in enumerate(micro):
        mine = indices[rt.rank::rt.world_size]  # this rank's share of the global batch
        weight = 1.0
        if not mine:
            mine, weight = indices[:1], 0.0  # too few sentences to split: stay in step
        batch = collate([train_src[i] for i in mine], [train_tgt[i] for i in mine]).to(rt.device)
        sync = k == len(micro) - 1 or not rt.distributed
        accumulate = t.train_model.no_sync() if rt.distributed and not sync \
            else contextlib.nullcontext()
        with accumulate, runtime.autocast(rt.device, rt.autocast_dtype):
            hidden, _ = t.train_model(batch.src, batch.tgt_in)  # (B, T, d)
            # tinymt.loss.sequence_loss, fused on a CPU (tinymt.speed; tested equal)
            loss_sum = linear_cross_entropy(hidden, t.model.output_proj.weight, batch.tgt_out,
                                            t.model.pad_id, t.cfg.optim.label_smoothing)
            # DDP averages gradients over ranks; scale so the result is sum / n_tokens
            loss = loss_sum * (weight * rt.world_size / n_tokens)
        loss.backward()
        step_loss += loss_sum.detach().float() * weight
    return step_loss, n_tokens


def optimizer_step(t: Training) -> torch.Tensor:
    """The core's update (:func:`tinymt.step.update`: clip, step, schedule), except that a
    step whose gradient norm is not finite (a NaN or infinite loss) changes no weight:
    fused AdamW skips it on the device (``found_inf``, as AMP's gradient scaler does), so
    the host does not wait to look. Returns the norm before clipping (a tensor)."""
    clip, opt = t.cfg.optim.clip_grad_norm, t.optimizer
    grad_norm = torch.nn.utils.clip_grad_norm_(t.model.parameters(), clip or math.inf)
    bad = ~grad_norm.isfinite()
    if opt.defaults["fused"]:
        opt.found_inf = bad.float()
    if opt.defaults["fused"] or not bad:  # the unfused loop cannot skip: the host looks
        opt.step()
    t.scheduler.step()
    t.state["step"] += 1
    return grad_norm


def read_steps(t: Training, pending: list) -> list[tuple[float, int, float, float]]:
    """The pending steps' losses and gradient norms, read in one wait for the device (and,
    under several processes, summed in one all-reduce): ``(mean token loss, tokens,
    seconds, grad norm)`` of each finite step. A step with a non-finite loss or norm
    changed no weight (:func:`optimizer_step`); here the run stops naming it, or
    (``nan_policy=skip``) counts it and goes on."""
    values = torch.stack([v for v, _, _ in pending]).tolist()  # (steps, 2)
    losses = runtime.all_reduce(t.rt, [loss for loss, _ in values])
    first = t.state["step"] - len(pending) + 1
    read = []
    for i, ((_, norm), loss, (_, n_tokens, dt)) in enumerate(zip(values, losses, pending)):
        if math.isfinite(loss) and math.isfinite(norm):
            t.state["skipped_in_a_row"] = 0
            read.append((loss / n_tokens, n_tokens, dt, norm))
        else:
            skip_or_stop(t, f"loss became {loss}" if not math.isfinite(loss) else
                         f"gradient norm became {norm}", first + i)
    return read


def log_train(t: Training, bar, window: list) -> None:
    step, lr = t.state["step"], t.scheduler.get_last_lr()[0]
    loss, tokens, seconds, _ = map(sum, zip(*window))
    tok_s = tokens / max(seconds, 1e-9)
    avg = loss / len(window)
    bar.set_postfix(loss=f"{avg:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}")
    if t.writer:
        for tag, value in (("loss", avg), ("lr", lr), ("grad_norm", window[-1][3]),
                           ("tokens_per_s", tok_s), ("epoch", t.state["epoch"])):
            t.writer.add_scalar(f"train/{tag}", value, step)


# ----------------------------------------------------------------------------- 3. validation
def validate_and_checkpoint(t: Training, bar) -> bool:
    """Validate, log, publish ``last.pt`` (+ ``best.pt``, ``ckpt_<step>.pt``); returns
    True when early stopping says to stop."""
    tc, state, step = t.cfg.trainer, t.state, t.state["step"]
    metrics = validate(t.model, t.cfg, t.data, "valid", t.rt, limit=tc.valid_sentences)
    improved = metrics["bleu"] > state["best_bleu"]
    if improved:
        state["best_bleu"] = metrics["bleu"]
        state["best_step"] = step
        state["bad_validations"] = 0
    else:
        state["bad_validations"] += 1
    if t.rt.is_main:
        bar.write(f"step {step:>6} | epoch {state['epoch']} | valid loss {metrics['loss']:.3f} "
                  f"ppl {metrics['ppl']:.2f} | BLEU {metrics['bleu']:.2f} chrF "
                  f"{metrics['chrf']:.2f} | {state['train_seconds']:.0f} s trained"
                  + (" *" if improved else ""))
        labels = log_validation(t.writer, t.model, t.cfg, t.data, metrics, t.probes, t.rt, step,
                                t.sample)
        # the curve of valid BLEU against training time (validation time not counted)
        t.writer.add_scalar("valid/train_seconds", state["train_seconds"], step)
        publish_checkpoints(checkpoint_state(t, labels), t.run_dir, improved, tc.keep_last)
        t.saved_step = step
        t.writer.flush()
    runtime.barrier(t.rt)
    return bool(tc.patience) and state["bad_validations"] >= tc.patience


# ----------------------------------------------------------------------------- 4. finish
def finish(t: Training, stop_reason: str) -> dict:
    """Test BLEU with ``best.pt`` (or ``avg.pt``), ``metrics.json``, summary."""
    tc, state, rt = t.cfg.trainer, t.state, t.rt
    final_ckpt = _average(t) or checkpoint_path(t.run_dir, "best")
    tested = load_checkpoint(final_ckpt, map_location=rt.device)
    t.model.load_state_dict(tested["model"])
    test = validate(t.model, t.cfg, t.data, "test", rt, beam=tc.test_beam)
    wall = time.monotonic() - t.t_start
    metrics = {
        "best_valid_bleu": state["best_bleu"], "test_bleu": test["bleu"],
        "test_chrf": test["chrf"], "test_loss": test["loss"],
        "bleu_signature": test["signature"], "test_beam": tc.test_beam,
        "test_checkpoint": final_ckpt.name, "test_checkpoint_step": tested["step"],
        "steps": state["step"], "epochs": state["epoch"],
        "train_seconds": round(state["train_seconds"], 1), "wall_seconds": round(wall, 1),
        "train_tokens_per_s": round(state["train_tokens"] / max(state["train_seconds"], 1e-9)),
        "stop_reason": stop_reason, "parameters": count_parameters(t.model),
        "run_dir": str(t.run_dir), "held_out_words": test["held_out_words"],
    }
    if rt.is_main:
        write_text(json.dumps(metrics, indent=2) + "\n", t.run_dir / METRICS)
        t.writer.add_scalar("test/bleu", test["bleu"], state["step"])
        t.writer.add_scalar("test/chrf", test["chrf"], state["step"])
        t.writer.close()
        print(f"\ndone in {wall / 60:.1f} min ({stop_reason}): best valid BLEU "
              f"{state['best_bleu']:.2f}, test BLEU {test['bleu']:.2f} chrF {test['chrf']:.2f} "
              f"(beam {tc.test_beam}, {final_ckpt.name})\n"
              f"  {test['signature']}\n" + (
                  "" if test["held_out_words"] is None else f"  words alone: "
                  f"{test['held_out_words']:.1%} of the dictionary's held-out words exact (beam "
                  f"{tc.test_beam})\n") +
              f"  run dir: {t.run_dir}\n"
              f"  translate: python scripts/translate.py run={t.run_dir} \"<sentence>\"\n"
              f"  watch:     tensorboard --logdir {t.run_dir}")
    return metrics


def _average(t: Training) -> Path | None:
    """``avg.pt`` from the last ``average_last`` step checkpoints, when there are two+."""
    n = t.cfg.trainer.average_last
    steps = step_checkpoints(t.run_dir)[-n:] if n > 1 else []
    if len(steps) < 2:
        return None
    avg = checkpoint_path(t.run_dir, "avg")
    if t.rt.is_main:
        save_checkpoint(average_checkpoints(steps), avg)
    runtime.barrier(t.rt)
    return avg


# ----------------------------------------------------------------------------- 1. setup
# devices, the run dir, the data, the model; nothing written before every check
def build_model(cfg: DictConfig, data: PreparedData) -> Transformer:
    shared = data.src_tokenizer is data.tgt_tokenizer
    longest = max((int(side.max()) for side in data.lengths("train") if len(side)), default=0)
    if longest + 1 > cfg.model.max_positions:
        raise TinyMTError(
            f"training pairs of up to {longest} tokens (+1 for bos/eos) do not fit "
            f"model.max_positions={cfg.model.max_positions}: lower data.max_len to "
            f"{cfg.model.max_positions - 1} or raise model.max_positions")
    model = Transformer(cfg.model, data.src_tokenizer.vocab_size,
                        data.tgt_tokenizer.vocab_size, shared_vocab=shared)
    return use_bit_dropout(model)  # the same dropout, its CPU mask drawn faster


def setup(cfg: DictConfig, rt: runtime.Runtime, unique_run_dir: bool,
          claimed: list[Path]) -> Training:
    """Steps 1–2 of the module docstring. Nothing is written into the run dir until
    every check (data, model size, the checkpoint and tokenizer of a resumed run) passed.
    Rank 0 appends the folder a new run claims to ``claimed``."""
    tc, oc = cfg.trainer, cfg.optim
    # rank 0 claims a new run's folder; every rank uses its path (or the resumed run's)
    if tc.resume:
        run_dir = Path(tc.resume)
        check_resumable(run_dir)
    elif rt.is_main:
        if cfg.run_dir is None:
            cfg.run_dir, unique_run_dir = clock_run_dir(), True
        run_dir = claim_run_dir(cfg.run_dir, unique_run_dir)
        claimed.append(run_dir)
    else:
        run_dir = None
    run_dir = Path(runtime.broadcast_object(rt, str(run_dir)))
    cfg.run_dir = str(run_dir)
    resume = load_checkpoint(checkpoint_path(run_dir, "last"), map_location=rt.device) \
        if tc.resume else None
    if resume is not None:  # before the data is built: an edited config.yaml changes nothing
        check_against_checkpoint(cfg, resume, checkpoint_path(run_dir, "last"))
    runtime.seed_everything(tc.seed)

    log = print if rt.is_main else (lambda *a, **k: None)
    if rt.is_main:  # rank 0 builds the data cache, the others then read it
        data = prepare(cfg.data, log=log)
    runtime.barrier(rt)
    if not rt.is_main:
        data = prepare(cfg.data, log=log)

    model = build_model(cfg, data).to(rt.device)
    log(f"model: {cfg.model.name}, {count_parameters(model):,} parameters "
        f"(d_model={cfg.model.d_model}, heads={cfg.model.n_heads}, "
        f"layers={cfg.model.n_encoder_layers}+{cfg.model.n_decoder_layers}); device {rt.device}"
        + (f", {rt.world_size} process{'es' if rt.world_size > 1 else ''} "
           f"({torch.distributed.get_backend()})" if rt.distributed else ""))
    optimizer, scheduler = build_optimizer(model, oc, tc.max_steps, rt.device)
    segments = TrainSegments(data, cfg.data.sampling_alpha, cfg.data.sampling_nbest_size,
                             tc.seed, max_len=cfg.model.max_positions - 1)
    sampler = TokenBatchSampler(*data.lengths("train"), max_tokens=tc.max_tokens, seed=tc.seed,
                                shuffle=True,
                                lengths_of=segments.lengths if segments.sampling else None)
    if segments.sampling:
        log(f"data: subword regularization: alpha {cfg.data.sampling_alpha}, every epoch's "
            f"train pieces drawn from (seed {tc.seed}, epoch)")
    probes = probe_sentences(cfg, data)
    sample = validation.label_sentences(cfg, data) if rt.is_main and probes else None
    t = Training(cfg, rt, run_dir, data, model, model, optimizer, scheduler, sampler, segments,
                 None, probes, sample)
    if resume is not None:
        restore(t, resume)
        if rt.is_main:
            finish_publishing(resume, run_dir, tc.keep_last, t.log)
    if tc.compile:
        t.train_model = torch.compile(model)
    if rt.distributed:
        t.train_model = torch.nn.parallel.DistributedDataParallel(
            t.train_model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
    if rt.is_main:  # the tokenizer (new runs), config.yaml and the TensorBoard writer
        write_run_files(t.run_dir, t.cfg, t.data, resume is not None)
        # TensorBoard reads a run's event files in name order (made in which second, host,
        # pid): the resumed run's is made after the second of every file already there
        made = [int(n) for f in t.run_dir.glob("events.out.tfevents.*")
                if (n := f.name.split(".")[3]).isdigit()]
        time.sleep(max(0, min(max(made, default=0) + 1 - time.time(), 2)))
        # purge_step drops events a killed run wrote after its last checkpoint
        t.writer = SummaryWriter(str(t.run_dir),
                                 purge_step=t.state["step"] + 1 if resume is not None else None)
        t.writer.add_text("config", "```\n" + OmegaConf.to_yaml(t.cfg) + "\n```", t.state["step"])
    return t
