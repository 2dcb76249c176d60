"""Typed config schemas (registered in Hydra's ConfigStore), what each value may be, and
the one loader of config files.

**Defaults** are those of the commented YAML in ``configs/``, repeated here because code
and tests build partial configs (``ModelConfig(d_model=16)``); ``tests/test_config.py``
proves both equal, key for key.

**Rules**: each field names the values it allows (``_r(default, rule)``; every number
bounded above by a ``MAX_*``; paths checked without opening them); :func:`rules_of` reads
them off a schema, ``*_CROSS`` are the rules between keys; a bad value is one ``TinyMTError`` line.
Scripts call ``as_train_config(cfg)`` or ``check_<command>(cfg)`` right after composition.

**Config files** (a run's ``config.yaml``): :func:`load_config_file`.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from tinymt.errors import TinyMTError, first_line
from tinymt.files import NAMED, name_problem, output_problem, path_problem, read_bytes

Check = Callable[[Any], "bool | str"]  # True = fine; False, or the reason, = not
Rule = tuple[Check, str]  # (check, what to tell the user)
# (fine?, message: a format string of c, the config (DATA_CROSS: data), or a function of it)
Cross = tuple[Callable[[Any], bool], "str | Callable[[Any], str]"]
MAX_CONFIG_BYTES = 1 << 20  # a run's config.yaml is about 1.5 kB
MAX_CONFIG_DEPTH = 32  # a run's config nests 3 deep
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the events only: no objects


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
# Every size a user gives is bounded: an absurd value (decode.beam=100000) is one error line
# before work starts, not an allocation error or a library's overflow after a whole run.
# Each bound lies far above what the shipped configs use, within what the libraries accept.
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


def path_rule(allowed: str, folder: bool | None = None, names: tuple[str, ...] = (),
              missing: str | None = None, pipe: bool = False) -> Rule:
    """A path to read, or one of ``names`` (:func:`tinymt.files.path_problem`: when it
    exists a folder, a file or either, ``pipe``: a FIFO too; never opened); a missing one
    is refused with ``missing``, else left to the command (it knows what was expected)."""
    return (lambda v: str(v) in names or name_problem(str(v)) or path_problem(
        Path(str(v)).expanduser(), folder, missing, pipe) or True), allowed


def creatable_folder(value) -> bool | str:
    """A folder that exists, or whose nearest existing ancestor is a folder we may write
    in; never blank, nor inside a run."""
    if why := name_problem(str(value)):
        return why
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        return f"{path} is a file"
    why = output_problem(path / "x", any_run=path.exists())
    return why.replace(f"{path / 'x'}", str(path)) if why else True


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
    return output_problem(attention_file(str(value))) or True  # a folder: maps go into it


POSITIVE, COUNT = integer(1, MAX_COUNT), integer(0, MAX_COUNT)
SEED = integer(0, MAX_SEED, note="numpy's seeds are < 2**32")
BEAM = integer(1, MAX_BEAM, note="hypotheses kept per sentence")
BATCH_TOKENS = integer(1, MAX_BATCH_TOKENS, note="tokens per batch")
WIDTH = integer(1, MAX_WIDTH)
LAYERS = integer(1, MAX_LAYERS)
PROBABILITY = number(0, 1, hi_open=True, note="a probability")
DEVICE: Rule = (lambda v: re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) is not None,
                "choose one of auto, cpu, cuda, cuda:N, mps")
PATH = path_rule("must name a file or folder")
RUN = path_rule("must be a run folder (or latest)", True, ("latest",))
DIR = path_rule("must be a folder", True)
CHECKPOINT = path_rule("must be best, last, avg, pruned or a checkpoint file", False, NAMED)
RUN_FOLDER = path_rule("must be the folder of a run to continue", True,
                       missing="{path} does not exist")
TEXT_FILE = path_rule("must be a text file to read (a regular file or a pipe)", False,
                      missing="file not found: {path}", pipe=True)
FOLDER: Rule = (creatable_folder, "must be a folder (or where one can be made), not a file")
CKPT_FILE: Rule = (lambda v: output_problem(v, any_run=True) or True,
                   "must be a checkpoint file to write (not a folder)")
NEW_FOLDER: Rule = (lambda v: output_problem(v, folder=True) or True,
                    "must be a new folder (an existing one is never overwritten)")


def owned_output(key: str) -> Cross:
    """``key`` (a checkpoint to write) may lie in a run only if it is the run ``run=``
    names (``run=latest``: checked once the run is found)."""
    def why(c):
        value = c.get(key) if isinstance(c, Mapping) else getattr(c, key)
        return None if value is None or c.run == "latest" else \
            output_problem(value, owner=c.run)
    return (lambda c: why(c) is None), (lambda c: f"{key}={c.get(key)}: {why(c)}")


# ----------------------------------------------------------------------------- on schemas
def _r(default, rule: Rule):
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


ATTENTION_KINDS = ("encoder_self", "decoder_self", "cross")  # = tinymt.model.KINDS (tested)


# ----------------------------------------------------------------------------- schemas
@dataclass
class DataConfig:
    """Where the parallel corpus comes from, how it is cleaned and tokenized."""

    name: str = "builtin_zh_en"
    source: str = _r("builtin", one_of("builtin", "hub", "text", "tsv"))
    path: str | None = _r(None, PATH)
    src_lang: str = "zh"
    tgt_lang: str = "en"
    reverse: bool = False
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str = "test"
    src_column: int = _r(1, integer(0, 10_000, note="0-based"))
    tgt_column: int = _r(0, integer(0, 10_000, note="0-based"))
    train_size: int = _r(200_000, integer(1, MAX_COUNT, note="pairs; every split needs some"))
    valid_size: int = _r(1000, integer(1, MAX_COUNT, note="pairs; every split needs some"))
    test_size: int = _r(1000, integer(1, MAX_COUNT, note="pairs; every split needs some"))
    split_seed: int = _r(1234, SEED)
    max_len: int = _r(128, integer(0, MAX_WIDTH, note="tokens; 0 = off"))
    max_len_ratio: float = _r(3.0, number(0, 1000, note="0 = off"))
    vocab_size: int = _r(2000, integer(8, MAX_VOCAB))
    tokenizer_type: str = _r("bpe", one_of("bpe", "unigram"))
    joint_vocab: bool = True
    character_coverage: float = _r(1.0, number(0, 1, lo_open=True))
    cache_dir: str = _r("outputs/.cache", FOLDER)
    sampling_alpha: float = _r(0.0, number(0, 1, hi_open=True, note="0 = off"))
    sampling_nbest_size: int = _r(16, integer(2, 64, note="unigram only"))


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer sizes."""

    name: str = "tiny"
    d_model: int = _r(128, WIDTH)
    n_heads: int = _r(4, integer(1, MAX_HEADS))
    n_encoder_layers: int = _r(3, LAYERS)
    n_decoder_layers: int = _r(2, LAYERS)
    d_ff: int = _r(512, WIDTH)
    dropout: float = _r(0.0, PROBABILITY)
    attention_dropout: float = _r(0.0, PROBABILITY)
    activation: str = _r("relu", one_of("relu", "gelu"))
    norm_first: bool = True
    positional: str = _r("sinusoidal", one_of("sinusoidal", "learned"))
    max_positions: int = _r(256, integer(2, MAX_WIDTH, note="bos/eos and at least one token"))
    tie_embeddings: bool = True


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    name: str = "adamw"
    lr: float = _r(3e-3, number(0, 10, lo_open=True))
    betas: list[float] = _r([0.9, 0.98], (
        lambda v: len(v) == 2 and all(is_number(b) and 0 <= b < 1 for b in v),
        "must be two numbers in [0, 1), e.g. [0.9, 0.98]"))
    eps: float = _r(1e-9, number(0, 1, lo_open=True))
    weight_decay: float = _r(0.0, number(0, 10))
    schedule: str = _r("cosine", one_of("inverse_sqrt", "cosine", "constant"))
    warmup_steps: int = _r(100, COUNT)
    min_lr: float = _r(0.0, number(0, 10))
    label_smoothing: float = _r(0.1, number(0, 1, hi_open=True))
    clip_grad_norm: float = _r(1.0, number(0, 1e6, note="0 = off"))
    fused: bool = True


