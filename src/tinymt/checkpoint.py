"""Checkpoints: published atomically, loaded without running code, averaged.

A checkpoint is one ``torch.save`` dict of tensors and plain containers only
(dicts, lists, tuples, strings, numbers, None):

    {"format": 2, "model": state_dict, "model_config": {...}, "vocab": {...},
     "step": int, "config": {...full resolved config...}, ...training state...}

**Publishing** (:func:`save_checkpoint`, the one way every ``.pt`` of a run is written):
the bytes go to ``<name>.tmp-<pid>`` in the same folder, are flushed and fsynced, and
the temp file is renamed over the old file (``os.replace`` is atomic on POSIX), then the
folder is fsynced. A run killed mid-save leaves the previous checkpoint intact; a failed
write (disk full) removes its temp file and says so in one line. Leftover ``*.tmp-*``
files of dead processes are removed by :func:`clean_stale_temp_files`.

A folder (``scripts/export.py``'s CTranslate2 model) is published the same way by
:func:`publish_folder`: built in ``<name>.tmp-<pid>``, fsynced, renamed into place; an
existing folder is never overwritten.

**Loading** (:func:`load_checkpoint`) uses ``torch.load(weights_only=True)``: a file that
carries any other pickled object (which could run code when unpickled) is refused with
a one-line error, before anything in it runs.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from tinymt.errors import TinyMTError, first_line

FORMAT = 2
_TMP = re.compile(r".+\.tmp-(\d+)")


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Publish ``state`` at ``path``: temp file in the same folder, fsync, rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TinyMTError(f"cannot create {path.parent}: {e.strerror}") from None
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save({**state, "format": FORMAT}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        if _no_space(e):
            raise TinyMTError(f"no space left on device while writing {path}; the previous "
                              "checkpoint is intact") from None
        raise TinyMTError(f"cannot write {path} ({first_line(e)}); the previous checkpoint "
                          "is intact") from None
    _fsync_dir(path.parent)  # make the rename itself durable


def publish_folder(build: Callable[[Path], None], target: str | os.PathLike) -> Path:
    """Publish a folder as :func:`save_checkpoint` publishes a file: ``build(tmp)`` fills
    ``<target>.tmp-<pid>`` beside it, every file is fsynced, the folder renamed to
    ``target`` and its parent fsynced. An existing ``target`` is refused before anything is
    written; a failure (``build`` raising, a full disk) removes the temp folder, so nothing
    half-written is ever left at ``target`` (a killed export's temp folder goes the next
    time this target is published)."""
    target = Path(target)
    if target.exists() or target.is_symlink():
        raise TinyMTError(f"{target} already exists: choose another folder (nothing was "
                          "written)")
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for old in target.parent.glob(f"{target.name}.tmp-*"):  # of killed exports
            m = _TMP.fullmatch(old.name)
            if m and old.is_dir() and (not pid_alive(int(m.group(1))) or old == tmp):
                shutil.rmtree(old, ignore_errors=True)
        tmp.mkdir()
        build(tmp)
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if target.exists():
            raise TinyMTError(f"{target} appeared while it was being written: left as it is")
        os.rename(tmp, target)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        what = "no space left on device" if _no_space(e) else first_line(e)
        raise TinyMTError(f"cannot write {target} ({what}); nothing was left there") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(target.parent)
    return target


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_space(e: BaseException) -> bool:
    """True when ``e`` (or an exception it was raised from) is ENOSPC; torch reports a
    full disk as a RuntimeError from its zip writer."""
    while e is not None:
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint written by :func:`save_checkpoint`, or raise a one-line error.

    Only tensors and plain containers are unpickled (``weights_only=True``); anything
    else in the file is refused, never executed.
    """
    path = Path(path)
    if not path.is_file():
        raise TinyMTError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "weights_only" in str(e) or "Unsupported" in str(e):
            raise TinyMTError(
                f"{path} holds objects other than tensors and plain containers; it was not "
                "loaded (loading it could run code). Use a checkpoint written by tinymt"
            ) from None
        raise TinyMTError(f"checkpoint {path} is damaged or truncated (UnpicklingError); "
                          "use another checkpoint of the run (last.pt / best.pt)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise TinyMTError(
            f"checkpoint {path} is damaged or truncated ({type(e).__name__}); "
            "use another checkpoint of the run (last.pt / best.pt)"
        ) from None
    if not isinstance(state, dict) or "model" not in state:
        raise TinyMTError(f"{path} is not a tinymt checkpoint")
    if state.get("format") != FORMAT:
        raise TinyMTError(f"{path} has checkpoint format {state.get('format')!r}, this tinymt "
                          f"reads format {FORMAT}: retrain, or translate with the tinymt "
                          "version that wrote it")
    return state


def clean_stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Remove ``*.tmp-<pid>`` files in ``folder`` whose writer process is gone (left by a
    SIGKILL mid-save); returns what was removed."""
    removed = []
    for p in Path(folder).glob("*.tmp-*"):
        m = _TMP.fullmatch(p.name)
        if m and not pid_alive(int(m.group(1))):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` still running (the writer of a ``*.tmp-<pid>`` file or folder)?"""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
    out = {k: v for k, v in states[-1].items()
           if k not in ("optimizer", "scheduler", "rng", "sampler")}
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    return out
