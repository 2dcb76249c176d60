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
import hashlib
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import torch

from tinymt.errors import TinyMTError, first_line

FORMAT = 2
_TMP = re.compile(r".+\.tmp-(\d+)")


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """Publish ``state`` at ``path``: temp file in the same folder, fsync, rename."""
    publish_file(path, lambda f: torch.save({**state, "format": FORMAT}, f))


def publish_text(text: str, path: str | os.PathLike) -> None:
    """Publish a small text file (``metrics.json``) as a checkpoint is published."""
    publish_file(path, lambda f: f.write(text.encode("utf-8")))


def publish_file(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> None:
    """The one way a run's files are written: ``write(f)`` fills ``<name>.tmp-<pid>`` in
    the same folder, which is fsynced and renamed over ``path``, then the folder fsynced.
    A failure (a full disk) removes the temp file and leaves the old ``path`` as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TinyMTError(f"cannot create {path.parent}: {e.strerror}") from None
    previous = ("the previous version is intact" if path.exists()
                else "nothing was left there")
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)
        if no_space(e):
            raise TinyMTError(f"no space left on device while writing {path}; "
                              f"{previous}") from None
        raise TinyMTError(f"cannot write {path} ({first_line(e)}); {previous}") from None
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
        what = "no space left on device" if no_space(e) else first_line(e)
        raise TinyMTError(f"cannot write {target} ({what}); nothing was left there") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(target.parent)
    return target


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (what a published file is checked by)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def no_space(e: BaseException) -> bool:
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


def clean_stale_temp_files(folder: str | os.PathLike, name: str = "*") -> list[Path]:
    """Remove ``<name>.tmp-<pid>`` files in ``folder`` (``name``: a glob, every file by
    default) whose writer process is gone (left by a SIGKILL mid-save); returns what was
    removed."""
    removed = []
    for p in Path(folder).glob(f"{name}.tmp-*"):
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
    result is for translation, not for resuming. Every checkpoint must be of the same model
    and tokenizer (``tokenizer_sha256``, ``vocab``, ``model_config``, every tensor's shape
    and dtype): anything else is refused in one line naming the file and what differs.
    """
    if not paths:
        raise TinyMTError("no checkpoints to average")
    states = [load_checkpoint(p) for p in paths]
    for p, s in zip(paths, states):
        if not isinstance(s["model"], dict) or not all(
                isinstance(v, torch.Tensor) for v in s["model"].values()):
            raise TinyMTError(f"{p} is not a tinymt checkpoint (its model is not a dict of "
                              "tensors)")
    for p, s in zip(paths[:-1], states):
        why = _differs(s, states[-1])
        if why:
            raise TinyMTError(f"{p} is from a different model or tokenizer than {paths[-1]}: "
                              f"{why}; cannot average (only checkpoints of one run)")
    keys = states[-1]["model"].keys()
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


def _differs(state: dict, ref: dict) -> str | None:
    """What makes ``state`` another model or tokenizer than ``ref`` (None: nothing)."""
    def short(v):
        return f"{v[:12]}..." if isinstance(v, str) and len(v) > 12 else repr(v)

    if state.get("tokenizer_sha256") != ref.get("tokenizer_sha256"):
        return (f"its tokenizer differs (tokenizer_sha256 {short(state.get('tokenizer_sha256'))}"
                f" vs {short(ref.get('tokenizer_sha256'))})")
    if state.get("vocab") != ref.get("vocab"):
        return f"its vocab differs ({state.get('vocab')} vs {ref.get('vocab')})"
    if state.get("model_config") != ref.get("model_config"):
        a, b = state.get("model_config") or {}, ref.get("model_config") or {}
        if not isinstance(a, dict) or not isinstance(b, dict):
            return "its model_config differs"
        keys = sorted(k for k in {*a, *b} if a.get(k, "<unset>") != b.get(k, "<unset>"))
        return "its model_config differs (" + ", ".join(
            f"{k}={a.get(k, '<unset>')!r} vs {b.get(k, '<unset>')!r}" for k in keys[:3]) + \
            (", ..." if len(keys) > 3 else "") + ")"
    mine, theirs = state["model"], ref["model"]
    if mine.keys() != theirs.keys():
        extra, missing = sorted(mine.keys() - theirs.keys()), sorted(theirs.keys() - mine.keys())
        return ("its model has other tensors ("
                + ", ".join([*(f"+{k}" for k in extra[:2]), *(f"-{k}" for k in missing[:2])])
                + ")")
    for k, v in theirs.items():
        if mine[k].shape != v.shape or mine[k].dtype != v.dtype:
            return (f"its tensor {k} is {tuple(mine[k].shape)} {mine[k].dtype} vs "
                    f"{tuple(v.shape)} {v.dtype}")
    return None
