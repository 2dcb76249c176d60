"""Every file a command writes goes through here, and every file it reads is opened here.

**Writing** has two steps, both here:

1. :func:`check_output` (:func:`check_outputs` for several), before any work: the path a
   user named is refused, in one line naming the option, when it is empty or blank (never
   "the current directory"), a name too long for the file system, a folder, a pipe, socket
   or device, part of a run's own state (its marker, ``config.yaml``, ``tokenizer/``,
   ``checkpoints/last.pt``, ``best.pt``, ``ckpt_<step>.pt``), anywhere inside a run folder
   the command does not own (holds the lock of), in a place where nothing can be created,
   or the same file as another output of the same command.
2. :func:`write_file` (``write_text``, ``write_bytes``) and :func:`write_folder`: the bytes
   go to ``.tinymt-tmp-<random>`` in the target's own folder, held under an exclusive
   ``flock`` while they are written, are fsynced and renamed over the target (``os.replace``
   is atomic), then the folder is fsynced. A failure (a full disk, a kill) leaves the old
   target as it was. Temp files whose lock nobody holds (their writer died) are removed
   by the next write into that folder: the lock says who is alive, not a pid (which means
   nothing on another host or in another container).

**Symbolic links**: the folders on the way are followed (their real location is what is
checked); a target that is itself a link is *replaced* (the link, never the file it points
to: nothing outside the named path changes).

**Runs**: a folder holding :data:`RUN_MARKER` (or ``checkpoints/last.pt``) is a run. The
process that trains it (or averages its checkpoints, analyses its heads) holds
:class:`RunLock`, an exclusive ``flock`` on that marker, and passes the run folder as
``owner``; every other write into a run is refused.

**Reading**: :func:`read_bytes` opens only a regular file (a pipe would block, a device
never end), reads at most ``max_bytes`` and names the file in its one-line errors;
:func:`parse_json` bounds nesting. Each kind of file has one loader built on them
(checkpoints: :mod:`tinymt.checkpoint`; the data cache: :mod:`tinymt.data.cache`; exports:
:mod:`tinymt.ct2.export`; attention records: :mod:`tinymt.viewer.summary`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tinymt.errors import TinyMTError, first_line

# ----------------------------------------------------------------------------- run layout
RUN_MARKER = ".tinymt-run"  # created by the run that owns the folder; its lock is the run's
CONFIG = "config.yaml"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
STEP_CHECKPOINT = re.compile(r"ckpt_(\d+)\.pt")
NAMED = ("best", "last", "avg", "pruned")  # checkpoint=<name> picks checkpoints/<name>.pt
TEMP_PREFIX = ".tinymt-tmp-"
NAME_MAX, PATH_MAX = 255, 4096  # bytes: a name, a whole path (Linux)


def is_run_dir(folder: Path) -> bool:
    """A run lives in ``folder``: its marker, or (a run of an older tinymt) its last.pt."""
    return (folder / RUN_MARKER).exists() or (folder / CHECKPOINTS / "last.pt").is_file()


def run_state_part(path: Path) -> tuple[Path, str] | None:
    """``(run dir, what)`` when the absolute ``path`` is a file of a run's own state."""
    name, parent = path.name, path.parent
    if name == RUN_MARKER:
        return parent, "the run marker"
    if name == CONFIG and is_run_dir(parent):
        return parent, "the config"
    if parent.name == CHECKPOINTS and is_run_dir(parent.parent) and (
            name in ("last.pt", "best.pt") or STEP_CHECKPOINT.fullmatch(name)):
        return parent.parent, f"the checkpoint {name}"
    for folder in path.parents:
        if folder.name == TOKENIZER and is_run_dir(folder.parent):
            return folder.parent, "the tokenizer"
    return None


def run_holding(path: Path) -> Path | None:
    """The run folder ``path`` (absolute) lies in, or is; None outside runs."""
    return next((p for p in [path, *path.parents] if p.is_dir() and is_run_dir(p)), None)


