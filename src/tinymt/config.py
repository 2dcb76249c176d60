"""Typed config schemas (registered in Hydra's ConfigStore), what each value may be, and
the one loader of config files.

**Defaults** are those of the commented YAML in ``configs/``, repeated here because code
and tests build partial configs (``ModelConfig(d_model=16)``); ``tests/test_config.py``
proves both equal, key for key.

**Values**: OmegaConf checks each field's type (``model.d_model=wide`` is refused while
Hydra composes). What a value may be beyond its type is written beside its field
(``_r(default, allowed)``: an interval, a tuple of words, or a path check); the
``check_<command>`` functions apply those and the rules between keys (plain ``if``
statements); a bad value is one ``TinyMTError`` line naming its key. Scripts call
``as_train_config(cfg)`` or ``check_<command>(cfg)`` right after composition.

**Config files** (a run's ``config.yaml``): :func:`load_config_file`.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from tinymt import KINDS
from tinymt.errors import TinyMTError, first_line
from tinymt.files import NAMED, name_problem, output_problem, path_problem, read_bytes

Why = Callable[[Any], "str | None"]  # a value's check: why it is not allowed, None = fine
MAX_CONFIG_BYTES = 1 << 20  # a run's config.yaml is about 1.5 kB

# ----------------------------------------------------------------------------- upper bounds
# Where an absurd value (decode.beam=100000) would cost unbounded work or memory before
# anything fails, or a library would refuse it without naming the key, it is one error line
# before work starts. Each bound lies far above what the shipped configs use.
MAX_COUNT = 10**9  # steps, epochs, sentences, pairs, budgets: more than any run here makes
MAX_THREADS = 1024  # torch.set_num_threads: more than the cores of any one machine
MAX_BEAM = 256  # hypotheses per sentence (beam, nbest, test_beam): 5 is usual
MAX_BATCH_TOKENS = 2**18  # tokens per batch: 64x the shipped 4096
MAX_ACCUMULATE = 1024  # micro-batches per optimizer step, held in memory together
MAX_BEAM_TOKENS = 2**20  # batch tokens x beam: one beam-search batch's hypotheses (4096 x 256)
MAX_WIDTH = 2**16  # model.d_model, model.d_ff, model.max_positions, data.max_len (tokens)
MAX_LAYERS = 256  # encoder or decoder layers
MAX_VOCAB = 2**20  # sentencepiece pieces per vocabulary
MAX_PARAMETERS = 10**9  # a model's estimated size: ~16 GB to train in fp32 (AdamW: 4 copies)
MAX_BUILTIN_PAIRS = 2_000_000  # the built-in corpus: 10x its default, ~1.5 min to generate


# ----------------------------------------------------------------------------- what a value may be
def between(lo, hi, note: str = "", lo_open: bool = False, hi_open: bool = False) -> Why:
    """A number in [lo, hi] (``lo_open`` / ``hi_open`` leave that end out). OmegaConf has
    checked its type; the comparisons refuse nan, and ``hi`` (finite) infinities."""
    text = (f"must be in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
            + (f" ({note})" if note else ""))
    return lambda v: None if (lo < v if lo_open else lo <= v) and (
        v < hi if hi_open else v <= hi) else text


def path_rule(allowed: str, folder: bool | None = None, names: tuple[str, ...] = (),
              missing: str | None = None, pipe: bool = False) -> Why:
    """A path to read, or one of ``names`` (:func:`tinymt.files.path_problem`: when it
    exists a folder, a file or either, ``pipe``: a FIFO too; never opened); a missing one
    is refused with ``missing``, else left to the command (it knows what was expected)."""
    def why(v) -> str | None:
        if str(v) in names:
            return None
        problem = name_problem(str(v)) or path_problem(Path(str(v)).expanduser(), folder,
                                                       missing, pipe)
        return problem and f"{allowed} ({problem})"
    return why


def creatable_folder(value) -> str | None:
    """A folder that exists (a read-only one too: a cache hit writes nothing, and a write
    there fails in one line), or one that can be made; never blank."""
    why = name_problem(str(value)) or (None if Path(str(value)).expanduser().is_dir() else
                                       output_problem(os.path.join(str(value), "x")))
    return why and f"must be a folder, or where one can be made ({why})"


def attention_file(attention: str | None) -> str | None:
    """The file ``attention=`` writes first: itself (``.png``, ``.html``), or the first
    PNG of the folder it names (a blank name: itself, refused as a name)."""
    if not (attention or "").strip() or Path(attention).suffix.lower() in (".png", ".html"):
        return attention
    return str(Path(attention) / "line1.png")


POSITIVE, COUNT = between(1, MAX_COUNT), between(0, MAX_COUNT)
SEED = between(0, 2**32 - 1, note="numpy's seeds are < 2**32")
BEAM = between(1, MAX_BEAM, note="hypotheses kept per sentence")
BATCH_TOKENS = between(1, MAX_BATCH_TOKENS, note="tokens per batch")
WIDTH, LAYERS = between(1, MAX_WIDTH), between(1, MAX_LAYERS)
PROBABILITY = between(0, 1, hi_open=True, note="a probability")
DEVICE: Why = lambda v: None if re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", v) else (  # noqa: E731
    "choose one of auto, cpu, cuda, cuda:N, mps")
PATH = path_rule("must name a file or folder")
RUN = path_rule("must be a run folder (or latest)", True, ("latest",))
DIR = path_rule("must be a folder", True)
CHECKPOINT = path_rule("must be best, last, avg, pruned or a checkpoint file", False, NAMED)
TEXT_FILE = path_rule("must be a text file to read (a regular file or a pipe)", False,
                      missing="file not found: {path}", pipe=True)
FOLDER: Why = creatable_folder


def _r(default, allowed: Why | tuple[str, ...]):
    """A schema field: its default (= the YAML's, tested) and the values it allows: a check
    (why a value is not allowed, or None) or a tuple of words to choose from."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"allowed": allowed})
    return field(default=default, metadata={"allowed": allowed})


def allowed_values(schema, prefix: str = "") -> dict[str, Why | tuple[str, ...]]:
    """``{dotted key: what it allows}`` of a schema, its groups included."""
    out: dict[str, Any] = {}
    for f in fields(schema):
        if is_dataclass(f.default_factory):
            out.update(allowed_values(f.default_factory, f"{prefix}{f.name}."))
        elif "allowed" in f.metadata:
            out[prefix + f.name] = f.metadata["allowed"]
    return out


def _extra_key(cfg, schema, prefix: str = "") -> tuple[str, str] | None:
    """The first key of ``cfg`` that ``schema`` has not (Hydra's ``+key=``), and where."""
    known = {f.name: f.default_factory for f in fields(schema)}
    for key in cfg:
        if key not in known:
            return prefix + key, schema.__name__
        if is_dataclass(known[key]) and OmegaConf.is_dict(cfg[key]) and \
                (extra := _extra_key(cfg[key], known[key], f"{prefix}{key}.")):
            return extra
    return None


def check_values(cfg, schema, prefix: str = "") -> None:
    """Every key of ``cfg`` (a DictConfig of ``schema``) against what its field allows
    (None, unset, always is): the first that is not is one line ``<prefix><key>=<value>:
    <what it may be>``; a key ``schema`` has not (Hydra's ``+key=``) is one line too."""
    if extra := _extra_key(cfg, schema):
        raise TinyMTError(f"{prefix}{extra[0]}: no such key in {extra[1]} (a typo?)")
    for key, allowed in allowed_values(schema).items():
        value = OmegaConf.select(cfg, key)
        if value is None:
            continue
        why = allowed(value) if callable(allowed) else None if value in allowed else \
            "choose one of " + ", ".join(allowed)
        if why:
            shown = list(value) if OmegaConf.is_list(value) else value
            raise TinyMTError(f"{prefix}{key}={shown!r}: {why}")


# ----------------------------------------------------------------------------- schemas
@dataclass
class DataConfig:
    """Where the parallel corpus comes from, how it is cleaned and tokenized."""

    name: str = "builtin_zh_en"
    source: str = _r("builtin", ("builtin", "hub", "text", "tsv"))
    path: str | None = _r(None, PATH)
    src_lang: str = "zh"
    tgt_lang: str = "en"
    reverse: bool = False
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str = "test"
    src_column: int = _r(1, between(0, 10_000, note="0-based"))
    tgt_column: int = _r(0, between(0, 10_000, note="0-based"))
    train_size: int = _r(200_000, between(1, MAX_COUNT, note="pairs; every split needs some"))
    valid_size: int = _r(1000, between(1, MAX_COUNT, note="pairs; every split needs some"))
    test_size: int = _r(1000, between(1, MAX_COUNT, note="pairs; every split needs some"))
    split_seed: int = _r(1234, SEED)
    max_len: int = _r(128, between(0, MAX_WIDTH, note="tokens; 0 = off"))
    max_len_ratio: float = _r(3.0, between(0, 1000, note="0 = off"))
    vocab_size: int = _r(2000, between(8, MAX_VOCAB))
    tokenizer_type: str = _r("bpe", ("bpe", "unigram"))
    joint_vocab: bool = True
    character_coverage: float = _r(1.0, between(0, 1, lo_open=True))
    cache_dir: str = _r("outputs/.cache", FOLDER)
    sampling_alpha: float = _r(0.0, between(0, 1, hi_open=True, note="0 = off"))
    sampling_nbest_size: int = _r(16, between(2, 64, note="unigram only"))


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer sizes."""

    name: str = "tiny"
    d_model: int = _r(128, WIDTH)
    n_heads: int = _r(4, between(1, MAX_WIDTH, note="model.d_model must divide by it"))
    n_encoder_layers: int = _r(3, LAYERS)
    n_decoder_layers: int = _r(2, LAYERS)
    d_ff: int = _r(512, WIDTH)
    dropout: float = _r(0.0, PROBABILITY)
    attention_dropout: float = _r(0.0, PROBABILITY)
    activation: str = _r("relu", ("relu", "gelu"))
    norm_first: bool = True
    positional: str = _r("sinusoidal", ("sinusoidal", "learned"))
    max_positions: int = _r(256, between(2, MAX_WIDTH, note="bos/eos and at least one token"))
    tie_embeddings: bool = True


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    name: str = "adamw"
    lr: float = _r(3e-3, between(0, 10, lo_open=True))
    betas: list[float] = _r([0.9, 0.98], lambda v: None if len(v) == 2 and all(
        0 <= b < 1 for b in v) else "must be two numbers in [0, 1), e.g. [0.9, 0.98]")
    eps: float = _r(1e-9, between(0, 1, lo_open=True))
    weight_decay: float = _r(0.0, between(0, 10))
    schedule: str = _r("cosine", ("inverse_sqrt", "cosine", "constant"))
    warmup_steps: int = _r(100, COUNT)
    min_lr: float = _r(0.0, between(0, 10))
    label_smoothing: float = _r(0.1, between(0, 1, hi_open=True))
    clip_grad_norm: float = _r(1.0, between(0, 1e6, note="0 = off"))
    fused: bool = True


@dataclass
class TrainerConfig:
    """The loop: budget, validation, checkpoints, logging, devices."""

    name: str = "default"
    device: str = _r("auto", DEVICE)
    precision: str = _r("auto", ("auto", "fp32", "bf16"))
    compile: bool = False
    seed: int = _r(1, SEED)
    num_threads: int = _r(0, between(0, MAX_THREADS, note="0 = the cores left idle"))
    max_tokens: int = _r(2048, BATCH_TOKENS)
    accumulate: int = _r(1, between(1, MAX_ACCUMULATE, note="micro-batches per step"))
    max_steps: int = _r(1200, POSITIVE)
    max_epochs: int = _r(1000, POSITIVE)
    max_minutes: float = _r(0.0, between(0, 10**6, note="about two years; 0 = no limit"))
    log_every: int = _r(50, POSITIVE)
    valid_every: int = _r(400, POSITIVE)
    valid_sentences: int = _r(300, between(0, MAX_COUNT, note="0 = all"))
    valid_max_len_b: int = _r(10, between(0, 10**6))
    patience: int = _r(0, between(0, MAX_COUNT, note="0 = never stop early"))
    nan_policy: str = _r("stop", ("stop", "skip"))
    keep_last: int = _r(1, POSITIVE)
    average_last: int = _r(0, between(0, MAX_COUNT, note="0 = off"))
    test_beam: int = _r(5, BEAM)
    probe_sentences: list[str] = field(default_factory=list)
    n_probes: int = _r(1, between(0, 1000))
    probe_every: int = _r(50, between(0, MAX_COUNT, note="0 = at validations only"))
    attention_images: bool = True
    n_text_samples: int = _r(3, between(0, 1000))
    resume: str | None = _r(None, DIR)


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
    beam: int = _r(1, between(1, MAX_BEAM, note="1 = greedy"))
    len_penalty: float = _r(1.0, between(-10, 10, note="scores divide by length ** len_penalty"))
    max_len_a: float = _r(1.5, between(0, 10_000))
    max_len_b: int = _r(10, between(0, 10**6))
    nbest: int = _r(1, BEAM)
    batch_tokens: int = _r(0, between(0, MAX_BATCH_TOKENS, note="0 = by device"))
    beam_rule: str | None = _r(None, ("shrink", "full"))  # None: the engine's own


@dataclass
class EngineConfig:
    """What translates (translate.py, serve.py): a run's checkpoint (``engine=torch``) or a
    model folder of scripts/export.py (``engine=ct2``), and how it searches."""

    run: str = _r("latest", RUN)
    checkpoint: str = _r("best", CHECKPOINT)
    device: str = _r("auto", DEVICE)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    outputs_root: str = _r("outputs", DIR)
    engine: str = _r("torch", ("torch", "ct2"))
    model_dir: str | None = _r(None, DIR)  # engine=ct2: a folder of scripts/export.py ("model" is a group)


@dataclass
class TranslateConfig(EngineConfig):
    input: str | None = _r(None, TEXT_FILE)
    output: str | None = None  # checked by the command (tinymt.files.check_outputs)
    ref: str | None = _r(None, TEXT_FILE)
    attention: str | None = None  # a .png, an .html or a folder; checked with output=
    attention_kinds: list[str] = _r(["cross"], lambda v: None if len(v) > 0 and all(
        k in KINDS for k in v) else "must be a non-empty list of " + ", ".join(KINDS))


@dataclass
class ServeConfig(EngineConfig):
    """scripts/serve.py: the HTTP server (LibreTranslate's API, the page), its limits and
    its micro-batching."""

    host: str = _r("127.0.0.1", lambda v: None if v.strip() else "must be a host name or "
                   "address, e.g. 127.0.0.1 (this machine) or 0.0.0.0 (all)")
    port: int = _r(5000, between(0, 65535, note="0 = any free port"))
    threads: int = _r(0, between(0, MAX_THREADS, note="0 = every core"))
    api_keys: str | None = _r(None, TEXT_FILE)
    max_chars: int = _r(5000, between(1, 1_000_000, note="characters per item"))
    max_items: int = _r(100, between(1, 100_000, note="items per request"))
    max_body_bytes: int = _r(1_048_576, between(1024, 1 << 30))
    batch_sentences: int = _r(64, between(1, 100_000, note="1 = no micro-batching"))
    batch_wait_ms: float = _r(5.0, between(0, 60_000))
    max_queue: int = _r(4096, between(1, MAX_COUNT, note="sentences"))
    timeout_s: float = _r(60.0, between(0, 86_400, lo_open=True))
    read_timeout_s: float = _r(10.0, between(0, 3600, lo_open=True))
    send_timeout_s: float = _r(20.0, between(0, 3600, lo_open=True))
    max_connections: int = _r(1000, between(1, 1_000_000))
    attention_items: int = _r(8, between(0, 1000, note="0 = no /attention, no page"))
    text: bool = True
    access_log: bool = False


@dataclass
class ExportConfig:
    run: str = _r("latest", RUN)
    checkpoint: str = _r("best", CHECKPOINT)
    quantization: str = _r("none", ("none", "int8"))
    out: str | None = None  # a new folder, checked by the command (tinymt.files.check_output)
    outputs_root: str = _r("outputs", DIR)


@dataclass
class AnalyzeConfig:
    run: str = _r("latest", RUN)
    checkpoint: str = _r("best", CHECKPOINT)
    split: str = _r("valid", ("valid", "test"))
    max_sentences: int = _r(500, between(0, MAX_COUNT, note="0 = all"))
    pruning: bool = True
    prune_step: float = _r(0.1, between(0, 1, lo_open=True, note="e.g. 0.1"))
    prune: float | None = _r(None, between(0, 1, note="a fraction of the heads"))
    prune_output: str | None = None  # checked by the command (tinymt.files.check_output)
    device: str = _r("auto", DEVICE)
    batch_tokens: int = _r(4096, BATCH_TOKENS)
    cache_dir: str | None = _r(None, FOLDER)  # None: the run's own data.cache_dir
    outputs_root: str = _r("outputs", DIR)


@dataclass
class AverageConfig:
    run: str = _r("latest", RUN)
    last: int = _r(5, between(2, MAX_COUNT, note="the newest N step checkpoints"))
    output: str | None = None  # checked by the command (tinymt.files.check_output)
    outputs_root: str = _r("outputs", DIR)


# ----------------------------------------------------------------------------- checking
def estimated_parameters(cfg) -> int:
    """An upper estimate of the numbers a training config's model allocates: every
    embedding table and the output projection (tied ones are made before they are tied),
    two position tables (sinusoidal ones are buffers, as large), the layers and norms."""
    m, d, f = cfg.model, cfg.model.d_model, cfg.model.d_ff
    encoder = 4 * d * d + 2 * d * f + 9 * d + f  # attention (q, k, v, out), FFN, 2 norms
    decoder = 8 * d * d + 2 * d * f + 15 * d + f  # self + cross attention, FFN, 3 norms
    return (3 * cfg.data.vocab_size * d + 2 * m.max_positions * d + 4 * d
            + m.n_encoder_layers * encoder + m.n_decoder_layers * decoder)


def check_data(cfg) -> None:
    """A ``data`` node alone (DictConfig or :class:`DataConfig`); messages say ``data.<key>``."""
    c = OmegaConf.structured(cfg) if is_dataclass(cfg) else cfg
    check_values(c, DataConfig, "data.")
    if c.source != "builtin" and not c.path:
        raise TinyMTError(f"data.source={c.source} needs data.path (it is not set)")
    if c.source == "builtin" and {c.src_lang, c.tgt_lang} != {"zh", "en"}:
        raise TinyMTError(f"the built-in corpus is zh/en: data.src_lang={c.src_lang!r}, "
                          f"data.tgt_lang={c.tgt_lang!r} must be zh and en (data.reverse=true "
                          "swaps them)")
    if c.source == "builtin" and c.train_size + c.valid_size + c.test_size > MAX_BUILTIN_PAIRS:
        raise TinyMTError(f"data.train_size={c.train_size} + data.valid_size={c.valid_size} + "
                          f"data.test_size={c.test_size}: the built-in corpus makes at most "
                          f"{MAX_BUILTIN_PAIRS:,} pairs")


def check_model(cfg) -> None:
    """The model of a training config (``cfg.model``, ``cfg.data.vocab_size``; typed): its
    sizes, heads dividing ``d_model``, at most :data:`MAX_PARAMETERS` parameters."""
    m = cfg.model
    check_values(m, ModelConfig, "model.")
    if m.d_model % m.n_heads:  # the attention splits d_model into n_heads equal parts
        raise TinyMTError(f"model.d_model={m.d_model} is not divisible by model.n_heads="
                          f"{m.n_heads}")
    if (n := estimated_parameters(cfg)) > MAX_PARAMETERS:
        raise TinyMTError(
            f"the model would have about {n:,} parameters (model.d_model={m.d_model}, "
            f"model.d_ff={m.d_ff}, model.n_encoder_layers={m.n_encoder_layers}, "
            f"model.n_decoder_layers={m.n_decoder_layers}, model.max_positions="
            f"{m.max_positions}, data.vocab_size={cfg.data.vocab_size}); at most "
            f"{MAX_PARAMETERS:,} (about 16 GB to train): make it smaller")


def check_train(cfg) -> None:
    """A whole training config (typed: pass it through :func:`as_train_config`)."""
    check_values(cfg, TrainConfig)
    check_data(cfg.data)
    check_model(cfg)
    t = cfg.trainer
    if t.max_tokens * t.test_beam > MAX_BEAM_TOKENS:
        raise TinyMTError(f"trainer.test_beam={t.test_beam} x trainer.max_tokens={t.max_tokens}"
                          f" (the test set's batches): at most {MAX_BEAM_TOKENS:,} hypothesis "
                          "tokens a batch; lower one of them")
    if t.average_last > max(t.keep_last, 1):
        raise TinyMTError(f"trainer.average_last={t.average_last} needs trainer.keep_last >= "
                          f"{t.average_last} (only the last keep_last step checkpoints are kept)")


def _check_engine(c, schema) -> None:
    """translate.py's and serve.py's config alike: what translates, and how it searches."""
    check_values(c, schema)
    d, ct2 = c.decode, c.engine == "ct2"
    if d.batch_tokens * d.beam > MAX_BEAM_TOKENS:
        raise TinyMTError(f"decode.beam={d.beam} x decode.batch_tokens={d.batch_tokens}: at most "
                          f"{MAX_BEAM_TOKENS:,} hypothesis tokens a batch; lower decode.batch_tokens")
    if ct2 and not c.model_dir:
        raise TinyMTError("engine=ct2 needs model_dir=<a folder written by scripts/export.py>")
    if not ct2 and c.model_dir:
        raise TinyMTError(f"model_dir={c.model_dir} is an exported model, read by engine=ct2: "
                          "add engine=ct2 (or drop model_dir=)")
    if d.nbest > d.beam:
        raise TinyMTError(f"decode.nbest={d.nbest}: an n-best list is the best of the beam's "
                          f"hypotheses, at most decode.beam={d.beam}; raise decode.beam")
    if ct2 and d.beam_rule == "shrink":
        raise TinyMTError("decode.beam_rule=shrink: CTranslate2 searches with beam_rule=full "
                          "only; drop decode.beam_rule or use engine=torch")


def check_translate(cfg) -> None:
    _check_engine(cfg, TranslateConfig)
    if cfg.engine == "ct2" and cfg.attention:
        raise TinyMTError(f"attention={cfg.attention}: attention maps are drawn by the PyTorch "
                          "engine only; drop attention= or use engine=torch")


def check_serve(cfg) -> None:
    _check_engine(cfg, ServeConfig)
    if cfg.decode.nbest != 1:
        raise TinyMTError(f"decode.nbest={cfg.decode.nbest}: the server's n-best lists come "
                          "from each request's `alternatives`; drop decode.nbest")


def check_export(cfg) -> None: check_values(cfg, ExportConfig)  # noqa: E704
def check_analyze(cfg) -> None: check_values(cfg, AnalyzeConfig)  # noqa: E704
def check_average(cfg) -> None: check_values(cfg, AverageConfig)  # noqa: E704


def as_typed(schema, cfg, what: str = "bad config") -> DictConfig:
    """``cfg`` (dict / DictConfig) merged onto ``schema``: an unknown key (Hydra's
    ``+trainer.foo=1`` too: merged as plain values) or a wrong type is one line naming the key."""
    try:
        plain = OmegaConf.to_container(cfg) if OmegaConf.is_config(cfg) else cfg
        merged = OmegaConf.merge(OmegaConf.structured(schema), plain)
    except Exception as e:  # noqa: BLE001  (omegaconf's ValidationError / ConfigKeyError)
        key = getattr(e, "full_key", None)
        raise TinyMTError(f"{what}: {key + ': ' if key else ''}{first_line(e)}") from None
    return merged


def as_train_config(cfg) -> DictConfig:
    """``cfg`` (dict / DictConfig / a run's saved config) merged onto :class:`TrainConfig`
    and checked. Unknown keys and wrong types are one-line errors naming the key."""
    merged = as_typed(TrainConfig, cfg)
    check_train(merged)
    return merged


def as_model_config(values, vocab_size: int) -> DictConfig:
    """A checkpoint's ``model_config`` (a dict) typed as :class:`ModelConfig` and checked
    as a training config's model with that vocabulary (:func:`check_model`): before any
    tensor of that size is made. A bad one is one line naming the key."""
    model = as_typed(ModelConfig, values, "bad model_config")
    check_model(OmegaConf.create({"model": model, "data": {"vocab_size": vocab_size}}))
    return model


# ----------------------------------------------------------------------------- config files
class _NoAliases(yaml.SafeLoader):
    """PyYAML's safe loader (no Python objects), in pure Python: its recursive composer
    bounds the nesting (RecursionError); an alias (``&a [*a, *a]`` repeated expands past
    memory once copied) is refused."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"an alias (*{event.anchor}): not "
                                              "a file tinymt wrote", event.start_mark)
        return super().compose_node(parent, index)


def load_config_file(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` as a plain dict, or one line naming the file
    (as ``what``, e.g. "the run's config"): a regular file of at most
    :data:`MAX_CONFIG_BYTES`, UTF-8, composed without aliases (:class:`_NoAliases`) before
    OmegaConf parses it (no Python tags, no duplicate keys), its interpolations resolved."""
    data = read_bytes(path, what, MAX_CONFIG_BYTES)
    name = f"{what} {path}"
    if not data.strip():
        raise TinyMTError(f"{name} is empty")
    try:  # UTF-8, yaml's errors, RecursionError, omegaconf's (an interpolation that fails)
        text = data.decode("utf-8")
        mapping = isinstance(yaml.compose(text, Loader=_NoAliases), yaml.MappingNode)
        values = OmegaConf.to_container(OmegaConf.create(text), resolve=True) if mapping else None
    except Exception as e:  # noqa: BLE001
        problem, mark = getattr(e, "problem", None), getattr(e, "problem_mark", None)  # YAML's
        why = (f"{first_line(problem)} at line {mark.line + 1}, column {mark.column + 1}"
               if problem and mark is not None else first_line(e))
        raise TinyMTError(f"{name} is not valid YAML ({why})") from None
    if values is None:
        raise TinyMTError(f"{name} does not hold a mapping of settings")
    return values


# ----------------------------------------------------------------------------- Hydra
def _dirname(text: str, limit: int = 100) -> str:
    """A folder name from a sweep's overrides: no slashes, at most ``limit`` characters."""
    name = str(text).replace("/", "_") or "run"
    if len(name) > limit:
        name = f"{name[: limit - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


def register_configs() -> None:
    """Register the schemas (the YAMLs' defaults lists name them) and the resolvers:
    ``${dirname:text}`` (a safe folder name), ``${on_main_rank:a,b}`` (``a`` on rank 0:
    the other ranks' Hydra gets a scratch folder), ``${unless_named:resume,run_dir,clock}``
    ("." when a folder is named)."""
    rank0 = lambda main, other: main if int(os.environ.get("RANK", "0")) == 0 else other  # noqa: E731
    for name, fn in (("dirname", _dirname),
                     ("on_main_rank", rank0),  # Hydra makes only a clock folder itself:
                     ("unless_named", lambda r, d, c: "." if r is not None or d is not None else c)):
        OmegaConf.register_new_resolver(name, fn, replace=True)
    for name, node in (("train", TrainConfig), ("prepare", PrepareConfig),
                       ("translate", TranslateConfig), ("serve", ServeConfig),
                       ("export", ExportConfig), ("analyze", AnalyzeConfig),
                       ("average", AverageConfig)):
        ConfigStore.instance().store(name=f"{name}_schema", node=node)


register_configs()