@dataclass
class TrainerConfig:
    """The loop: budget, validation, checkpoints, logging, devices."""

    name: str = "default"
    device: str = _r("auto", DEVICE)
    precision: str = _r("auto", one_of("auto", "fp32", "bf16"))
    compile: bool = False
    seed: int = _r(1, SEED)
    num_threads: int = _r(0, integer(0, MAX_THREADS, note="0 = torch's default"))
    max_tokens: int = _r(2048, BATCH_TOKENS)
    accumulate: int = _r(1, integer(1, MAX_ACCUMULATE, note="micro-batches per step"))
    max_steps: int = _r(1200, POSITIVE)
    max_epochs: int = _r(1000, POSITIVE)
    max_minutes: float = _r(0.0, number(0, 10**6, note="about two years; 0 = no limit"))
    log_every: int = _r(50, POSITIVE)
    valid_every: int = _r(400, POSITIVE)
    valid_sentences: int = _r(300, integer(0, MAX_COUNT, note="0 = all"))
    valid_max_len_b: int = _r(10, integer(0, 10**6))
    patience: int = _r(0, integer(0, MAX_COUNT, note="0 = never stop early"))
    nan_policy: str = _r("stop", one_of("stop", "skip"))
    keep_last: int = _r(1, POSITIVE)
    average_last: int = _r(0, integer(0, MAX_COUNT, note="0 = off"))
    test_beam: int = _r(5, BEAM)
    probe_sentences: list[str] = field(default_factory=list)
    n_probes: int = _r(1, integer(0, 1000))
    probe_every: int = _r(50, integer(0, MAX_COUNT, note="0 = at validations only"))
    attention_images: bool = True
    n_text_samples: int = _r(3, integer(0, 1000))
    resume: str | None = _r(None, RUN_FOLDER)


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
    beam: int = _r(1, integer(1, MAX_BEAM, note="1 = greedy"))
    len_penalty: float = _r(1.0, number(-MAX_LEN_PENALTY, MAX_LEN_PENALTY,
                                      note="scores divide by length ** len_penalty"))
    max_len_a: float = _r(1.5, number(0, 10_000))
    max_len_b: int = _r(10, integer(0, 10**6))
    nbest: int = _r(1, BEAM)
    batch_tokens: int = _r(4096, BATCH_TOKENS)
    beam_rule: str | None = _r(None, one_of("shrink", "full"))  # None: the engine's own