def real_location(path: str | os.PathLike) -> Path:
    """Where writing ``path`` puts a file: its folder with every link resolved, and its own
    name (a link there is replaced, not followed)."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    return Path(os.path.realpath(path.parent)) / path.name


# ----------------------------------------------------------------------------- checks
def check_output(value: Any, what: str, *, folder: bool = False,
                 owner: str | os.PathLike | None = None) -> Path:
    """The file (``folder=True``: the new folder) a command will write at ``value`` (the
    user's ``what=value``), checked before any work; a one-line :class:`TinyMTError` if it
    may not be written. ``owner``: the run folder whose lock this command holds."""
    why = output_problem(value, folder=folder, owner=owner)
    if why:
        raise TinyMTError(f"{what}={_short(str(value))!s}: {why} (nothing was written)")
    return Path(str(value)).expanduser()


def output_problem(value: Any, *, folder: bool = False, owner=None,
                   any_run: bool = False) -> str | None:
    """Why ``value`` may not be written (see :func:`check_output`), or None. ``any_run``:
    a folder inside a run is not refused here (the command checks its owner later)."""
    text = "" if value is None else str(value)
    if not text.strip():
        return "empty: name a file to write, never the current folder"
    why = name_problem(text)
    if why:
        return why
    path = Path(text).expanduser()
    if folder:
        if os.path.lexists(path):
            return "it already exists: choose a new folder (an existing one is never overwritten)"
    elif path.is_dir():
        return "it is a folder: name a file to write"
    elif os.path.lexists(path) and not (path.is_symlink() or path.is_file()):
        return "not a regular file (a pipe, socket or device): name a file to write"
    real = real_location(path)
    found = run_state_part(real)
    if found:
        run_dir, part = found
        return (f"it is {part} of the run {run_dir}: writing it would lose the run's own "
                "state (resuming, translating); choose another file")
    run = run_holding(real.parent)
    if run is not None and not any_run and (
            owner is None or Path(os.path.realpath(owner)) != run):
        return (f"it is inside the run {run}: only the commands that own a run write there "
                "(training, averaging, head analysis); choose a file outside it")
    base = next(p for p in [real.parent, *real.parent.parents] if os.path.lexists(p))
    if not base.is_dir():
        return f"{base} is a file, not a folder"
    try:
        tempfile.TemporaryFile(dir=base).close()  # anonymous: leaves nothing behind
    except OSError as e:
        return f"cannot write in {base} ({e.strerror})"
    return None


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot name a file on Linux (blank, a name over 255 bytes, a path over
    4096), or None: asked before any ``stat`` (which raises on such names)."""
    if not text.strip():
        return "empty: name a file or folder"
    path = Path(text).expanduser()
    if len(os.fsencode(os.path.abspath(path))) >= PATH_MAX or any(
            len(os.fsencode(p)) > NAME_MAX for p in path.parts):
        return f"the name is too long for the file system (at most {NAME_MAX} bytes a name)"
    return None


def check_outputs(*outputs: tuple[str, Any]) -> dict[str, Path]:
    """:func:`check_output` of each ``(what, value)`` that is set (files, outside runs), and
    no two naming one file (links and ``..`` resolved)."""
    out: dict[str, Path] = {}
    for what, value in outputs:
        if value is None:
            continue
        path = check_output(value, what)
        real = real_location(path)
        for other, seen in out.items():
            if real_location(seen) == real:
                raise TinyMTError(f"{what}={value} and {other}={dict(outputs)[other]} "
                                  "name the same file: give each output its own (nothing "
                                  "was written)")
        out[what] = path
    return out


def _short(text: str) -> str:
    return text if len(text) <= 60 else f"{text[:28]}...{text[-28:]} ({len(text)} characters)"


# ----------------------------------------------------------------------------- writing
def write_file(path: str | os.PathLike, write: Callable[[BinaryIO], Any], *,
               owner: str | os.PathLike | None = None) -> Path:
    """Publish ``path`` whole: ``write(f)`` fills a locked temp file beside it, which is
    fsynced and renamed over ``path``; then the folder is fsynced. A failure leaves the old
    ``path`` as it was and no temp file. Inside a run only with ``owner`` = that run."""
    path = Path(path)
    real = real_location(path)
    if run_holding(real.parent) is not None:
        refuse_owned(real, owner)
    if real.is_dir():
        raise TinyMTError(f"cannot write {path}: it is a folder")
    previous = ("the previous version is intact" if os.path.lexists(real)
                else "nothing was left there")
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(real.parent)
        with _locked_temp(real.parent) as (tmp, f):
            write(f)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, real)
    except (OSError, RuntimeError) as e:
        raise TinyMTError(_failed(e, path, previous)) from None
    fsync_dir(real.parent)  # make the rename itself durable
    return path


def write_text(text: str, path: str | os.PathLike, **kw) -> Path:
    return write_file(path, lambda f: f.write(text.encode("utf-8")), **kw)


def write_bytes(data: bytes, path: str | os.PathLike, **kw) -> Path:
    return write_file(path, lambda f: f.write(data), **kw)


