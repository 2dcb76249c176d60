"""Every file a command writes goes through here, and every file it reads is opened here.

**Writing** (what is refused and why: docs/reliability.md): :func:`check_output`
(:func:`check_outputs` for several) before any work, in one line naming the option; then
:func:`write_file` (``write_text``, ``write_bytes``) and :func:`write_folder` fill a
``tempfile`` named ``.tinymt-tmp-*`` beside the target, fsync it, rename it over the
target (atomic) and fsync the folder. Folders on the way are followed; a target that is a
link is replaced.

**Runs**: a folder holding ``checkpoints/`` is a run (:func:`tinymt.rundir.claim_run_dir`
makes it). **Reading**: :func:`read_bytes` opens only a regular file (a pipe would block, a
device never end), at most ``max_bytes``; :func:`load_json` loads a JSON file (size
bounded).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from tinymt.errors import TinyMTError, first_line

# ----------------------------------------------------------------------------- run layout
CONFIG = "config.yaml"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
STEP_CHECKPOINT = re.compile(r"ckpt_(\d+)\.pt")
NAMED = ("best", "last", "avg", "pruned")  # checkpoint=<name> picks checkpoints/<name>.pt
TEMP_PREFIX = ".tinymt-tmp-"
NAME_MAX, PATH_MAX = 255, 4096  # bytes: a name, a whole path (Linux)
MAX_JSON_BYTES = 1 << 20  # every JSON file tinymt writes holds a few kB
UMASK = os.umask(0o022)  # the process's umask (read by setting it), put back at once:
os.umask(UMASK)  # a published file gets the usual mode, not the temp file's private 0600


def is_run_dir(folder: Path) -> bool:
    """A run lives in ``folder``: its ``checkpoints/``, made when the run claimed it."""
    return (folder / CHECKPOINTS).is_dir()


def run_state_part(path: Path) -> tuple[Path, str] | None:
    """``(run dir, what)`` when the absolute ``path`` is a file of a run's own state."""
    name, parent = path.name, path.parent
    if name == CONFIG and is_run_dir(parent):
        return parent, "the config"
    if parent.name == CHECKPOINTS and is_run_dir(parent.parent) and (
            name in ("last.pt", "best.pt") or STEP_CHECKPOINT.fullmatch(name)):
        return parent.parent, f"the checkpoint {name}"
    for folder in path.parents:
        if folder.name == TOKENIZER and is_run_dir(folder.parent):
            return folder.parent, "the tokenizer"
    return None


def real_location(path: str | os.PathLike) -> Path:
    """Where writing ``path`` puts a file: its folder with every link resolved, and its own
    name (a link there is replaced, not followed)."""
    path = Path(os.path.abspath(os.path.expanduser(path)))
    return Path(os.path.realpath(path.parent)) / path.name


# ----------------------------------------------------------------------------- checks
def check_output(value: Any, what: str, *, folder: bool = False) -> Path:
    """The file (``folder=True``: new folder) the user's ``what=value`` names, checked
    before any work, or one line saying why not."""
    if why := output_problem(value, folder=folder):
        raise TinyMTError(f"{what}={_short(str(value))!s}: {why} (nothing was written)")
    return Path(str(value)).expanduser()


def output_problem(value: Any, *, folder: bool = False) -> str | None:
    """Why ``value`` may not be written (see :func:`check_output`), or None."""
    text = "" if value is None else str(value)
    if why := name_problem(text):  # (blank: the current folder, never a file to write)
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
    if found := run_state_part(real):
        return (f"it is {found[1]} of the run {found[0]}: writing it would lose the run's own "
                "state (resuming, translating); choose another file")
    base = next(p for p in [real.parent, *real.parent.parents] if os.path.lexists(p))
    try:  # (under a file: "Not a directory")
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


def check_outputs(*outputs: tuple[str, Any]) -> dict[str, Path]:
    """:func:`check_output` of each ``(what, value)`` that is set (files), and
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
def write_file(path: str | os.PathLike, write: Callable[[BinaryIO], Any]) -> Path:
    """Publish ``path`` whole: ``write(f)`` fills a temp file beside it, fsynced and
    renamed over ``path``; a failure removes the temp and leaves the old ``path``."""
    path = Path(path)
    previous = ("the previous version is intact" if os.path.lexists(path)
                else "nothing was left there")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o666 & ~UMASK)
            write(f)
            f.flush()
            os.fsync(fd)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        raise TinyMTError(_failed(e, path, previous)) from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)  # (renamed away when all went well)
    fsync_dir(path.parent)  # make the rename itself durable
    return path


def write_text(text: str, path: str | os.PathLike) -> Path:
    return write_file(path, lambda f: f.write(text.encode("utf-8")))


def write_bytes(data: bytes, path: str | os.PathLike) -> Path:
    return write_file(path, lambda f: f.write(data))


def write_folder(build: Callable[[Path], None], target: str | os.PathLike, *,
                 replace: Callable[[Path], bool] | None = None) -> bool:
    """Publish a folder whole: ``build(tmp)`` fills a temp folder beside ``target``,
    fsynced and renamed to ``target``. An existing ``target`` is kept (False) unless
    ``replace(target)`` says it is damaged: then it is swapped out and deleted."""
    target = Path(target)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=target.parent))
        tmp.chmod(0o777 & ~UMASK)
        build(tmp)
        for f in sorted(tmp.rglob("*")):
            if f.is_file() and not f.is_symlink():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(tmp)
        if os.path.lexists(target):
            if replace is None or not replace(target):
                return False
            old = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=target.parent)
            os.replace(target, old)  # onto the empty folder: the damaged one is out of the way
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.rename(tmp, target)
            except OSError as e:  # another process published it first
                if e.errno in (errno.ENOTEMPTY, errno.EEXIST) and target.is_dir():
                    return False
                raise
    except OSError as e:
        raise TinyMTError(_failed(e, target, "nothing was left there")) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # (renamed away when all went well)
    fsync_dir(target.parent)
    return True


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
    if why := path_problem(Path(path), folder=False, missing="{path} does not exist"):
        raise TinyMTError(f"{what} {why}")
    return Path(path)


def read_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them."""
    path = regular_file(path, what)
    try:
        with open(path, "rb") as f:
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
    not JSON or of another kind."""
    name = f"{what} {path}"
    value = parse_json(read_bytes(path, what, max_bytes), name)
    if not isinstance(value, top):  # (top=object takes any value)
        raise TinyMTError(f"{name} does not hold an object (found {type(value).__name__})")
    return value


def parse_json(text: str | bytes, what: str, error: type[Exception] = TinyMTError) -> Any:
    """JSON already read (:func:`load_json` reads a file; the viewer's records hold theirs),
    finite numbers only; else one line naming ``what``, raised as ``error`` (nesting deeper
    than Python's recursion limit is json's RecursionError)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{what} is not valid UTF-8") from None

    def finite(word):
        raise ValueError(f"{word} is not a number JSON allows")
    try:
        return json.loads(text, parse_constant=finite)
    except (ValueError, RecursionError) as e:
        raise error(f"{what} is not valid JSON ({first_line(e)})") from None