@dataclass
class EngineConfig:
    """What translates (translate.py, serve.py): a run's checkpoint (``engine=torch``) or a
    model folder of scripts/export.py (``engine=ct2``), and how it searches."""

    run: str = _r("latest", RUN)
    checkpoint: str = _r("best", CHECKPOINT)
    device: str = _r("auto", DEVICE)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    outputs_root: str = _r("outputs", DIR)
    engine: str = _r("torch", one_of("torch", "ct2"))
    model_dir: str | None = _r(None, DIR)  # engine=ct2: a folder of scripts/export.py ("model" is a group)


@dataclass
class TranslateConfig(EngineConfig):
    input: str | None = _r(None, TEXT_FILE)
    output: str | None = _r(None, (lambda v: output_problem(v) or True, "must be a file to write"))
    ref: str | None = _r(None, TEXT_FILE)
    attention: str | None = _r(None, (attention_target, "must be a .png file (one sentence), an .html file (the interactive view of every sentence) or a folder"))
    attention_kinds: list[str] = _r(["cross"], (
        lambda v: len(v) > 0 and all(k in ATTENTION_KINDS for k in v),
        "must be a non-empty list of " + ", ".join(ATTENTION_KINDS)))


@dataclass
class ServeConfig(EngineConfig):
    """scripts/serve.py: the HTTP server (LibreTranslate's API, the page), its limits and
    its micro-batching."""

    host: str = _r("127.0.0.1", (lambda v: bool(str(v).strip()), "must be a host name or "
                                 "address, e.g. 127.0.0.1 (this machine) or 0.0.0.0 (all)"))
    port: int = _r(5000, integer(0, 65535, note="0 = any free port"))
    threads: int = _r(0, integer(0, MAX_THREADS, note="0 = every core"))
    api_keys: str | None = _r(None, TEXT_FILE)
    max_chars: int = _r(5000, integer(1, 1_000_000, note="characters per item"))
    max_items: int = _r(100, integer(1, 100_000, note="items per request"))
    max_body_bytes: int = _r(1_048_576, integer(1024, 1 << 30))
    batch_sentences: int = _r(64, integer(1, 100_000, note="1 = no micro-batching"))
    batch_wait_ms: float = _r(5.0, number(0, 60_000))
    max_queue: int = _r(4096, integer(1, MAX_COUNT, note="sentences"))
    timeout_s: float = _r(60.0, number(0, 86_400, lo_open=True))
    read_timeout_s: float = _r(10.0, number(0, 3600, lo_open=True))
    send_timeout_s: float = _r(20.0, number(0, 3600, lo_open=True))
    max_connections: int = _r(1000, integer(1, 1_000_000))
    attention_items: int = _r(8, integer(0, 1000, note="0 = no /attention, no page"))
    text: bool = True
    access_log: bool = False


