"""The run directory: its layout, claiming a new one, finding a run, and loading one to
translate with. The trainer writes it; translating, the head analysis and
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

A run is a folder holding ``checkpoints/``: the run makes it when it claims the folder
(:func:`claim_run_dir`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from tinymt.checkpoint import load_checkpoint
from tinymt.errors import TinyMTError, first_line
from tinymt.files import CHECKPOINTS, NAMED, STEP_CHECKPOINT, TOKENIZER, is_run_dir
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


def run_checkpoint(run_dir: str | Path, checkpoint: str) -> Path:
    """``checkpoint=`` of a run: best / last / avg / pruned that file of it, else a path."""
    return checkpoint_path(run_dir, checkpoint) if checkpoint in NAMED else Path(checkpoint)


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's ``ckpt_<step>.pt`` files, oldest step first (other files are ignored)."""
    found = [(int(m.group(1)), p) for p in (Path(run_dir) / CHECKPOINTS).glob("ckpt_*.pt")
             if (m := STEP_CHECKPOINT.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def claim_run_dir(path: str | Path, unique: bool) -> Path:
    """Make a new or empty folder this run's own and return it: the run's ``checkpoints/``
    is made there by ``os.mkdir``, which is atomic, so of two runs started at once exactly
    one gets the folder (Hydra makes the folder itself before the run starts).
    ``unique=True`` (a folder named by the clock): a folder in use sends this run to
    ``<path>_1``, ``_2``, ...; ``unique=False`` (named by the user): that is an error."""
    path = Path(path)
    for n in range(1000):
        folder = path if n == 0 else path.with_name(f"{path.name}_{n}")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not any(folder.iterdir()):
                (folder / CHECKPOINTS).mkdir()
                return folder
        except FileExistsError:
            pass  # another run made it first (or a file has that name)
        except OSError as e:
            raise TinyMTError(f"cannot create the run dir {folder}: {e.strerror}") from None
        if not unique:
            raise TinyMTError(_taken(folder))
    raise TinyMTError(f"{path}: 1000 runs started at once? no free folder found")


def _taken(folder: Path) -> str:
    """Why a run may not start in the folder the user named."""
    if checkpoint_path(folder, "last").is_file():
        return (f"{folder} already holds a run: continue it with trainer.resume={folder}, "
                "or train into another folder")
    if is_run_dir(folder):
        return (f"{folder} holds a run that stopped before its first checkpoint (nothing to "
                f"resume): delete the folder (rm -r {folder}) or train into another one")
    return f"{folder} is not an empty folder: train into a new or empty one"


def unclaim_run_dir(run_dir: Path) -> None:
    """A new run that failed before writing anything gives its folder back: its empty
    ``checkpoints/`` goes (``rmdir`` removes only an empty folder)."""
    with contextlib.suppress(OSError):  # (the error that ended the run is the one to tell)
        if [p.name for p in run_dir.iterdir()] == [CHECKPOINTS]:
            (run_dir / CHECKPOINTS).rmdir()


def find_run(run: str, outputs_root: str = "outputs") -> Path:
    """``latest`` -> the newest run dir (one holding checkpoints/last.pt) under outputs/."""
    if run == "latest":
        root, runs = Path(outputs_root), {}
        for folder, _, files in os.walk(root):  # (not glob: runs come and go while it looks;
            if Path(folder).name == CHECKPOINTS and "last.pt" in files:  # what is gone: skipped)
                with contextlib.suppress(FileNotFoundError):
                    runs[Path(folder).parent] = os.stat(Path(folder, "last.pt")).st_mtime
        if not runs:
            raise TinyMTError(f"run=latest: no trained run (…/{CHECKPOINTS}/last.pt) under "
                              f"{root}/; train one with scripts/train.py or pass run=<run dir>")
        return max(runs, key=runs.get)
    path = Path(run)
    if not path.is_dir():
        raise TinyMTError(f"run dir {path} does not exist")
    return path


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
    ckpt_path = run_checkpoint(run_dir, checkpoint)  # (none: "checkpoint <path> does not exist")
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
