"""The run directory: its layout, its one writer (:class:`RunLock`), finding a run, and
loading one to translate with. The trainer writes it; translating, the head analysis and
``scripts/average_checkpoints.py`` read it::

    <run_dir>/config.yaml                 the resolved training config
    <run_dir>/tokenizer/                  sentencepiece model(s)
    <run_dir>/checkpoints/last.pt         newest state (model, optimizer, data order, RNG)
    <run_dir>/checkpoints/best.pt         best validation BLEU so far
    <run_dir>/checkpoints/ckpt_<step>.pt  step checkpoints kept for averaging
    <run_dir>/checkpoints/avg.pt          their average (trainer.average_last)
    <run_dir>/checkpoints/pruned.pt       heads masked by scripts/analyze_heads.py prune=...
    <run_dir>/events.out.tfevents.*       TensorBoard
    <run_dir>/metrics.json                final numbers

The process writing into a run (training, a resume, averaging, head analysis) holds
:class:`RunLock`: one writer per run.
"""

from __future__ import annotations

import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tinymt.checkpoint import load_checkpoint
from tinymt.errors import TinyMTError, first_line
from tinymt.files import (
    CHECKPOINTS,
    CONFIG,
    NAMED,
    RUN_MARKER,
    STEP_CHECKPOINT,
    TOKENIZER,
    error_reason,
    is_run_dir,
)
from tinymt.model import Transformer
from tinymt.tokenizer import Tokenizer, load_tokenizers, tokenizer_digest

METRICS = "metrics.json"
# a new run's folder: <root>/<date>/<time> (configs/train.yaml's hydra.run.dir: ${now:...})
CLOCK_NAME = "%Y-%m-%d/%H-%M-%S"


def clock_run_dir(root: str = "outputs") -> str:
    """``<root>/<date>/<time>`` for a run started now (claim it with :func:`claim_run_dir`
    with ``unique=True``: two runs in one second get ``_1``, ``_2``, ...)."""
    return f"{root}/{time.strftime(CLOCK_NAME)}"


