"""Every file a command writes goes through here, and every file it reads is opened here.

**Writing**: :func:`check_output` (:func:`check_outputs` for several), before any work,
refuses in one line naming the option a path that is empty or blank, too long, a folder,
a pipe, socket or device, part of a run's own state (its marker, ``config.yaml``,
``tokenizer/``, ``checkpoints/last.pt``, ``best.pt``, ``ckpt_<step>.pt``), inside a run
the command does not own, where nothing can be created, or another output of the same
command. Then :func:`write_file` (``write_text``, ``write_bytes``) and :func:`write_folder`
fill ``.tinymt-tmp-<random>`` beside the target under an exclusive ``flock``, fsync it,
rename it over the target (atomic) and fsync the folder: a failure leaves the old target
as it was. Temp files whose lock nobody holds (their writer died) go at the next write
into that folder. Folders on the way are followed; a target that is a link is replaced.

**Runs**: a folder holding :data:`RUN_MARKER` (or ``checkpoints/last.pt``) is a run; only
the process holding its lock (:class:`tinymt.rundir.RunLock`, passed as ``owner``) writes
into it. **Reading**: :func:`read_bytes` opens only a regular file (a pipe would block, a
device never end), at most ``max_bytes``; :func:`load_json` loads the JSON files tinymt
writes (size and nesting bounded).
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
MAX_JSON_BYTES = 1 << 20  # every JSON file tinymt writes holds a few kB


def is_run_dir(folder: Path) -> bool:
    """A run lives in ``folder``: its marker, or (a run without one) its last.pt."""
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
    """The file (``folder=True``: new folder) the user's ``what=value`` names, checked
    before any work (``owner``: the run this command holds), or one line saying why not."""
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
        return (f"it is {found[1]} of the run {found[0]}: writing it would lose the run's own "
                "state (resuming, translating); choose another file")
    foreign = _foreign_run(real, owner)
    if foreign is not None and not any_run:
        return (f"it is inside the run {foreign}: only the commands that own a run write "
                "there (training, averaging, head analysis); choose a file outside it")
    mine = owner is not None and foreign is None and run_holding(real.parent)
    if mine and real.parent != mine / CHECKPOINTS:
        return (f"it is inside the run {mine}, outside its {CHECKPOINTS}/ folder: the run's "
                "other files are its training's (TensorBoard events, metrics.json, ...); "
                f"write into {mine / CHECKPOINTS} or outside the run")
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
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~name: no such user
        return f"{text.split('/', 1)[0]}: no such user, so no such home folder"
    if len(os.fsencode(os.path.abspath(path))) >= PATH_MAX or any(
            len(os.fsencode(p)) > NAME_MAX for p in path.parts):
        return f"the name is too long for the file system (at most {NAME_MAX} bytes a name)"
    return None


def _foreign_run(real: Path, owner) -> Path | None:
    """The run that the file ``real`` would lie in, unless ``owner`` is that run."""
    run = run_holding(real.parent)
    return None if owner is not None and Path(os.path.realpath(owner)) == run else run


def check_outputs(*outputs: tuple[str, Any]) -> dict[str, Path]:
    """:func:`check_output` of each ``(what, value)`` that is set (files, outside runs), and
    no two naming one file (links and ``..`` resolved)."""
    out: dict[str, Path] = {}
    for what, value in outputs:
        if value is None:
            continue
        path = check_output(value, what)
        for other, seen in out.items():
            if real_location(seen) == real_location(path):
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
    """Publish ``path`` whole: ``write(f)`` fills a locked temp file beside it, fsynced and
    renamed over ``path`` (a failure leaves the old one). Inside a run only for its
    ``owner``."""
    path = Path(path)
    real = _target(path, owner)
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
    fsynced and renamed to ``target``. An existing ``target`` is kept (False) unless
    ``replace(target)`` says it is damaged: then it is swapped out and deleted."""
    target = Path(target)
    real = _target(target, owner)
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


