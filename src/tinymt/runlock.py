"""The run lock: one writer per run folder (training, a resume, averaging, head analysis).

A run folder holds :data:`tinymt.files.RUN_MARKER`; the process writing into the run holds an
exclusive ``flock`` on it (released when the process ends, a kill included) and passes the
run folder as ``owner`` to :mod:`tinymt.files`. The marker is opened without following a
link and must be a regular file; every ``flock`` or write error (NFS or FUSE without
locks, a full disk) is one line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from tinymt.errors import TinyMTError
from tinymt.files import RUN_MARKER, error_reason, is_run_dir, read_bytes


class RunLock:
    """One writer per run dir: an exclusive ``flock`` on ``<run_dir>/.tinymt-run``, held
    while a command writes into the run and released when it ends or its process dies (a
    kill included). The marker holds the writer's pid, for the message others get.

        lock = RunLock.take(run_dir)   # None: another live process writes there
        try: ...write...
        finally: lock.release()
    """

    def __init__(self, fd: int, run_dir: Path):
        self.fd, self.run_dir = fd, run_dir
        self.made: list[Path] = []  # folders made to hold a new run, deepest first

    @classmethod
    def take(cls, run_dir: str | os.PathLike) -> RunLock | None:
        run_dir = Path(run_dir)
        marker = run_dir / RUN_MARKER
        try:
            fd = os.open(marker, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                         0o644)
        except OSError as e:
            why = ("it is a symbolic link" if e.errno == errno.ELOOP else e.strerror)
            raise TinyMTError(f"cannot use the run dir {run_dir}: its marker {RUN_MARKER} "
                              f"cannot be opened ({why})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TinyMTError(f"cannot use the run dir {run_dir}: its marker "
                                  f"{RUN_MARKER} is not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:  # ENOLCK / EOPNOTSUPP (NFS, FUSE), ENOSPC, ...
            os.close(fd)
            raise TinyMTError(f"cannot lock the run dir {run_dir} ({error_reason(e)}): a run needs a "
                              "local file system that supports flock") from None
        except TinyMTError:
            os.close(fd)
            raise
        return cls(fd, run_dir)

    @staticmethod
    def holder(run_dir: str | os.PathLike) -> str:
        """The pid written by the process holding ``run_dir``'s lock (as text)."""
        try:
            return read_bytes(Path(run_dir) / RUN_MARKER, "the run marker", 64).decode(
                "ascii", "replace").strip() or "?"
        except TinyMTError:
            return "?"

    def undo(self) -> None:
        """A new run that failed before writing anything: its marker and the folders made
        for it go (a folder holding anything else stays), then the lock."""
        if self.fd is not None and [p.name for p in self.run_dir.iterdir()] == [RUN_MARKER]:
            (self.run_dir / RUN_MARKER).unlink(missing_ok=True)
            for folder in self.made:
                try:
                    folder.rmdir()  # only when empty
                except OSError:
                    break
        self.release()

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the file releases the flock
            self.fd = None


def lock_run(run_dir: str | os.PathLike, doing: str) -> RunLock:
    """The lock of an existing run about to be written into (``doing``: "resume", ...),
    or a one-line error naming the live writer."""
    if not is_run_dir(Path(run_dir)):  # the lock would make it look like one
        raise TinyMTError(f"cannot {doing} {run_dir}: it is not a run (no "
                          f"{RUN_MARKER}, no checkpoints/last.pt)")
    lock = RunLock.take(run_dir)
    if lock is None:
        raise TinyMTError(f"cannot {doing} {run_dir}: another process (pid "
                          f"{RunLock.holder(run_dir)}) is writing it; one writer per run: wait "
                          "for it to end, or stop it")
    return lock