def write_folder(build: Callable[[Path], None], target: str | os.PathLike, *,
                 replace: Callable[[Path], bool] | None = None,
                 owner: str | os.PathLike | None = None) -> bool:
    """Publish a folder whole: ``build(tmp)`` fills a locked temp folder beside ``target``,
    every file is fsynced, the folder renamed to ``target``. An existing ``target`` is left
    as it is (False) unless ``replace(target)`` says it is to go (damaged): then it is
    moved aside, the new one renamed in, and the old one deleted. A failure removes the
    temp folder: nothing half-written is ever at ``target``."""
    target = Path(target)
    real = real_location(target)
    if run_holding(real.parent) is not None:
        refuse_owned(real, owner)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temps(real.parent)
        with _locked_temp(real.parent, folder=True) as (tmp, _):
            build(tmp)
            for f in sorted(tmp.rglob("*")):
                if f.is_file() and not f.is_symlink():
                    with open(f, "rb") as fh:
                        os.fsync(fh.fileno())
            fsync_dir(tmp)
            if os.path.lexists(real):
                if replace is None or not replace(real):
                    return False
                with _locked_temp(real.parent, folder=True) as (old, _):
                    os.replace(real, old)
                    os.replace(tmp, real)  # `old` (the damaged one) goes with its lock
            else:
                try:
                    os.rename(tmp, real)
                except OSError as e:  # another process published it first
                    if e.errno in (errno.ENOTEMPTY, errno.EEXIST) and real.is_dir():
                        return False
                    raise
    except OSError as e:
        raise TinyMTError(_failed(e, target, "nothing was left there")) from None
    fsync_dir(real.parent)
    return True


def refuse_owned(real: Path, owner) -> None:
    """A write into a run folder by anyone but the process that holds it is a bug of ours
    (user-named outputs were refused by :func:`check_output` before the work)."""
    run = run_holding(real.parent)
    if owner is None or Path(os.path.realpath(owner)) != run:
        raise TinyMTError(f"{real} is inside the run {run}, which this command does not own: "
                          "nothing was written")


@contextlib.contextmanager
def _locked_temp(parent: Path, folder: bool = False) -> Iterator[tuple[Path, BinaryIO | None]]:
    """A new ``.tinymt-tmp-<random>`` file (or folder) in ``parent``, under an exclusive
    ``flock`` until the block ends, then removed if it is still there."""
    for _ in range(100):
        tmp = Path(parent) / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
        f = None
        if folder:
            tmp.mkdir()
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        else:
            f = open(tmp, "xb")
            fd = f.fileno()
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):  # a cleaner took it before our lock: again
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd) if folder else f.close()
    else:  # pragma: no cover - a hundred cleaners racing us
        raise OSError(errno.EAGAIN, "no temp file could be kept")
    try:
        yield tmp, f
    finally:
        if folder:
            shutil.rmtree(tmp, ignore_errors=True)
            os.close(fd)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            f.close()


def clean_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Remove the temp files and folders in ``folder`` whose writer is gone: their
    ``flock`` is free (a live writer holds its own). Returns what was removed."""
    removed = []
    for p in Path(folder).glob(f"{TEMP_PREFIX}*"):
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # held: its writer lives
        try:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
        finally:
            os.close(fd)
    return removed


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def no_space(e: BaseException | None) -> bool:
    """True when ``e`` (or an exception it was raised from) is ENOSPC; torch reports a
    full disk as a RuntimeError from its zip writer."""
    while e is not None:
        if getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _failed(e: BaseException, path, previous: str) -> str:
    if no_space(e):
        return f"no space left on device while writing {path}; {previous}"
    return f"cannot write {path} ({error_reason(e)}); {previous}"


def error_reason(e: BaseException) -> str:
    """What an OSError (or torch's RuntimeError) says, in a few words."""
    if no_space(e):
        return "no space left on device"
    return getattr(e, "strerror", None) or first_line(e)


# ----------------------------------------------------------------------------- reading
def regular_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` if it is a regular file (links followed), else a one-line error naming
    ``what``. Nothing is opened: a pipe would block, a device never end."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise TinyMTError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise TinyMTError(f"cannot read {what} {_short(str(path))} ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise TinyMTError(f"{what} {path} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise TinyMTError(f"{what} {path} is not a regular file (a pipe, socket or device)")
    return path


def read_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them."""
    path = regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped since the check
                raise TinyMTError(f"{what} {path} is not a regular file")
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise TinyMTError(f"cannot read {what} {path} ({e.strerror})") from None
    if len(data) > max_bytes:
        raise TinyMTError(f"{what} {path} is larger than {max_bytes:,} bytes: not one "
                          "tinymt wrote")
    return data


def parse_json(text: str | bytes, what: str, max_depth: int = 32) -> Any:
    """JSON nested at most ``max_depth`` deep (a deep one is refused before parsing),
    finite numbers only; a one-line error naming ``what`` otherwise."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise TinyMTError(f"{what} is not valid UTF-8") from None
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:  # brackets outside strings
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > max_depth:
                raise TinyMTError(f"{what} is nested deeper than {max_depth} levels")
        elif ch in "]}":
            depth -= 1

    def finite(word):
        raise ValueError(f"{word} is not a number JSON allows")
    try:
        return json.loads(text, parse_constant=finite)
    except (ValueError, RecursionError) as e:
        raise TinyMTError(f"{what} is not valid JSON ({first_line(e)})") from None
