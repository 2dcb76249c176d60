"""What a training checkpoint holds, and the config of a run being resumed.

A checkpoint of the trainer is the bare model plus everything an exact resume needs:
optimizer, schedule, the batch sampler's position, the loop's counters and every RNG.
It holds tensors and plain containers only, so it loads with ``weights_only=True``.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from tinymt.config import as_train_config
from tinymt.data import PreparedData
from tinymt.errors import TinyMTError
from tinymt.rundir import CONFIG
from tinymt.tokenizer import tokenizer_digest

# keys a resume may not change: they decide the data, the vocabulary and the weights' shapes
FROZEN_ON_RESUME = ("data", "model")
# ...but where the data cache lives is not what it holds (a rebuild there is the same data)
MOVABLE_ON_RESUME = ("data.cache_dir",)
# group options (``model=small``) cannot be re-chosen for a run that exists
GROUPS = ("data", "model", "optim", "trainer", "experiment")


def checkpoint_state(model, optimizer, scheduler, sampler, state: dict, cfg: DictConfig,
                     data: PreparedData) -> dict:
    return {
        "model": model.state_dict(),
        "model_config": OmegaConf.to_container(cfg.model),
        "vocab": {"src_size": data.src_tokenizer.vocab_size,
                  "tgt_size": data.tgt_tokenizer.vocab_size,
                  "shared": data.src_tokenizer is data.tgt_tokenizer},
        "tokenizer_sha256": tokenizer_digest(data.src_tokenizer, data.tgt_tokenizer),
        "config": OmegaConf.to_container(cfg),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": sampler.state_dict(),
        "trainer_state": dict(state),
        "rng": rng_state(),
        "step": state["step"],
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
    """The config of the run being resumed, plus this command's overrides.

    Everything is checked before anything is written: the run's ``config.yaml`` must
    load, overrides must be plain ``key=value`` of existing keys, and none may change
    the data or the model (``FROZEN_ON_RESUME``); such changes are refused, listed.
    """
    run_dir = Path(cfg.trainer.resume)
    saved = run_dir / CONFIG
    if not saved.is_file():
        raise TinyMTError(f"cannot resume: {saved} not found (is {run_dir} a tinymt run dir?)")
    try:
        loaded = OmegaConf.load(saved)
    except Exception as e:  # noqa: BLE001  (yaml's scanner/parser errors)
        raise TinyMTError(f"cannot resume: {saved} is not valid YAML "
                          f"({str(e).splitlines()[0]})") from None
    if not isinstance(loaded, DictConfig):
        raise TinyMTError(f"cannot resume: {saved} does not hold a tinymt config")
    base = as_train_config(loaded)
    mine = [o for o in overrides if not o.startswith(("trainer.resume=", "run_dir="))]
    for o in mine:
        key = o.split("=", 1)[0]
        if key.startswith(("+", "~")) or key in GROUPS or "=" not in o:
            raise TinyMTError(f"trainer.resume: {o!r} cannot be applied to an existing run; "
                              "only key=value overrides of existing keys "
                              "(e.g. trainer.max_steps=4000)")
    merged = as_train_config(OmegaConf.merge(base, OmegaConf.from_dotlist(mine)))
    changed = [f"{group}.{k}" for group in FROZEN_ON_RESUME
               for k in sorted(set(base[group]) | set(merged[group]))
               if base[group].get(k) != merged[group].get(k)
               and f"{group}.{k}" not in MOVABLE_ON_RESUME]
    if changed:
        raise TinyMTError(f"trainer.resume: {', '.join(changed)} would change the run's data or "
                          "model; start a new run instead")
    merged.trainer.resume = str(run_dir)
    merged.run_dir = str(run_dir)
    return merged
