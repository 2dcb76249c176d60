"""The run directory: its layout, finding a run, and loading one to translate with.

One place says where everything of a run lives; the trainer writes it, and translate,
the head analysis and ``scripts/average_checkpoints.py`` read it::

    <run_dir>/config.yaml                 the resolved training config
    <run_dir>/tokenizer/                  sentencepiece model(s)
    <run_dir>/checkpoints/last.pt         newest state (model, optimizer, data order, RNG)
    <run_dir>/checkpoints/best.pt         best validation BLEU so far
    <run_dir>/checkpoints/ckpt_<step>.pt  step checkpoints kept for averaging
    <run_dir>/checkpoints/avg.pt          their average (trainer.average_last)
    <run_dir>/checkpoints/pruned.pt       heads masked by scripts/analyze_heads.py prune=...
    <run_dir>/events.out.tfevents.*       TensorBoard
    <run_dir>/metrics.json                final numbers
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tinymt.checkpoint import load_checkpoint
from tinymt.errors import TinyMTError, first_line
from tinymt.model import Transformer
from tinymt.tokenizer import Tokenizer, load_tokenizers, tokenizer_digest

CONFIG = "config.yaml"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
METRICS = "metrics.json"
RUN_MARKER = ".tinymt-run"  # created atomically by the run that owns the folder
NAMED = ("best", "last", "avg")  # checkpoint=<name> picks checkpoints/<name>.pt
_STEP = re.compile(r"ckpt_(\d+)\.pt")
# a new run's folder, by the clock: <root>/<date>/<time> (configs/train.yaml's hydra.run.dir
# spells the same with Hydra's ${now:...})
CLOCK_NAME = "%Y-%m-%d/%H-%M-%S"


def clock_run_dir(root: str = "outputs") -> str:
    """``<root>/<date>/<time>`` for a run started now (claim it with :func:`claim_run_dir`
    with ``unique=True``: two runs in one second get ``_1``, ``_2``, ...)."""
    return f"{root}/{time.strftime(CLOCK_NAME)}"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_path(run_dir: str | Path, name: str) -> Path:
    """``<run_dir>/checkpoints/<name>.pt`` (``name``: last, best, avg, pruned)."""
    return checkpoint_dir(run_dir) / f"{name}.pt"


def step_checkpoint(run_dir: str | Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"ckpt_{step}.pt"


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's ``ckpt_<step>.pt`` files, oldest step first (other files are ignored)."""
    found = [(int(m.group(1)), p) for p in checkpoint_dir(run_dir).glob("ckpt_*.pt")
             if (m := _STEP.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def holds_run(run_dir: str | Path) -> bool:
    """Whether a run already lives in ``run_dir`` (its marker, config or checkpoints)."""
    return any((Path(run_dir) / name).exists() for name in (RUN_MARKER, CONFIG, CHECKPOINTS))


def claim_run_dir(path: str | Path, unique: bool) -> Path:
    """Make a folder this run's own, atomically, and return it.

    The claim is the exclusive creation of ``<folder>/.tinymt-run``: of two runs started
    at once, exactly one gets a folder. ``unique=True`` (a folder named by the clock, as
    Hydra's ``outputs/<date>/<time>``): when ``path`` already holds a run, the run goes
    to ``<path>_1``, ``<path>_2``, ... ``unique=False`` (a folder the user named): one
    that already holds a run is an error; nothing in it is touched.
    """
    path = Path(path)
    for n in range(1000):
        folder = path if n == 0 else path.with_name(f"{path.name}_{n}")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not holds_run(folder):
                fd = os.open(folder / RUN_MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.write(fd, f"{os.getpid()}\n".encode())
                os.close(fd)
                return folder
        except FileExistsError:
            pass  # another run claimed it between our check and our create
        except OSError as e:
            raise TinyMTError(f"cannot create the run dir {folder}: {e.strerror}") from None
        if not unique:
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
    """``best`` / ``last`` / ``avg`` -> that file of the run; anything else is a path."""
    if checkpoint in NAMED:
        path = checkpoint_path(run_dir, checkpoint)
        if not path.is_file():
            raise TinyMTError(f"checkpoint={checkpoint}: expected {path}, which does not "
                              "exist (checkpoint=best|last|avg|<path>)")
        return path
    return Path(checkpoint)


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