def _target(path: Path, owner) -> Path:
    """Where ``path`` really is; inside a run only for its ``owner`` (else a bug of ours:
    user-named outputs were refused by :func:`check_output` before the work)."""
    real = real_location(path)
    run = _foreign_run(real, owner)
    if run is not None:
        raise TinyMTError(f"{real} is inside the run {run}, which this command does not own: "
                          "nothing was written")
    return real


@contextlib.contextmanager
def _locked_temp(parent: Path, folder: bool = False) -> Iterator[tuple[Path, BinaryIO | None]]:
    """A new ``.tinymt-tmp-<random>`` file (or folder) in ``parent``, under an exclusive
    ``flock`` until the block ends, then removed if it is still there."""
    for _ in range(100):
        tmp = Path(parent) / f"{TEMP_PREFIX}{secrets.token_hex(8)}"
        if folder:
            tmp.mkdir()
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY if folder else
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):  # a cleaner took it before our lock: again
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)
    else:  # pragma: no cover - a hundred cleaners racing us
        raise OSError(errno.EAGAIN, "no temp file could be kept")
    f = None if folder else os.fdopen(fd, "wb")
    try:
        yield tmp, f
    finally:
        if folder:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        f.close() if f else os.close(fd)


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
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused: its writer lives
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
        except OSError:
            continue
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
def path_problem(path: Path, folder: bool | None = None, missing: str | None = None,
                 pipe: bool = False) -> str | None:
    """Why ``path`` is not a folder (``folder=True``), a regular file (False) or either
    (None; ``pipe``: a FIFO too), or None; never opened. ``missing``: the message
    (``{path}`` in it) when it is not there (None: that is fine)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return missing and missing.format(path=path)
    except OSError as e:
        return f"{_short(str(path))} cannot be read ({e.strerror})"
    if stat.S_ISDIR(mode):
        return f"{path} is a folder, not a file" if folder is False else None
    if folder:
        return f"{path} is not a folder"
    if stat.S_ISREG(mode) or pipe and stat.S_ISFIFO(mode):
        return None
    return f"{path} is not a regular file " + (
        "or a pipe (a device or socket)" if pipe else "(a pipe, socket or device)")


def regular_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` if it is a regular file (links followed), else one line naming ``what``."""
    why = path_problem(Path(path), folder=False, missing="{path} does not exist")
    if why:
        raise TinyMTError(f"{what} {why}")
    return Path(path)


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


def load_json(path: str | os.PathLike, what: str, max_bytes: int = MAX_JSON_BYTES,
              top: type = dict) -> Any:
    """The JSON value (a ``top``: dict, an object) of the file ``path``; one line naming
    it (as ``what``) when it is not a regular file of at most ``max_bytes``, not UTF-8,
    not JSON, nested too deep or of another kind."""
    name = f"{what} {path}"
    value = parse_json(read_bytes(path, what, max_bytes), name)
    if not isinstance(value, top):
        kind = {dict: "an object", list: "a list"}.get(top, top.__name__)
        raise TinyMTError(f"{name} does not hold {kind} (found {type(value).__name__})")
    return value


def parse_json(text: str | bytes, what: str, max_depth: int = 32,
               error: type[Exception] = TinyMTError) -> Any:
    """JSON already read (:func:`load_json` reads a file; the viewer's records hold theirs),
    nested at most ``max_depth`` deep (a deep one is refused before parsing), finite numbers
    only; else one line naming ``what``, raised as ``error``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{what} is not valid UTF-8") from None
    depth = 0
    in_string = escaped = False
    for ch in text:  # brackets outside strings
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise error(f"{what} is nested deeper than {max_depth} levels")
        elif ch in "]}":
            depth -= 1

    def finite(word):
        raise ValueError(f"{word} is not a number JSON allows")
    try:
        return json.loads(text, parse_constant=finite)
    except (ValueError, RecursionError) as e:
        raise error(f"{what} is not valid JSON ({first_line(e)})") from None
