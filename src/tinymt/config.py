"""Typed config schemas (registered in Hydra's ConfigStore) and the one place values are checked.

**Defaults** are those of the commented YAML in ``configs/`` (what users read and what runs),
repeated here because code and tests build partial configs (``ModelConfig(d_model=16)``) and
need the shipped values for the rest: simpler than ``MISSING`` fields that every such caller
would first fill from the YAML. ``tests/test_config.py`` proves both equal, key for key.

**Rules**: each field names the values it allows (``_r(default, rule)``, the rules made by
:mod:`tinymt.rules`: every number bounded above too, paths checked without opening them);
``*_RULES`` are those tables, ``*_CROSS`` the rules between keys; a bad value is one
``TinyMTError`` line. Scripts call right after composition ``as_train_config(cfg)`` (merge onto :class:`TrainConfig`, check)
or ``check_train|data|translate|serve|export|analyze|average(cfg)``; ``tinymt.cli.run_hydra(main)``
makes Hydra's own composition errors (unknown key, wrong type, missing option) one line too.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from tinymt.errors import TinyMTError
from tinymt.rules import (
    BATCH_TOKENS,
    BEAM,
    CHECKPOINT,
    CKPT_FILE,
    COUNT,
    DEVICE,
    DIR,
    FOLDER,
    LAYERS,
    MAX_ACCUMULATE,
    MAX_BEAM,
    MAX_BEAM_TOKENS,
    MAX_BUILTIN_PAIRS,
    MAX_COUNT,
    MAX_HEADS,
    MAX_LEN_PENALTY,
    MAX_PARAMETERS,
    MAX_THREADS,
    MAX_VOCAB,
    MAX_WIDTH,
    NEW_FOLDER,
    PATH,
    POSITIVE,
    PROBABILITY,
    RUN,
    RUN_FOLDER,
    SEED,
    TEXT_FILE,
    WIDTH,
    Cross,
    apply_rules,
    attention_target,
    integer,
    is_number,
    number,
    one_of,
    owned_output,
    rule_field,
    rules_of,
    writable_file,
)

_r = rule_field  # a schema field: its default (= the YAML's, tested) and the values it allows
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
    n_encoder_layers: int = _r(2, LAYERS)
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
    max_steps: int = _r(800, POSITIVE)
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
    output: str | None = _r(None, (writable_file, "must be a file to write"))
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
    max_connections: int = _r(1000, integer(1, 1_000_000))
    attention_items: int = _r(8, integer(0, 1000, note="0 = no /attention, no page"))
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


# ----------------------------------------------------------------------------- rule tables
TRAIN_RULES = rules_of(TrainConfig)
DATA_RULES = rules_of(DataConfig, "data.")
TRANSLATE_RULES = rules_of(TranslateConfig)
SERVE_RULES = rules_of(ServeConfig)
EXPORT_RULES = rules_of(ExportConfig)
ANALYZE_RULES = rules_of(AnalyzeConfig)
AVERAGE_RULES = rules_of(AverageConfig)

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
    apply_rules(cfg, DATA_RULES, DATA_CROSS, strip="data.")


def check_train(cfg) -> None:
    """A whole training config (typed: pass it through :func:`as_train_config`)."""
    apply_rules(cfg, TRAIN_RULES)
    apply_rules(cfg.data, {}, DATA_CROSS)
    apply_rules(cfg, {}, TRAIN_CROSS)


def check_translate(cfg) -> None: apply_rules(cfg, TRANSLATE_RULES, TRANSLATE_CROSS)  # noqa: E704
def check_serve(cfg) -> None: apply_rules(cfg, SERVE_RULES, SERVE_CROSS)  # noqa: E704
def check_export(cfg) -> None: apply_rules(cfg, EXPORT_RULES, EXPORT_CROSS)  # noqa: E704
# a checkpoint written into a run only into the one run= names (its lock is taken then)
def check_analyze(cfg) -> None: apply_rules(cfg, ANALYZE_RULES, [owned_output("prune_output")])  # noqa: E704
def check_average(cfg) -> None: apply_rules(cfg, AVERAGE_RULES, [owned_output("output")])  # noqa: E704


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
    ``${on_main_rank:a,b}`` is ``a`` on rank 0 (or without torchrun), else ``b``;
    ``${unless_named:resume,run_dir,clock}``: "." when a folder is named, else the clock."""
    # under torchrun only rank 0 writes the run dir; the other ranks' Hydra gets a
    # scratch folder (the trainer hands every rank rank 0's run dir)
    rank0 = lambda main, other: main if int(os.environ.get("RANK", "0")) == 0 else other  # noqa: E731
    for name, fn in (("or_else", lambda a, b: b if a is None else a), ("dirname", _dirname),
                     ("on_main_rank", rank0),  # Hydra makes only a clock folder itself:
                     ("unless_named", lambda r, d, c: "." if r is not None or d is not None else c)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    for name, node in (("train", TrainConfig), ("prepare", PrepareConfig),
                       ("translate", TranslateConfig), ("serve", ServeConfig),
                       ("export", ExportConfig),
                       ("analyze", AnalyzeConfig), ("average", AverageConfig)):
        ConfigStore.instance().store(name=f"{name}_schema", node=node)


register_configs()
