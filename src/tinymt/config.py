"""Typed config schemas (registered in Hydra's ConfigStore) and the one place values are checked.

**Defaults** are those of the commented YAML in ``configs/`` (what users read and what runs),
repeated here because code and tests build partial configs (``ModelConfig(d_model=16)``) and
need the shipped values for the rest: simpler than ``MISSING`` fields that every such caller
would first fill from the YAML. ``tests/test_config.py`` proves both equal, key for key.

**Rules**: each field names the values it allows (``_r(default, rule)``); ``*_RULES`` are those
tables, ``*_CROSS`` the rules between keys; a bad value is one ``TinyMTError`` line. Every
number is bounded above too (``MAX_*``: what the machine and the libraries can do); a file to
write must be a regular one or new, ``input=`` / ``ref=`` a regular file or a pipe, checked
without opening them (a pipe blocks, a device never ends). Scripts
call right after composition ``as_train_config(cfg)`` (merge onto :class:`TrainConfig`, check)
or ``check_train|data|translate|export|analyze|average(cfg)``; ``tinymt.cli.run_hydra(main)``
makes Hydra's own composition errors (unknown key, wrong type, missing option) one line too.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from tinymt.cli import run_hydra  # noqa: F401  (the scripts' import of it, kept)
from tinymt.errors import TinyMTError

Check = Callable[[Any], "bool | str"]  # True = fine; False, or the reason, = not
Rule = tuple[Check, str]  # (check, what to tell the user)
ATTENTION_KINDS = ("encoder_self", "decoder_self", "cross")  # = tinymt.model.KINDS (tested)


# ----------------------------------------------------------------------------- rule makers
def _r(default, rule: Rule):
    """A schema field: its default (= the YAML's, tested) and the values it allows."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"rule": rule})
    return field(default=default, metadata={"rule": rule})


def _is_num(v, types=(int, float)) -> bool:  # ints are finite (and may not fit a float)
    return isinstance(v, types) and not isinstance(v, bool) and (
        isinstance(v, int) or math.isfinite(v))


def _int(lo: int, hi: int, note: str = "") -> Rule:
    """An integer in [lo, hi]: every one bounded (see the upper bounds below)."""
    return (lambda v: _is_num(v, int) and lo <= v <= hi,
            f"must be an integer in [{lo}, {hi}]" + (f" ({note})" if note else ""))


def _num(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False,
         note: str = "") -> Rule:
    """A finite number in the interval (bounded: see the upper bounds below); ``lo_open`` /
    ``hi_open`` leave that end out."""
    ok = lambda v: _is_num(v) and (lo < v if lo_open else lo <= v) and (  # noqa: E731
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


def _one_of(*words: str) -> Rule:
    return (lambda v: v in words), "choose one of " + ", ".join(words)


def _writable_file(value, make_parents: bool) -> bool | str:
    """A file we may (over)write: not a folder, in a folder that exists (or can be made);
    an existing one must be a regular file. A pipe, socket or device is refused unopened:
    opening a pipe to write blocks until someone reads it, and the file we write replaces
    what is there (``output=/dev/null`` would remove the device)."""
    path = Path(value).expanduser()
    if path.is_dir():
        return f"{path} is a folder"
    if path.exists():
        if not path.is_file():
            return f"{path} is not a regular file: a pipe, socket or device"
        try:
            open(path, "a").close()  # appends nothing; fails where writing would
        except OSError as e:
            return f"cannot write {path}: {e.strerror}"
        return True
    if not make_parents and not path.parent.exists():
        return f"folder {path.parent} does not exist"
    return _creatable_folder(path.parent, write=True)


def _readable_file(value) -> bool | str:
    """A text file to read: a regular file, or a pipe (``input=<(command)``); never opened
    here. A device (``/dev/zero``) or socket is refused: it may never end."""
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


def _creatable_folder(value, write: bool = False) -> bool | str:
    """A folder that exists (and where we may ``write``), or whose nearest existing
    ancestor is a folder we may write in."""
    path = Path(value).expanduser()
    base = next(p for p in [path, *path.absolute().parents] if p.exists())
    if not base.is_dir():
        return f"{base} is a file"
    if base == path and not write:
        return True
    try:
        tempfile.TemporaryFile(dir=base).close()  # anonymous: leaves nothing behind
    except OSError as e:
        return f"cannot write in {base}: {e.strerror}"
    return True


def _attention(value) -> bool | str:
    path = Path(value).expanduser()
    if path.suffix.lower() in (".png", ".html"):
        return _writable_file(path, make_parents=True)
    if path.exists() and not path.is_dir():
        return f"{path} is an existing file that is not a .png or .html"
    return _creatable_folder(path, write=True)  # its maps are written into it


POSITIVE, COUNT = _int(1, MAX_COUNT), _int(0, MAX_COUNT)
SEED = _int(0, MAX_SEED, note="numpy's seeds are < 2**32")
BEAM = _int(1, MAX_BEAM, note="hypotheses kept per sentence")
BATCH_TOKENS = _int(1, MAX_BATCH_TOKENS, note="tokens per batch")
WIDTH = _int(1, MAX_WIDTH)
LAYERS = _int(1, MAX_LAYERS)
PROBABILITY = _num(0, 1, hi_open=True, note="a probability")
DEVICE: Rule = (lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
                "choose one of auto, cpu, cuda, cuda:N, mps")
FOLDER: Rule = (_creatable_folder, "must be a folder (or where one can be made), not a file")
TEXT_FILE: Rule = (_readable_file, "must be a text file to read (a regular file or a pipe)")
CKPT_FILE: Rule = (lambda v: _writable_file(v, make_parents=True),
                   "must be a checkpoint file to write (not a folder)")


# ----------------------------------------------------------------------------- schemas
@dataclass
class DataConfig:
    """Where the parallel corpus comes from, how it is cleaned and tokenized."""

    name: str = "builtin_zh_en"
    source: str = _r("builtin", _one_of("builtin", "hub", "text", "tsv"))
    path: str | None = None
    src_lang: str = "zh"
    tgt_lang: str = "en"
    reverse: bool = False
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str = "test"
    src_column: int = _r(1, _int(0, 10_000, note="0-based"))
    tgt_column: int = _r(0, _int(0, 10_000, note="0-based"))
    train_size: int = _r(200_000, _int(1, MAX_COUNT, note="pairs; every split needs some"))
    valid_size: int = _r(1000, _int(1, MAX_COUNT, note="pairs; every split needs some"))
    test_size: int = _r(1000, _int(1, MAX_COUNT, note="pairs; every split needs some"))
    split_seed: int = _r(1234, SEED)
    max_len: int = _r(128, _int(0, MAX_WIDTH, note="tokens; 0 = off"))
    max_len_ratio: float = _r(3.0, _num(0, 1000, note="0 = off"))
    vocab_size: int = _r(2000, _int(8, MAX_VOCAB))
    tokenizer_type: str = _r("bpe", _one_of("bpe", "unigram"))
    joint_vocab: bool = True
    character_coverage: float = _r(1.0, _num(0, 1, lo_open=True))
    cache_dir: str = _r("outputs/.cache", FOLDER)


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer sizes."""

    name: str = "tiny"
    d_model: int = _r(128, WIDTH)
    n_heads: int = _r(4, _int(1, MAX_HEADS))
    n_encoder_layers: int = _r(2, LAYERS)
    n_decoder_layers: int = _r(2, LAYERS)
    d_ff: int = _r(512, WIDTH)
    dropout: float = _r(0.0, PROBABILITY)
    attention_dropout: float = _r(0.0, PROBABILITY)
    activation: str = _r("relu", _one_of("relu", "gelu"))
    norm_first: bool = True
    positional: str = _r("sinusoidal", _one_of("sinusoidal", "learned"))
    max_positions: int = _r(256, _int(2, MAX_WIDTH, note="bos/eos and at least one token"))
    tie_embeddings: bool = True


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    name: str = "adamw"
    lr: float = _r(2e-3, _num(0, 10, lo_open=True))
    betas: list[float] = _r([0.9, 0.98], (
        lambda v: len(v) == 2 and all(_is_num(b) and 0 <= b < 1 for b in v),
        "must be two numbers in [0, 1), e.g. [0.9, 0.98]"))
    eps: float = _r(1e-9, _num(0, 1, lo_open=True))
    weight_decay: float = _r(0.0, _num(0, 10))
    schedule: str = _r("inverse_sqrt", _one_of("inverse_sqrt", "cosine", "constant"))
    warmup_steps: int = _r(100, COUNT)
    min_lr: float = _r(0.0, _num(0, 10))
    label_smoothing: float = _r(0.1, _num(0, 1, hi_open=True))
    clip_grad_norm: float = _r(1.0, _num(0, 1e6, note="0 = off"))
    fused: bool = True


@dataclass
class TrainerConfig:
    """The loop: budget, validation, checkpoints, logging, devices."""

    name: str = "default"
    device: str = _r("auto", DEVICE)
    precision: str = _r("auto", _one_of("auto", "fp32", "bf16"))
    compile: bool = False
    seed: int = _r(1, SEED)
    num_threads: int = _r(0, _int(0, MAX_THREADS, note="0 = torch's default"))
    max_tokens: int = _r(2048, BATCH_TOKENS)
    accumulate: int = _r(1, _int(1, MAX_ACCUMULATE, note="micro-batches per step"))
    max_steps: int = _r(2000, POSITIVE)
    max_epochs: int = _r(1000, POSITIVE)
    max_minutes: float = _r(3.0, _num(0, 10**6, note="about two years; 0 = no limit"))
    log_every: int = _r(50, POSITIVE)
    valid_every: int = _r(400, POSITIVE)
    valid_sentences: int = _r(300, _int(0, MAX_COUNT, note="0 = all"))
    valid_max_len_b: int = _r(10, _int(0, 10**6))
    patience: int = _r(0, _int(0, MAX_COUNT, note="0 = never stop early"))
    nan_policy: str = _r("stop", _one_of("stop", "skip"))
    keep_last: int = _r(1, POSITIVE)
    average_last: int = _r(0, _int(0, MAX_COUNT, note="0 = off"))
    test_beam: int = _r(5, BEAM)
    probe_sentences: list[str] = field(default_factory=list)
    n_probes: int = _r(1, _int(0, 1000))
    attention_images: bool = True
    n_text_samples: int = _r(3, _int(0, 1000))
    resume: str | None = None


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run_dir: str | None = _r(None, FOLDER)


@dataclass
class PrepareConfig:
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class DecodeConfig:
    beam: int = _r(1, _int(1, MAX_BEAM, note="1 = greedy"))
    len_penalty: float = _r(1.0, _num(-MAX_LEN_PENALTY, MAX_LEN_PENALTY,
                                      note="scores divide by length ** len_penalty"))
    max_len_a: float = _r(1.5, _num(0, 10_000))
    max_len_b: int = _r(10, _int(0, 10**6))
    nbest: int = _r(1, BEAM)
    batch_tokens: int = _r(4096, BATCH_TOKENS)
    beam_rule: str | None = _r(None, _one_of("shrink", "full"))  # None: the engine's own


@dataclass
class TranslateConfig:
    run: str = "latest"
    checkpoint: str = "best"
    input: str | None = _r(None, TEXT_FILE)
    output: str | None = _r(None, (lambda v: _writable_file(v, make_parents=False),
                                   "must be a file to write, in an existing writable folder"))
    ref: str | None = _r(None, TEXT_FILE)
    attention: str | None = _r(None, (_attention, "must be a .png file (one sentence), an .html file (the interactive view of every sentence) or a folder"))
    attention_kinds: list[str] = _r(["cross"], (
        lambda v: len(v) > 0 and all(k in ATTENTION_KINDS for k in v),
        "must be a non-empty list of " + ", ".join(ATTENTION_KINDS)))
    device: str = _r("auto", DEVICE)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    outputs_root: str = "outputs"
    engine: str = _r("torch", _one_of("torch", "ct2"))
    model_dir: str | None = None  # engine=ct2: a folder of scripts/export.py ("model" is a group)


@dataclass
class ExportConfig:
    run: str = "latest"
    checkpoint: str = "best"
    format: str = _r("ct2", _one_of("ct2"))
    quantization: str = _r("none", _one_of("none", "int8"))
    out: str | None = _r(None, (
        lambda v: "it exists" if Path(v).expanduser().exists() else _creatable_folder(v, True),
        "must be a new folder (an existing one is never overwritten)"))
    outputs_root: str = "outputs"


@dataclass
class AnalyzeConfig:
    run: str = "latest"
    checkpoint: str = "best"
    split: str = _r("valid", _one_of("valid", "test"))
    max_sentences: int = _r(500, _int(0, MAX_COUNT, note="0 = all"))
    pruning: bool = True
    prune_step: float = _r(0.1, _num(0, 1, lo_open=True, note="e.g. 0.1"))
    prune: float | None = _r(None, _num(0, 1, note="a fraction of the heads"))
    prune_output: str | None = _r(None, CKPT_FILE)
    device: str = _r("auto", DEVICE)
    batch_tokens: int = _r(4096, BATCH_TOKENS)
    outputs_root: str = "outputs"


@dataclass
class AverageConfig:
    run: str = "latest"
    last: int = _r(5, _int(2, MAX_COUNT, note="the newest N step checkpoints"))
    output: str | None = _r(None, CKPT_FILE)
    outputs_root: str = "outputs"


# ----------------------------------------------------------------------------- rule tables
def rules_of(schema, prefix: str = "") -> dict[str, Rule]:
    """``{dotted key: (check, what to tell the user)}`` of a schema, its groups included."""
    out: dict[str, Rule] = {}
    for f in fields(schema):
        if is_dataclass(f.default_factory):
            out.update(rules_of(f.default_factory, f"{prefix}{f.name}."))
        elif "rule" in f.metadata:
            out[prefix + f.name] = f.metadata["rule"]
    return out


TRAIN_RULES = rules_of(TrainConfig)
DATA_RULES = rules_of(DataConfig, "data.")
TRANSLATE_RULES = rules_of(TranslateConfig)
EXPORT_RULES = rules_of(ExportConfig)
ANALYZE_RULES = rules_of(AnalyzeConfig)
AVERAGE_RULES = rules_of(AverageConfig)

# (fine?, message: a format string of c, the config (DATA_CROSS: data), or a function of it)
Cross = tuple[Callable[[Any], bool], "str | Callable[[Any], str]"]
DATA_CROSS: list[Cross] = [
    (lambda c: c.source == "builtin" or bool(c.path),
     "data.source={c.source} needs data.path (it is not set)"),
    (lambda c: c.source != "builtin" or {c.src_lang, c.tgt_lang} == {"zh", "en"},
     "the built-in corpus is zh/en: data.src_lang={c.src_lang!r}, data.tgt_lang={c.tgt_lang!r}"
     " must be zh and en (data.reverse=true swaps them)"),
    (lambda c: c.source != "builtin"
     or c.train_size + c.valid_size + c.test_size <= MAX_BUILTIN_PAIRS,
     "data.train_size={c.train_size} + data.valid_size={c.valid_size} + data.test_size="
     f"{{c.test_size}}: the built-in corpus makes at most {MAX_BUILTIN_PAIRS:,} pairs"),
    (lambda c: c.src_lang != c.tgt_lang, "data.src_lang and data.tgt_lang are both {c.src_lang!r}"),
    (lambda c: c.source != "tsv" or c.src_column != c.tgt_column,
     "data.src_column and data.tgt_column are both {c.src_column}"),
]


def estimated_parameters(cfg) -> int:
    """An upper estimate of the numbers a training config's model allocates: every
    embedding table and the output projection (tied ones are made before they are tied),
    two position tables (sinusoidal ones are buffers, as large), the layers and norms."""
    m, d, f = cfg.model, cfg.model.d_model, cfg.model.d_ff
    encoder = 4 * d * d + 2 * d * f + 9 * d + f  # attention (q, k, v, out), FFN, 2 norms
    decoder = 8 * d * d + 2 * d * f + 15 * d + f  # self + cross attention, FFN, 3 norms
    return (3 * cfg.data.vocab_size * d + 2 * m.max_positions * d + 4 * d
            + m.n_encoder_layers * encoder + m.n_decoder_layers * decoder)


TRAIN_CROSS: list[Cross] = [
    (lambda c: c.model.d_model % c.model.n_heads == 0,  # as tinymt.model.check_model_args
     "model.d_model={c.model.d_model} is not divisible by model.n_heads={c.model.n_heads}"),
    (lambda c: estimated_parameters(c) <= MAX_PARAMETERS, lambda c: (
        f"the model would have about {estimated_parameters(c):,} parameters "
        f"(model.d_model={c.model.d_model}, model.d_ff={c.model.d_ff}, model.n_encoder_layers="
        f"{c.model.n_encoder_layers}, model.n_decoder_layers={c.model.n_decoder_layers}, "
        f"model.max_positions={c.model.max_positions}, data.vocab_size={c.data.vocab_size}); "
        f"at most {MAX_PARAMETERS:,} (about 16 GB to train): make it smaller")),
    (lambda c: c.optim.min_lr <= c.optim.lr,
     "optim.min_lr={c.optim.min_lr} is above optim.lr={c.optim.lr}"),
    (lambda c: c.trainer.max_tokens * c.trainer.test_beam <= MAX_BEAM_TOKENS,
     "trainer.test_beam={c.trainer.test_beam} x trainer.max_tokens={c.trainer.max_tokens} (the "
     "test set's batches): at most " + f"{MAX_BEAM_TOKENS:,}" + " hypothesis tokens a batch; "
     "lower one of them"),
    (lambda c: c.trainer.average_last <= max(c.trainer.keep_last, 1),
     "trainer.average_last={c.trainer.average_last} needs trainer.keep_last >= "
     "{c.trainer.average_last} (only the last keep_last step checkpoints are kept)"),
]
TRANSLATE_CROSS: list[Cross] = [
    (lambda c: c.decode.nbest <= c.decode.beam,
     "decode.beam={c.decode.beam}, decode.nbest={c.decode.nbest}: need 1 <= nbest <= beam"),
    (lambda c: c.decode.batch_tokens * c.decode.beam <= MAX_BEAM_TOKENS,
     "decode.beam={c.decode.beam} x decode.batch_tokens={c.decode.batch_tokens}: at most "
     f"{MAX_BEAM_TOKENS:,}" + " hypothesis tokens a batch; lower decode.batch_tokens"),
    (lambda c: c.decode.max_len_a > 0 or c.decode.max_len_b > 0,
     "decode.max_len_a=0 and decode.max_len_b=0 leave no room for a single output token"),
    (lambda c: c.engine != "ct2" or bool(c.model_dir),
     "engine=ct2 needs model_dir=<a folder written by scripts/export.py>"),
    (lambda c: c.engine == "ct2" or not c.model_dir, "model_dir={c.model_dir} is an exported "
     "model, read by engine=ct2: add engine=ct2 (or drop model_dir=)"),
    (lambda c: c.engine != "ct2" or not c.attention, "attention={c.attention}: attention maps "
     "are drawn by the PyTorch engine only; drop attention= or use engine=torch"),
    (lambda c: c.engine != "ct2" or c.decode.beam_rule != "shrink", "decode.beam_rule=shrink: "
     "CTranslate2 searches with beam_rule=full only; drop decode.beam_rule or use engine=torch"),
    (lambda c: c.engine != "ct2" or c.device != "mps",
     "device=mps: CTranslate2 runs on cpu or cuda (engine=ct2)"),
]
EXPORT_CROSS: list[Cross] = [(lambda c: bool(c.out), "out= is not set: name the new folder to "
                              "write the model to, e.g. out=exports/my-model")]


# ----------------------------------------------------------------------------- checking
def _apply(cfg, rules: Mapping[str, Rule], cross: list[Cross] = (), strip: str = "") -> None:
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


def check_data(cfg) -> None:
    """A ``data`` node alone (DictConfig or :class:`DataConfig`); messages say ``data.<key>``."""
    _apply(cfg, DATA_RULES, DATA_CROSS, strip="data.")


def check_train(cfg) -> None:
    """A whole training config (typed: pass it through :func:`as_train_config`)."""
    _apply(cfg, TRAIN_RULES)
    _apply(cfg.data, {}, DATA_CROSS)
    _apply(cfg, {}, TRAIN_CROSS)


def check_translate(cfg) -> None:
    _apply(cfg, TRANSLATE_RULES, TRANSLATE_CROSS)


def check_export(cfg) -> None:
    _apply(cfg, EXPORT_RULES, EXPORT_CROSS)


def check_analyze(cfg) -> None:
    _apply(cfg, ANALYZE_RULES)


def check_average(cfg) -> None:
    _apply(cfg, AVERAGE_RULES)


def as_train_config(cfg) -> DictConfig:
    """``cfg`` (dict / DictConfig / a run's saved config) merged onto :class:`TrainConfig`
    and checked. Unknown keys and wrong types are one-line errors naming the key."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
    except Exception as e:  # noqa: BLE001  (omegaconf's ValidationError / ConfigKeyError)
        key = getattr(e, "full_key", None)
        first = (str(e).strip() or type(e).__name__).splitlines()[0]
        raise TinyMTError(f"bad config: {key + ': ' if key else ''}{first}") from None
    extra = _unknown_keys(merged, TrainConfig)
    if extra:  # ``+trainer.foo=1``: Hydra may add keys the schema does not have
        raise TinyMTError(f"{extra[0]} is not a tinymt setting (a run holding it could not be "
                          "resumed): drop it; `python scripts/train.py --cfg job` lists the keys")
    check_train(merged)
    return merged


def _unknown_keys(cfg, schema, prefix: str = "") -> list[str]:
    """Dotted keys of ``cfg`` that ``schema`` (a dataclass, nested) does not define."""
    known = {f.name: f for f in fields(schema)}
    out = []
    for key in cfg:
        if key not in known:
            out.append(prefix + str(key))
        elif is_dataclass(known[key].default_factory) and isinstance(cfg[key], Mapping):
            out += _unknown_keys(cfg[key], known[key].default_factory, f"{prefix}{key}.")
    return out


# ----------------------------------------------------------------------------- Hydra
def _dirname(text: str, limit: int = 100) -> str:
    """A folder name from a sweep's overrides: no slashes, at most ``limit`` characters."""
    name = str(text).replace("/", "_") or "run"
    if len(name) > limit:
        name = f"{name[: limit - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


def register_configs() -> None:
    """Register the schemas (YAMLs name them first in their defaults lists) and three
    resolvers: ``${or_else:${a},b}`` is ``a`` unless it is null, else ``b``;
    ``${dirname:text}`` makes a safe, bounded folder name;
    ``${on_main_rank:a,b}`` is ``a`` on rank 0 (or without torchrun), else ``b``."""
    # under torchrun only rank 0 writes the run dir; the other ranks' Hydra gets a
    # scratch folder (the trainer hands every rank rank 0's run dir)
    rank0 = lambda main, other: main if int(os.environ.get("RANK", "0")) == 0 else other  # noqa: E731
    for name, fn in (("or_else", lambda a, b: b if a is None else a), ("dirname", _dirname),
                     ("on_main_rank", rank0)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    for name, node in (("train", TrainConfig), ("prepare", PrepareConfig),
                       ("translate", TranslateConfig), ("export", ExportConfig),
                       ("analyze", AnalyzeConfig), ("average", AverageConfig)):
        ConfigStore.instance().store(name=f"{name}_schema", node=node)


register_configs()
