"""What a training checkpoint holds (the bare model plus everything an exact resume needs:
optimizer, schedule, the sampler's position, the loop's counters, every RNG; tensors and
plain containers only), publishing it, and the config of a run being resumed."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from tinymt.checkpoint import load_checkpoint, save_checkpoint
from tinymt.config import as_train_config, load_config_file
from tinymt.data import PreparedData
from tinymt.errors import TinyMTError, first_line
from tinymt.files import CONFIG, TOKENIZER, error_reason, write_text
from tinymt.rundir import checkpoint_path, step_checkpoints
from tinymt.tokenizer import Tokenizer, save_tokenizers, tokenizer_digest

# What a resume may change (docs/usage.md): where the cache is, the optimizer, and the
# trainer's budgets, intervals, checks and outputs. Anything else (the data, the model, the
# seed and batching the sampler's position counts in, the probes) would make another run.
MAY_CHANGE_ON_RESUME = ("data.cache_dir", "optim.", *(f"trainer.{k}" for k in (
    "name device precision compile num_threads max_steps max_epochs max_minutes log_every "
    "valid_every valid_sentences valid_max_len_b patience nan_policy keep_last average_last "
    "test_beam probe_every attention_images n_text_samples resume").split()))
GROUPS = ("data", "model", "optim", "trainer", "experiment")  # not re-chosen for a run


def checkpoint_state(t, labels: dict | None = None) -> dict:
    """The checkpoint of the loop's ``Training`` ``t`` (what :func:`restore` reads back) and
    each head's ``labels`` at this step (:func:`tinymt.labels.frame_labels`; the HTML file
    of a translation shows them)."""
    data = t.data
    return {
        "model": t.model.state_dict(),
        "model_config": OmegaConf.to_container(t.cfg.model),
        "vocab": {"src_size": data.src_tokenizer.vocab_size,
                  "tgt_size": data.tgt_tokenizer.vocab_size,
                  "shared": data.src_tokenizer is data.tgt_tokenizer},
        "tokenizer_sha256": tokenizer_digest(data.src_tokenizer, data.tgt_tokenizer),
        "config": OmegaConf.to_container(t.cfg),
        "optimizer": t.optimizer.state_dict(),
        "scheduler": t.scheduler.state_dict(),
        "sampler": t.sampler.state_dict(),
        "trainer_state": dict(t.state),
        "rng": rng_state(),
        "step": t.state["step"],
        "labels": labels or {},
    }


def rng_state() -> dict:
    """Every RNG the loop draws from; numpy's key array as a tensor."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                  float(gauss)),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(rng: dict) -> None:
    random.setstate(rng["python"])
    name, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"].cpu())
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def resume_config(cfg: DictConfig, overrides: list[str] = ()) -> DictConfig:
    """The config of the run being resumed plus this command's overrides, checked before
    anything is written: plain ``key=value`` of existing keys (none may change the data or
    the model: :func:`check_against_checkpoint` refuses it)."""
    run_dir = Path(cfg.trainer.resume)
    saved = run_dir / CONFIG
    try:
        base = as_train_config(load_config_file(saved, "the run's config"))
    except TinyMTError as e:
        where = "" if str(saved) in str(e) else f"{saved}: "
        raise TinyMTError(f"cannot resume: {where}{e}") from None
    if cfg.run_dir and Path(cfg.run_dir).resolve() != run_dir.resolve():
        raise TinyMTError(f"run_dir={cfg.run_dir}: a resumed run goes on in its own folder "
                          f"({run_dir}); leave run_dir= out")
    mine = [o for o in overrides if not o.startswith(("trainer.resume=", "run_dir="))]
    for o in mine:
        key = o.split("=", 1)[0]
        if key.startswith(("+", "~")) or key in GROUPS or "=" not in o:
            raise TinyMTError(f"trainer.resume: {o!r} cannot be applied to an existing run; "
                              "only key=value overrides of existing keys "
                              "(e.g. trainer.max_steps=4000)")
    for key in (o.split("=", 1)[0] for o in mine):  # the value as Hydra read it (int(3), ...)
        OmegaConf.update(base, key, OmegaConf.select(cfg, key), merge=False)
    merged = as_train_config(base)
    merged.trainer.resume = str(run_dir)
    merged.run_dir = str(run_dir)
    return merged


# ----------------------------------------------------------------------------- run files
def check_against_checkpoint(cfg: DictConfig, ckpt: dict, path: Path) -> None:
    """The checkpoint's config is what the run was made with: a resume whose settings (a
    key both configs know) differ from it, by an override or an edited ``config.yaml``,
    is refused unless :data:`MAY_CHANGE_ON_RESUME` names the key, every such key listed,
    before anything is written."""
    before, after = ckpt.get("config") or {}, OmegaConf.to_container(cfg)
    changed = [(f"{group}.{k}", then[k], now[k]) for group in GROUPS[:4]
               for then, now in [(before.get(group) or {}, after.get(group) or {})]
               for k in sorted(set(then) & set(now))
               if then[k] != now[k] and not f"{group}.{k}".startswith(MAY_CHANGE_ON_RESUME)]
    if changed:
        key, then, now = changed[0]
        raise TinyMTError(
            f"trainer.resume: {', '.join(k for k, _, _ in changed)} would make another run: "
            f"{key} ({then!r} in {path}, {now!r} here); start a new run, or put "
            f"{path.parents[1] / CONFIG} back as the checkpoint has it")


