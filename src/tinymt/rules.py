"""What a config value may be: rule makers (``_int``, ``_num``, ``one_of``), the upper
bound of every number (``MAX_*``: what the machine and the libraries below can do), and the
checks of paths (a file to write is a regular one or new; ``input=`` / ``ref=`` a regular
file or a pipe; checked without opening them: a pipe blocks, a device never ends).
:mod:`tinymt.config` puts them on its schemas' fields (``rule_field``) and checks a config
against them (``rules_of`` a schema, ``apply_rules``: one ``TinyMTError`` line).
"""

from __future__ import annotations

import math
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import field, fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tinymt.errors import TinyMTError
from tinymt.files import NAMED, name_problem, output_problem

Check = Callable[[Any], "bool | str"]  # True = fine; False, or the reason, = not
Rule = tuple[Check, str]  # (check, what to tell the user)


# ----------------------------------------------------------------------------- rule makers
def is_number(v, types=(int, float)) -> bool:  # ints are finite (and may not fit a float)
    return isinstance(v, types) and not isinstance(v, bool) and (
        isinstance(v, int) or math.isfinite(v))


def integer(lo: int, hi: int, note: str = "") -> Rule:
    """An integer in [lo, hi]: every one bounded (see the upper bounds below)."""
    return (lambda v: is_number(v, int) and lo <= v <= hi,
            f"must be an integer in [{lo}, {hi}]" + (f" ({note})" if note else ""))


def number(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False,
         note: str = "") -> Rule:
    """A finite number in the interval (bounded: see the upper bounds below); ``lo_open`` /
    ``hi_open`` leave that end out."""
    ok = lambda v: is_number(v) and (lo < v if lo_open else lo <= v) and (  # noqa: E731
        v < hi if hi_open else v <= hi)
    text = f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return ok, f"must be a finite number{text}" + (f" ({note})" if note else "")


# ----------------------------------------------------------------------------- upper bounds
# Every size a user gives is bounded (issue #27): an absurd value (decode.beam=100000,
# trainer.seed=2**64, trainer.accumulate=10**9) is one error line before work starts, not
# minutes of work, an allocation error, or a library's overflow after a whole training run.
# Each bound lies far above anything the shipped configs use and within what the libraries
# accept; the rule of each key says which bound it takes (its note: why).
MAX_COUNT = 10**9  # steps, epochs, sentences, pairs, budgets: more than any run here makes
MAX_SEED = 2**32 - 1  # numpy's seeds are < 2**32 (torch's < 2**64, Python's unbounded)
MAX_THREADS = 1024  # torch.set_num_threads: more than the cores of any one machine
MAX_BEAM = 256  # hypotheses per sentence (beam, nbest, test_beam): 5 is usual
MAX_BATCH_TOKENS = 2**18  # tokens per batch: 64x the shipped 4096 (trainer.accumulate: more)
MAX_BEAM_TOKENS = 2**20  # batch tokens x beam: one beam-search batch's hypotheses (4096 x 256)
MAX_ACCUMULATE = 1024  # micro-batches per optimizer step
MAX_WIDTH = 2**16  # model.d_model, model.d_ff, model.max_positions, data.max_len (tokens)
MAX_LAYERS = 256  # encoder or decoder layers
MAX_HEADS = 1024  # attention heads per layer (d_model must divide by them)
MAX_VOCAB = 2**20  # sentencepiece pieces per vocabulary
MAX_PARAMETERS = 10**9  # a model's estimated size: ~16 GB to train in fp32 (AdamW: 4 copies)
MAX_LEN_PENALTY = 10.0  # |decode.len_penalty|: n ** 10 is finite for any output length n
MAX_BUILTIN_PAIRS = 2_000_000  # the built-in corpus: 10x its default, ~1.5 min to generate


def one_of(*words: str) -> Rule:
    return (lambda v: v in words), "choose one of " + ", ".join(words)


def writable_file(value, any_run: bool = False) -> bool | str:
    """A file we may (over)write (:func:`tinymt.files.output_problem`: not empty, not a
    folder, a pipe or a device, not a run's state nor inside a run, in a place where files
    can be made); ``any_run``: inside a run is checked later, by the command that owns it."""
    return output_problem(value, any_run=any_run) or True


def readable_file(value) -> bool | str:
    """A text file to read: a regular file, or a pipe (``input=<(command)``); never opened
    here. A device (``/dev/zero``) or socket is refused: it may never end."""
    if why := name_problem(str(value)):
        return why
    path = Path(value).expanduser()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"file not found: {path}"
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    if stat.S_ISDIR(mode):
        return f"{path} is a folder"
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        return f"{path} is not a regular file or a pipe (a device or socket)"
    return True


def creatable_folder(value, write: bool = False) -> bool | str:
    """A folder that exists (and where we may ``write``), or whose nearest existing
    ancestor is a folder we may write in; never blank, nor inside a run."""
    if why := name_problem(str(value)):
        return why
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        return f"{path} is a file"
    why = output_problem(path / "x", any_run=path.exists() and not write)
    return why.replace(f"{path / 'x'}", str(path)) if why else True


def existing_run(value) -> bool | str:
    """A run folder to continue (``trainer.resume``): it exists and is a folder."""
    why = named_path(value, folder=True)
    if why is not True:
        return why
    return True if Path(value).expanduser().exists() else f"{value} does not exist"