@dataclass
class ExportConfig:
    run: str = _r("latest", RUN)
    checkpoint: str = _r("best", CHECKPOINT)
    format: str = _r("ct2", one_of("ct2"))
    quantization: str = _r("none", one_of("none", "int8"))
    out: str | None = _r(None, NEW_FOLDER)
    outputs_root: str = _r("outputs", DIR)


@dataclass
class AnalyzeConfig:
    run: str = _r("latest", RUN)
    checkpoint: str = _r("best", CHECKPOINT)
    split: str = _r("valid", one_of("valid", "test"))
    max_sentences: int = _r(500, integer(0, MAX_COUNT, note="0 = all"))
    pruning: bool = True
    prune_step: float = _r(0.1, number(0, 1, lo_open=True, note="e.g. 0.1"))
    prune: float | None = _r(None, number(0, 1, note="a fraction of the heads"))
    prune_output: str | None = _r(None, CKPT_FILE)
    device: str = _r("auto", DEVICE)
    batch_tokens: int = _r(4096, BATCH_TOKENS)
    outputs_root: str = _r("outputs", DIR)


@dataclass
class AverageConfig:
    run: str = _r("latest", RUN)
    last: int = _r(5, integer(2, MAX_COUNT, note="the newest N step checkpoints"))
    output: str | None = _r(None, CKPT_FILE)
    outputs_root: str = _r("outputs", DIR)


# ----------------------------------------------------------------------------- cross rules
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
ENGINE_CROSS: list[Cross] = [  # translate.py and serve.py alike
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
    (lambda c: c.engine != "ct2" or c.decode.beam_rule != "shrink", "decode.beam_rule=shrink: "
     "CTranslate2 searches with beam_rule=full only; drop decode.beam_rule or use engine=torch"),
    (lambda c: c.engine != "ct2" or c.device != "mps",
     "device=mps: CTranslate2 runs on cpu or cuda (engine=ct2)"),
]
TRANSLATE_CROSS: list[Cross] = [*ENGINE_CROSS, (
    lambda c: c.engine != "ct2" or not c.attention, "attention={c.attention}: attention maps "
    "are drawn by the PyTorch engine only; drop attention= or use engine=torch")]
SERVE_CROSS: list[Cross] = [*ENGINE_CROSS, (
    lambda c: c.decode.nbest == 1, "decode.nbest={c.decode.nbest}: the server's n-best lists "
    "come from each request's `alternatives`; drop decode.nbest")]
EXPORT_CROSS: list[Cross] = [(lambda c: bool(c.out), "out= is not set: name the new folder to "
                              "write the model to, e.g. out=exports/my-model")]


# ----------------------------------------------------------------------------- checking
def check_data(cfg) -> None:
    """A ``data`` node alone (DictConfig or :class:`DataConfig`); messages say ``data.<key>``."""
    apply_rules(cfg, rules_of(DataConfig, "data."), DATA_CROSS, strip="data.")


def check_train(cfg) -> None:
    """A whole training config (typed: pass it through :func:`as_train_config`)."""
    apply_rules(cfg, rules_of(TrainConfig))
    apply_rules(cfg.data, {}, DATA_CROSS)
    apply_rules(cfg, {}, TRAIN_CROSS)


def check_translate(cfg) -> None: apply_rules(cfg, rules_of(TranslateConfig), TRANSLATE_CROSS)  # noqa: E704
def check_serve(cfg) -> None: apply_rules(cfg, rules_of(ServeConfig), SERVE_CROSS)  # noqa: E704
def check_export(cfg) -> None: apply_rules(cfg, rules_of(ExportConfig), EXPORT_CROSS)  # noqa: E704
def check_analyze(cfg) -> None: apply_rules(cfg, rules_of(AnalyzeConfig), [owned_output("prune_output")])  # noqa: E704
def check_average(cfg) -> None: apply_rules(cfg, rules_of(AverageConfig), [owned_output("output")])  # noqa: E704


