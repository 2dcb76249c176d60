"""Checkpoints: published atomically, loaded without running code (the one checked loader
of every ``.pt``), averaged. A checkpoint is one ``torch.save`` dict of tensors and plain
containers only (dicts, lists, tuples, strings, numbers, None):

    {"format": 2, "model": state_dict, "model_config": {...}, "vocab": {...},
     "step": int, "config": {...full resolved config...}, ...training state...}
"""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from tinymt.config import as_model_config
from tinymt.errors import TinyMTError
from tinymt.files import regular_file, write_file

FORMAT = 2
# a model of MAX_PARAMETERS float32 weights and AdamW's two moments, with room to spare:
# a larger file is refused by its size, before it is read
MAX_CHECKPOINT_BYTES = 2**34
TRAINING_STATE = ("trainer_state", "optimizer", "scheduler", "sampler", "rng")
# torch's weights_only refusals of an object that is not a tensor or plain container (the
# others, "Unsupported operand" and the like, are bytes that do not parse: damage)
_CODE_WORDS = ("Unsupported global", "is blocked", "must be imported")


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Publish ``state`` at ``path`` (:func:`tinymt.files.write_file`: temp file, fsync,
    rename)."""
    write_file(path, lambda f: torch.save({**state, "format": FORMAT}, f))


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (what a published file is checked by)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """A checkpoint written by :func:`save_checkpoint`, checked in this order, each step before
    anything later reads the file or builds from it: a regular file (never opened otherwise) of
    at most :data:`MAX_CHECKPOINT_BYTES`, whose zip records fit in it (:func:`_check_archive`);
    unpickled with ``weights_only=True`` (anything but tensors and plain containers is refused,
    never executed); weights the file holds (:func:`_weights_problem`); a ``model_config`` and
    ``vocab`` a training config could have (:func:`tinymt.config.as_model_config`: building the
    model is bounded). Names and shapes are checked by loading the weights into that model,
    strictly (:func:`tinymt.rundir.load_run`). Else one line naming the file (and the field)."""
    path = regular_file(path, "checkpoint")
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise TinyMTError(f"checkpoint {path} is {size:,} bytes, more than any checkpoint "
                          f"tinymt writes (at most {MAX_CHECKPOINT_BYTES:,}); not loaded")
    _check_archive(path, size)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if any(word in str(e) for word in _CODE_WORDS):
            raise TinyMTError(
                f"{path} holds objects other than tensors and plain containers; it was not "
                "loaded (loading it could run code). Use a checkpoint written by tinymt"
            ) from None
        raise _damaged(path, "its pickle does not parse") from None
    except MemoryError:
        raise TinyMTError(f"out of memory while loading the checkpoint {path}") from None
    except Exception as e:  # noqa: BLE001  (junk bytes reach torch's unpickler: any error)
        raise _damaged(path, type(e).__name__) from None
    if not isinstance(state, dict) or "model" not in state:
        raise TinyMTError(f"checkpoint {path} is not a tinymt checkpoint (no model in it)")
    if state.get("format") != FORMAT:
        raise TinyMTError(f"{path} is not checkpoint format {FORMAT}, the one this tinymt "
                          "reads: retrain, or translate with the tinymt version that wrote it")
    if problem := _weights_problem(state["model"]) or _fields_problem(state):
        raise TinyMTError(f"checkpoint {path} is not one tinymt wrote: {problem}; use another "
                          "checkpoint of the run (last.pt / best.pt)")
    vocab = state["vocab"]
    try:  # typed (a key it lacks: the default; not a dict: omegaconf's error), checked
        state["model_config"] = OmegaConf.to_container(as_model_config(
            state.get("model_config"), max(vocab["src_size"], vocab["tgt_size"])))
    except TinyMTError as e:
        raise TinyMTError(f"checkpoint {path}: {e}") from None
    return state


def _damaged(path: Path, why: str) -> TinyMTError:
    return TinyMTError(f"checkpoint {path} is damaged or truncated, or not a checkpoint ({why}); "
                       "use another checkpoint of the run (last.pt / best.pt)")


def _check_archive(path: Path, size: int) -> None:
    """The zip archive ``torch.save`` writes, its directory read (nothing unpacked): its records
    together no larger than the file. torch's reader unpacks each record whole before it checks
    anything: a compressed one (a "zip bomb") or one that two entries name (read twice) would
    let a small file fill the memory. Junk or a truncated file is refused here too."""
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(e.file_size for e in archive.infolist())
    except Exception as e:  # noqa: BLE001  (BadZipFile, struct/Value/OverflowError on junk)
        why = "not a zip archive" if isinstance(e, zipfile.BadZipFile) else type(e).__name__
        raise _damaged(path, why) from None
    if unpacked > size:
        raise _damaged(path, f"its records unpack to {unpacked:,} bytes, more than the "
                             f"file's {size:,}")


def _weights_problem(model: Any) -> str | None:
    """The bytes the model's tensors describe must be in the file: a dict of names to dense
    tensors whose distinct views (tied weights share one) describe no more bytes than their
    storages hold. Views of one storage would let a few MB build a model of GBs."""
    if not isinstance(model, dict) or not all(
            isinstance(name, str) and isinstance(t, torch.Tensor) and t.layout == torch.strided
            for name, t in model.items()):
        return "model: expected a dict of tensor names to dense tensors"
    views = {(t.data_ptr(), t.shape, t.stride(), t.dtype): t.numel() * t.element_size()
             for t in model.values()}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in model.values()}
    if sum(views.values()) > sum(storages.values()):
        return (f"model: its tensors describe {sum(views.values()):,} bytes, their storages "
                f"hold {sum(storages.values()):,}")
    return None


def _fields_problem(state: dict) -> str | None:
    """What the commands read besides the weights: ``vocab``'s sizes (integers),
    ``config`` and ``config.data`` (read with ``.get``), when present, dicts, and
    ``labels``, when present, a dict of lists of lists of strings."""
    vocab, config = state.get("vocab"), state.get("config", {})
    if not isinstance(vocab, dict) or not all(
            type(vocab.get(k)) is int for k in ("src_size", "tgt_size")):
        return "vocab: expected {src_size, tgt_size, shared}, the sizes integers"
    if not isinstance(config, dict) or not isinstance(config.get("data", {}), dict):
        return "config: expected a dict, its data a dict"
    labels = state.get("labels", {})  # shown as text by the HTML file of a translation
    if not isinstance(labels, dict) or not all(isinstance(v, list) and all(
            isinstance(r, list) and all(isinstance(x, str) for x in r) for r in v)
            for v in labels.values()):
        return "labels: expected {kind: [[a str per head] per layer]}"
    return None


def _name(name: str) -> str:
    """A tensor or key name as a message shows it: one line, at most 60 characters."""
    name = name.encode("unicode_escape").decode("ascii")
    return name if len(name) <= 60 else name[:57] + "..."


def average_checkpoints(paths: Sequence[str | os.PathLike], run: Path | None = None) -> dict:
    """The last checkpoint's dict with its ``model`` the mean of all (integer buffers: the last
    one's), without the optimizer's state (for translating, not resuming). Every checkpoint must
    be of one run (the id its ``trainer_state`` holds; ``run``: a checkpoint of the run they
    must be of) and have the same tensors (:func:`_differs`): else one line naming the file. (A
    run's tokenizer and model config were frozen when it started, resume checks them.)"""
    states = [load_checkpoint(p) for p in paths]  # each model a dict of tensors
    ids = [s["trainer_state"].get("run") if isinstance(s.get("trainer_state"), dict) else None
           for s in [*states, *([load_checkpoint(run)] if run else [])]]
    for p, s, run_id in zip(paths, states, ids):
        if None not in (run_id, ids[-1]) and run_id != ids[-1]:  # (None: a checkpoint without)
            raise TinyMTError(f"{p} is a checkpoint of another run than {run or paths[-1]} "
                              "(its run id): cannot average (only checkpoints of one run)")
        if why := _differs(s, states[-1]):
            raise TinyMTError(f"{p} is from a different model than {paths[-1]}: "
                              f"{why}; cannot average (only checkpoints of one run)")
    out = {k: v for k, v in states[-1].items() if k not in TRAINING_STATE[1:]}  # trainer_state kept
    out["model"] = {k: sum(s["model"][k].double() for s in states).div(len(states)).to(w.dtype)
                    if w.is_floating_point() else w for k, w in states[-1]["model"].items()}
    out["averaged_from"] = [str(p) for p in paths]
    return out


def _differs(state: dict, ref: dict) -> str | None:
    """Which tensor makes ``state``'s model another than ``ref``'s (None: none): what the
    mean cannot add up."""
    mine, theirs = state["model"], ref["model"]
    if mine.keys() != theirs.keys():
        changes = [*(f"+{_name(k)}" for k in sorted(mine.keys() - theirs.keys())[:2]),
                   *(f"-{_name(k)}" for k in sorted(theirs.keys() - mine.keys())[:2])]
        return f"its model has other tensors ({', '.join(changes)})"
    for k, v in theirs.items():
        if mine[k].shape != v.shape or mine[k].dtype != v.dtype:
            return (f"its tensor {_name(k)} is {tuple(mine[k].shape)} {mine[k].dtype} vs "
                    f"{tuple(v.shape)} {v.dtype}")
    return None