def checkpoint_path(run_dir: str | Path, name: str) -> Path:
    """``<run_dir>/checkpoints/<name>.pt`` (``name``: last, best, avg, pruned, ckpt_<step>)."""
    return Path(run_dir) / CHECKPOINTS / f"{name}.pt"


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's ``ckpt_<step>.pt`` files, oldest step first (other files are ignored)."""
    found = [(int(m.group(1)), p) for p in (Path(run_dir) / CHECKPOINTS).glob("ckpt_*.pt")
             if (m := STEP_CHECKPOINT.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


class RunLock:
    """One writer per run dir: an exclusive ``flock`` on its marker (it holds the writer's
    pid), released when the command ends or its process dies. ``RunLock.take(run_dir)``:
    None when another live process holds it."""

    def __init__(self, fd: int, run_dir: Path):
        self.fd, self.run_dir = fd, run_dir
        self.made: list[Path] = []  # folders made to hold a new run, deepest first

    @classmethod
    def take(cls, run_dir: str | os.PathLike) -> RunLock | None:
        run_dir = Path(run_dir)
        fd = None
        try:
            fd = os.open(run_dir / RUN_MARKER, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return cls(fd, run_dir)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            if isinstance(e, BlockingIOError):  # another process holds it
                return None
            raise TinyMTError(f"cannot lock the run dir {run_dir} ({error_reason(e)})") from None

    @staticmethod
    def holder(run_dir: str | os.PathLike) -> str:
        """The pid written by the process holding ``run_dir``'s lock (as text)."""
        try:
            return (Path(run_dir) / RUN_MARKER).read_text(errors="replace").strip() or "?"
        except OSError:
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


def holds_run(run_dir: str | Path) -> bool:
    """Whether a run lives in ``run_dir``: its config or checkpoints (a marker alone: no)."""
    return any((Path(run_dir) / name).exists() for name in (CONFIG, CHECKPOINTS))


def _run_around(path: Path) -> str | None:
    """Why a new run may not live at ``path``: inside another run's folder, or in a folder
    that holds runs below it (``run=latest`` would then find the wrong one)."""
    for parent in path.absolute().parents:
        if is_run_dir(parent):
            return f"{path} is inside the run {parent}"
    if path.is_dir():
        inner = next((p.parent for p in path.rglob(RUN_MARKER) if p.parent != path), None)
        if inner is not None:
            return f"{path} holds other runs ({inner})"
    return None


def claim_run_dir(path: str | Path, unique: bool) -> tuple[Path, RunLock]:
    """Make a folder this run's own, atomically (its :class:`RunLock`: of two runs started
    at once exactly one gets it), and return it with the lock. ``unique=True`` (a folder
    named by the clock): one that holds a run sends this run to ``<path>_1``, ``_2``, ...;
    ``unique=False`` (named by the user): that is an error. A folder holding only the
    marker of a run that stopped before writing anything is free."""
    path = Path(path)
    why = _run_around(path)
    if why:
        raise TinyMTError(f"{why}: train into a folder of its own (nothing was written)")
    for n in range(1000):
        folder = path if n == 0 else path.with_name(f"{path.name}_{n}")
        made = [p for p in [folder, *folder.absolute().parents] if not os.path.lexists(p)]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TinyMTError(f"cannot create the run dir {folder}: {e.strerror}") from None
        lock = None if holds_run(folder) else RunLock.take(folder)
        if lock is not None and not holds_run(folder):  # (else: written by a run that ended)
            lock.made = made
            return folder, lock
        if lock is not None:
            lock.release()
        if not unique:
            if not holds_run(folder):
                raise TinyMTError(f"{folder} is being claimed by another process (pid "
                                  f"{RunLock.holder(folder)}): train into another folder")
            if not checkpoint_path(folder, "last").is_file():
                raise TinyMTError(f"{folder} holds a run that stopped before its first "
                                  f"checkpoint (nothing to resume): delete the folder (rm -r "
                                  f"{folder}) or train into another one")
            raise TinyMTError(f"{folder} already holds a run: continue it with "
                              f"trainer.resume={folder}, or train into another folder")
    raise TinyMTError(f"{path}: 1000 runs started at once? no free folder found")


def find_run(run: str, outputs_root: str = "outputs") -> Path:
    """``latest`` -> the newest run dir (one holding checkpoints/last.pt) under outputs/."""
    if run == "latest":
        root = Path(outputs_root)
        runs = [p.parent.parent for p in root.glob(f"**/{CHECKPOINTS}/last.pt")]
        if not runs:
            raise TinyMTError(f"run=latest: no trained run (…/{CHECKPOINTS}/last.pt) under "
                              f"{root}/; train one with scripts/train.py or pass run=<run dir>")
        return max(runs, key=lambda p: checkpoint_path(p, "last").stat().st_mtime)
    path = Path(run)
    if not path.is_dir():
        raise TinyMTError(f"run dir {path} does not exist")
    return path


def resolve_checkpoint(run_dir: Path, checkpoint: str) -> Path:
    """``best`` / ``last`` / ``avg`` / ``pruned`` -> that file of the run; anything else is
    a path."""
    if checkpoint in NAMED:
        path = checkpoint_path(run_dir, checkpoint)
        if not path.is_file():
            made_by = {"avg": " (written by scripts/average_checkpoints.py or "
                              "trainer.average_last)",
                       "pruned": " (written by scripts/analyze_heads.py prune=<fraction>)"}
            raise TinyMTError(f"checkpoint={checkpoint}: expected {path}, which does not "
                              f"exist{made_by.get(checkpoint, '')}")
        return path
    return Path(checkpoint)  # load_checkpoint says when there is no such file


@dataclass
class LoadedRun:
    model: Transformer
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    config: dict  # the run's resolved training config
    run_dir: Path
    checkpoint: Path
    state: dict  # the checkpoint as loaded (on the CPU)


def load_run(run: str, checkpoint: str = "best", device: torch.device | str = "cpu",
             outputs_root: str = "outputs") -> LoadedRun:
    """A run's tokenizer(s) and the model of one of its checkpoints, in eval mode."""
    run_dir = find_run(run, outputs_root)
    ckpt_path = resolve_checkpoint(run_dir, checkpoint)
    state = load_checkpoint(ckpt_path, map_location="cpu")
    tok_dir = run_dir / TOKENIZER
    src_tok, tgt_tok = load_tokenizers(tok_dir)
    vocab = state["vocab"]
    if (vocab["src_size"], vocab["tgt_size"]) != (src_tok.vocab_size, tgt_tok.vocab_size):
        raise TinyMTError(
            f"{ckpt_path} was trained with vocab sizes {vocab['src_size']}/{vocab['tgt_size']} but "
            f"the tokenizer in {tok_dir} has {src_tok.vocab_size}/{tgt_tok.vocab_size}: the "
            "checkpoint belongs to another run")
    if state.get("tokenizer_sha256") != tokenizer_digest(src_tok, tgt_tok):
        raise TinyMTError(f"{ckpt_path} was trained with another tokenizer than the one in "
                          f"{tok_dir}: the checkpoint belongs to another run")
    model = Transformer(OmegaConf.create(state["model_config"]), vocab["src_size"],
                        vocab["tgt_size"], shared_vocab=vocab["shared"])
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise TinyMTError(f"{ckpt_path} does not fit its own model config "
                          f"({first_line(e)})") from None
    model.to(device).eval()
    return LoadedRun(model, src_tok, tgt_tok, state.get("config", {}), run_dir, ckpt_path, state)