def named_path(value, folder: bool | None = None, names: tuple[str, ...] = ()) -> bool | str:
    """A path to read (or one of ``names``): not blank, a name the file system takes, and
    when it exists a folder (``folder=True``), a regular file (``folder=False``) or either;
    never opened (a pipe blocks, a device never ends). A missing one is the command's to
    report (it knows what was expected there)."""
    text = str(value)
    if text in names:
        return True
    if why := name_problem(text):
        return why
    path = Path(text).expanduser()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return True
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    if folder is True and not stat.S_ISDIR(mode):
        return f"{path} is not a folder"
    if folder is False and stat.S_ISDIR(mode):
        return f"{path} is a folder, not a file"
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        return f"{path} is not a regular file (a pipe, socket or device)"
    return True


def attention_file(attention: str | None) -> str | None:
    """The file ``attention=`` writes first: itself (``.png``, ``.html``), or the first
    PNG of the folder it names."""
    if attention is None or Path(attention).suffix.lower() in (".png", ".html"):
        return attention
    return str(Path(attention) / "line1.png")


def attention_target(value) -> bool | str:
    if why := name_problem(str(value)):
        return why
    path = Path(value).expanduser()
    if path.suffix.lower() not in (".png", ".html") and path.exists() and not path.is_dir():
        return f"{path} is an existing file that is not a .png or .html"
    return writable_file(attention_file(str(value)))  # a folder: its maps go into it


def new_folder(value) -> bool | str:
    return output_problem(value, folder=True) or True


POSITIVE, COUNT = integer(1, MAX_COUNT), integer(0, MAX_COUNT)
SEED = integer(0, MAX_SEED, note="numpy's seeds are < 2**32")
BEAM = integer(1, MAX_BEAM, note="hypotheses kept per sentence")
BATCH_TOKENS = integer(1, MAX_BATCH_TOKENS, note="tokens per batch")
WIDTH = integer(1, MAX_WIDTH)
LAYERS = integer(1, MAX_LAYERS)
PROBABILITY = number(0, 1, hi_open=True, note="a probability")
DEVICE: Rule = (lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
                "choose one of auto, cpu, cuda, cuda:N, mps")
PATH: Rule = (named_path, "must name a file or folder")
RUN: Rule = (lambda v: named_path(v, folder=True, names=("latest",)),
             "must be a run folder (or latest)")
DIR: Rule = (lambda v: named_path(v, folder=True), "must be a folder")
CHECKPOINT: Rule = (lambda v: named_path(v, folder=False, names=NAMED),
                    "must be best, last, avg, pruned or a checkpoint file")
FOLDER: Rule = (creatable_folder, "must be a folder (or where one can be made), not a file")
RUN_FOLDER: Rule = (existing_run, "must be the folder of a run to continue")
TEXT_FILE: Rule = (readable_file, "must be a text file to read (a regular file or a pipe)")
CKPT_FILE: Rule = (lambda v: writable_file(v, any_run=True),
                   "must be a checkpoint file to write (not a folder)")
NEW_FOLDER: Rule = (new_folder, "must be a new folder (an existing one is never overwritten)")


def owned_output(key: str) -> Cross:
    """``key`` (a checkpoint to write) may lie in a run only if it is the run ``run=``
    names (``run=latest``: checked once the run is found)."""
    def why(c):
        value = c.get(key) if isinstance(c, Mapping) else getattr(c, key)
        return None if value is None or c.run == "latest" else \
            output_problem(value, owner=c.run)
    return (lambda c: why(c) is None), (lambda c: f"{key}={c.get(key)}: {why(c)}")


# ----------------------------------------------------------------------------- on schemas
def rule_field(default, rule: Rule):
    """A schema field: its default (= the YAML's, tested) and the values it allows."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


def rules_of(schema, prefix: str = "") -> dict[str, Rule]:
    """``{dotted key: (check, what to tell the user)}`` of a schema, its groups included."""
    out: dict[str, Rule] = {}
    for f in fields(schema):
        if is_dataclass(f.default_factory):
            out.update(rules_of(f.default_factory, f"{prefix}{f.name}."))
        elif "rule" in f.metadata:
            out[prefix + f.name] = f.metadata["rule"]
    return out


# (fine?, message: a format string of c, the config (DATA_CROSS: data), or a function of it)
Cross = tuple[Callable[[Any], bool], "str | Callable[[Any], str]"]


def apply_rules(cfg, rules: Mapping[str, Rule], cross: list[Cross] = (), strip: str = "") -> None:
    """Every key's own rule (None = unset, skipped), then the rules between keys."""
    for key, (check, allowed) in rules.items():
        value = cfg
        for part in key.removeprefix(strip).split("."):
            value = value[part] if isinstance(value, Mapping) else getattr(value, part)
        verdict = True if value is None else check(value)
        if verdict is not True:
            shown = list(value) if OmegaConf.is_list(value) else value
            why = f" ({verdict})" if isinstance(verdict, str) else ""
            raise TinyMTError(f"{key}={shown!r}: {allowed}{why}")
    for ok, message in cross:
        if not ok(cfg):
            raise TinyMTError(message(cfg) if callable(message) else message.format(c=cfg))