def as_train_config(cfg) -> DictConfig:
    """``cfg`` (dict / DictConfig / a run's saved config) merged onto :class:`TrainConfig`
    and checked. Unknown keys and wrong types are one-line errors naming the key."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg)
    except Exception as e:  # noqa: BLE001  (omegaconf's ValidationError / ConfigKeyError)
        key = getattr(e, "full_key", None)
        raise TinyMTError(f"bad config: {key + ': ' if key else ''}{first_line(e)}") from None
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


# ----------------------------------------------------------------------------- config files
def load_config_file(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` as a plain dict, or one line naming the file
    (as ``what``, e.g. "the run's config"): a regular file of at most
    :data:`MAX_CONFIG_BYTES`, UTF-8, whose YAML events are checked before anything is built
    (:func:`check_yaml_shape`), parsed by OmegaConf (no Python tags, no duplicate keys), its
    interpolations resolved."""
    data = read_bytes(path, what, MAX_CONFIG_BYTES)
    name = f"{what} {path}"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TinyMTError(f"{name} is not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise TinyMTError(f"{name} is empty")
    check_yaml_shape(text, name)
    try:
        cfg = OmegaConf.create(text)
    except Exception as e:  # noqa: BLE001  (yaml's errors, omegaconf's key/type errors)
        raise TinyMTError(f"{name} is not valid YAML ({yaml_why(e)})") from None
    if not isinstance(cfg, DictConfig):  # pragma: no cover - refused on its events
        raise TinyMTError(f"{name} does not hold a mapping of settings")
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # noqa: BLE001  (an interpolation that does not resolve)
        raise TinyMTError(f"{name}: a value does not resolve ({first_line(e)})") from None


def check_yaml_shape(text: str, name: str, max_depth: int = MAX_CONFIG_DEPTH) -> None:
    """YAML ``text`` that parses, holds a mapping, is nested at most ``max_depth`` deep and
    has no aliases (``&a [*a, *a]`` repeated would expand past memory): checked on the
    parser's events, so such a document is refused before it costs stack or memory."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if depth == 0 and isinstance(event, yaml.NodeEvent) and not isinstance(
                    event, yaml.MappingStartEvent):  # the top node
                found = "a list" if isinstance(event, yaml.SequenceStartEvent) else "one value"
                raise TinyMTError(f"{name} does not hold a mapping of settings (found {found})")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > max_depth:
                    raise TinyMTError(f"{name} is nested deeper than {max_depth} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                raise TinyMTError(f"{name} uses a YAML alias (*{event.anchor}): not a file "
                                  "tinymt wrote")
    except yaml.YAMLError as e:
        raise TinyMTError(f"{name} is not valid YAML ({yaml_why(e)})") from None


def yaml_why(e: Exception) -> str:
    """A YAML error in one line: its problem and where (the first line of others)."""
    problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)
    if problem and mark is not None:
        return f"{first_line(problem)} at line {mark.line + 1}, column {mark.column + 1}"
    return first_line(e)


# ----------------------------------------------------------------------------- Hydra
def _dirname(text: str, limit: int = 100) -> str:
    """A folder name from a sweep's overrides: no slashes, at most ``limit`` characters."""
    name = str(text).replace("/", "_") or "run"
    if len(name) > limit:
        name = f"{name[: limit - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


def register_configs() -> None:
    """Register the schemas (the YAMLs' defaults lists name them) and the resolvers:
    ``${or_else:${a},b}`` (``a`` unless null), ``${dirname:text}`` (a safe folder name),
    ``${on_main_rank:a,b}`` (``a`` on rank 0: the other ranks' Hydra gets a scratch
    folder), ``${unless_named:resume,run_dir,clock}`` ("." when a folder is named)."""
    rank0 = lambda main, other: main if int(os.environ.get("RANK", "0")) == 0 else other  # noqa: E731
    for name, fn in (("or_else", lambda a, b: b if a is None else a), ("dirname", _dirname),
                     ("on_main_rank", rank0),  # Hydra makes only a clock folder itself:
                     ("unless_named", lambda r, d, c: "." if r is not None or d is not None else c)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    for name, node in (("train", TrainConfig), ("prepare", PrepareConfig),
                       ("translate", TranslateConfig), ("serve", ServeConfig),
                       ("export", ExportConfig), ("analyze", AnalyzeConfig),
                       ("average", AverageConfig)):
        ConfigStore.instance().store(name=f"{name}_schema", node=node)


register_configs()