def check_resumable(run_dir: Path) -> None:
    """A run that stopped before its first checkpoint: a one-line error saying what to do
    (any other missing ``last.pt``: :func:`~tinymt.checkpoint.load_checkpoint` says so)."""
    last = checkpoint_path(run_dir, "last")
    if not last.is_file() and (run_dir / CONFIG).is_file():
        raise TinyMTError(f"cannot resume {run_dir}: it stopped before its first checkpoint "
                          f"({last} does not exist), so there is nothing to resume: delete it "
                          f"(rm -r {run_dir}) and train again")


def write_run_files(run_dir: Path, cfg: DictConfig, data: PreparedData, resuming: bool) -> None:
    """The tokenizer (new runs) and config.yaml, published. A new run that cannot write
    them (a full disk) takes them back: its folder stays free for a retry."""
    try:
        if not resuming:
            save_tokenizers(run_dir / TOKENIZER, data.src_tokenizer, data.tgt_tokenizer)
        write_text(OmegaConf.to_yaml(cfg), run_dir / CONFIG)
    except (OSError, TinyMTError) as e:
        if not resuming:
            shutil.rmtree(run_dir / TOKENIZER, ignore_errors=True)
            (run_dir / CONFIG).unlink(missing_ok=True)
        raise TinyMTError(f"cannot write the run's files in {run_dir} ({error_reason(e)})"
                          + ("" if resuming else "; the folder was left empty")) from None


# ----------------------------------------------------------------------------- publishing
def publish_checkpoints(ckpt: dict, run_dir: Path, best: bool, keep_last: int) -> None:
    """A validation's checkpoints, in this order (a resume publishes what a kill left out:
    :func:`finish_publishing`): ``last.pt``, ``best.pt`` (when ``best``), ``ckpt_<step>.pt``
    (``keep_last > 1``; older ones beyond ``keep_last`` removed)."""
    save_checkpoint(ckpt, checkpoint_path(run_dir, "last"))
    if best:
        save_checkpoint(ckpt, checkpoint_path(run_dir, "best"))
    if keep_last > 1:
        _publish_step(ckpt, run_dir, keep_last)


def _publish_step(ckpt: dict, run_dir: Path, keep_last: int) -> None:
    save_checkpoint(ckpt, checkpoint_path(run_dir, f"ckpt_{ckpt['step']}"))
    for old in step_checkpoints(run_dir)[:-keep_last]:
        old.unlink()


def finish_publishing(ckpt: dict, run_dir: Path, keep_last: int, log) -> None:
    """A run killed between the files of :func:`publish_checkpoints` resumes from a
    ``last.pt`` whose state already counts them: publish what is missing (a ``best.pt``
    older than the best step it records, its step checkpoint, unless a stop saved it)."""
    step, best_step = ckpt["step"], ckpt["trainer_state"].get("best_step")
    best = checkpoint_path(run_dir, "best")
    if best_step == step and _step_of(best) != step:
        log(f"{best} is older than the best model in last.pt (step {step}): published again")
        save_checkpoint(ckpt, best)
    if keep_last > 1 and not ckpt.get("stopped") and \
            not checkpoint_path(run_dir, f"ckpt_{step}").is_file():
        _publish_step(ckpt, run_dir, keep_last)


def _step_of(path: Path) -> int | None:
    """The step of checkpoint ``path``; None when it is missing or unreadable."""
    try:
        return load_checkpoint(path).get("step")
    except TinyMTError:
        return None


def check_resume_tokenizer(run_dir: Path, stored: str | None, src: Tokenizer,
                           tgt: Tokenizer) -> None:
    """The resumed checkpoint (``tokenizer_sha256`` = ``stored``) was trained with the
    tokenizer this data config builds (a rebuilt cache is fine)."""
    if stored != tokenizer_digest(src, tgt):
        raise TinyMTError(f"cannot resume {run_dir}: its checkpoint was trained with another "
                          "tokenizer than this data config builds")


def restore(t, ckpt: dict) -> None:
    """Continue exactly where ``last.pt`` left off (``t``: the loop's ``Training``), after
    checking it fits this data; what the model, optimizer, schedule, sampler and RNGs make
    of their values (or that one is missing: a pruned or averaged checkpoint) is checked by
    loading them: a failure is one line."""
    path = checkpoint_path(t.run_dir, "last")
    check_resume_tokenizer(t.run_dir, ckpt.get("tokenizer_sha256"), t.data.src_tokenizer,
                           t.data.tgt_tokenizer)
    for what, load in (("model", t.model.load_state_dict),
                       ("optimizer", t.optimizer.load_state_dict),
                       ("scheduler", t.scheduler.load_state_dict),
                       ("sampler", t.sampler.load_state_dict), ("rng", set_rng_state),
                       ("trainer_state", t.state.update)):
        try:
            load(ckpt[what])
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise TinyMTError(f"cannot resume from {path}: its {what} state does not fit "
                              f"({first_line(e)})") from None
    t.validated = not ckpt.get("stopped")
    t.state["epoch"] = t.sampler.epoch  # (a sampler saved at an epoch's end: the next one)
    opt, lr = t.optimizer, t.optimizer.defaults["lr"]  # optim.* may change on resume: this
    for group in opt.param_groups:  # config's settings, not the saved ones, from here on
        group.update({**opt.defaults, "initial_lr": lr,
                      "lr": lr * t.scheduler.lr_lambdas[0](t.scheduler.last_epoch)})
    t.scheduler.base_lrs = [lr] * len(opt.param_groups)
    t.log(f"resumed {t.run_dir} at step {t.state['step']} (epoch {t.state['epoch']})")
