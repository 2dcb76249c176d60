"""Checkpoints: written atomically, loaded with clear errors, averaged.

A checkpoint is one ``torch.save`` dict:

    {"format": 1, "model": state_dict, "model_config": {...}, "vocab": {...},
     "step": int, "config": {...full resolved config...}, ...training state...}

Saving writes ``<name>.tmp-<pid>``, flushes it to disk, then renames it over the old
file (``os.replace`` is atomic on POSIX), so a run killed mid-save leaves the previous
checkpoint intact and loadable. Leftover ``*.tmp-*`` files are never loaded.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tinymt.errors import TinyMTError

FORMAT = 1


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint`, or raise a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise TinyMTError(f"checkpoint {path} does not exist")
    try:
        # our own files hold RNG states and config dicts, not just tensors
        state = torch.load(path, map_location=map_location, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError) as e:
        raise TinyMTError(
            f"checkpoint {path} is damaged or truncated ({type(e).__name__}); "
            "use another checkpoint of the run (last.pt / best.pt)"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or "model" not in state:
        raise TinyMTError(f"{path} is not a tinymt checkpoint")
    return state


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict:
    """Average the model weights of several checkpoints of one run.

    Returns the last checkpoint's dict with its ``model`` replaced by the mean of all
    (integer buffers are taken from the last one). Optimizer state is dropped: the
    result is for translation, not for resuming.
    """
    if not paths:
        raise TinyMTError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    keys = states[-1]["model"].keys()
    for p, s in zip(paths, states):
        if s["model"].keys() != keys or s.get("model_config") != states[-1].get("model_config"):
            raise TinyMTError(f"{p} is from a different model than {paths[-1]}: cannot average")
    averaged = {}
    for k in keys:
        last = states[-1]["model"][k]
        if last.is_floating_point():
            averaged[k] = sum(s["model"][k].double() for s in states).div(len(states)).to(last.dtype)
        else:
            averaged[k] = last
    out = {k: v for k, v in states[-1].items() if k not in ("optimizer", "scheduler", "rng")}
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    return out


def step_checkpoints(ckpt_dir: str | os.PathLike) -> list[Path]:
    """A run's ``ckpt_<step>.pt`` files, oldest step first."""
    return sorted(Path(ckpt_dir).glob("ckpt_*.pt"), key=lambda p: int(p.stem.split("_")[1]))
