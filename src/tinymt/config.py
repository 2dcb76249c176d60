"""Typed config schemas, registered in Hydra's ConfigStore.

Every YAML under ``configs/`` is merged into one of these dataclasses, so a typo'd key
or a value of the wrong type is an error at composition time, not a silent default.
The YAML files carry the per-key comments users read; the docstrings here say what
each group is for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore


@dataclass
class DataConfig:
    """Where the parallel corpus comes from, how it is cleaned and tokenized."""

    name: str = "builtin_zh_en"
    source: str = "builtin"  # builtin | hub | text | tsv
    path: str | None = None  # hub name or local folder (hub), folder (text), file (tsv)
    src_lang: str = "zh"
    tgt_lang: str = "en"
    reverse: bool = False  # swap source and target after loading
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str = "test"
    # tsv: which columns hold each language (0-based)
    src_column: int = 1
    tgt_column: int = 0
    # sizes: builtin generates this many pairs; tsv carves valid/test off a seeded shuffle
    train_size: int = 200_000
    valid_size: int = 1000
    test_size: int = 1000
    split_seed: int = 1234
    # filters (after normalisation; lengths in subword tokens)
    max_len: int = 128
    max_len_ratio: float = 3.0
    # tokenizer
    vocab_size: int = 8000
    tokenizer_type: str = "bpe"  # bpe | unigram
    joint_vocab: bool = True
    character_coverage: float = 1.0
    cache_dir: str = "outputs/.cache"


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer sizes."""

    name: str = "tiny"
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"  # relu | gelu
    norm_first: bool = True  # pre-LN (True) or the paper's post-LN (False)
    positional: str = "sinusoidal"  # sinusoidal | learned
    max_positions: int = 512
    tie_embeddings: bool = True  # share src/tgt/output embeddings when the vocab is joint


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    name: str = "adamw"
    lr: float = 1e-3  # peak learning rate, reached at the end of warm-up
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    schedule: str = "inverse_sqrt"  # inverse_sqrt | cosine | constant
    warmup_steps: int = 4000
    min_lr: float = 0.0  # floor for cosine
    label_smoothing: float = 0.1
    clip_grad_norm: float = 1.0  # 0 disables clipping
    fused: bool = True  # fused AdamW kernel where the device supports it


@dataclass
class TrainerConfig:
    """The loop: budget, validation, checkpoints, logging, devices."""

    name: str = "default"
    device: str = "auto"  # auto (cuda -> mps -> cpu) | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto (bf16 autocast on cuda, fp32 elsewhere) | fp32 | bf16
    compile: bool = False
    seed: int = 1
    num_threads: int = 0  # torch CPU threads; 0 = torch's default
    max_tokens: int = 4096  # tokens per batch (src or tgt, padding included)
    accumulate: int = 1  # gradient accumulation steps per optimizer step
    max_steps: int = 2000  # optimizer steps
    max_epochs: int = 1000
    max_minutes: float = 0.0  # wall-clock budget for training; 0 = none
    log_every: int = 50  # steps between scalar logs
    valid_every: int = 1000  # steps between validations
    valid_sentences: int = 0  # translate this many valid sentences for BLEU; 0 = all
    valid_max_len_b: int = 10  # greedy decode length: a*src_len + b with a = 1.5
    patience: int = 0  # stop after this many validations without a BLEU gain; 0 = never
    nan_policy: str = "stop"  # stop | skip
    keep_last: int = 1  # keep this many step checkpoints for averaging (ckpt_<step>.pt)
    average_last: int = 0  # at the end, average the last N step checkpoints into avg.pt
    test_beam: int = 5  # beam size for the final test-set translation
    probe_sentences: list[str] = field(default_factory=list)  # extra sentences to draw
    n_probes: int = 2  # how many validation sentences to draw besides those
    n_text_samples: int = 3  # source/reference/hypothesis triples logged per validation
    resume: str | None = None  # run dir to continue exactly


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run_dir: str | None = None  # set by scripts/train.py from Hydra's output dir


@dataclass
class PrepareConfig:
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class DecodeConfig:
    beam: int = 1  # 1 = greedy
    len_penalty: float = 1.0  # score / length**len_penalty
    max_len_a: float = 1.5  # max output length = a * source length + b
    max_len_b: int = 10
    nbest: int = 1  # print this many hypotheses per sentence (<= beam)
    batch_tokens: int = 4096  # source tokens per batch when translating files


@dataclass
class TranslateConfig:
    run: str = "latest"  # run dir, or "latest" = newest under outputs/
    checkpoint: str = "best"  # best | last | avg | path to a .pt file
    input: str | None = None  # file to translate; default: arguments or stdin
    output: str | None = None  # file to write; default: stdout
    ref: str | None = None  # reference file: print sacreBLEU and chrF
    attention: str | None = None  # .png file (one sentence) or folder: per-head maps
    attention_kinds: list[str] = field(default_factory=lambda: ["cross"])
    device: str = "auto"
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    outputs_root: str = "outputs"  # where run=latest looks


@dataclass
class AnalyzeConfig:
    run: str = "latest"  # run dir, or "latest"
    checkpoint: str = "best"  # best | last | avg | path
    split: str = "valid"  # which split of the run's data to analyse: valid | test
    max_sentences: int = 500  # sentences used for importance, pruning BLEU, entropy; 0 = all
    prune_step: float = 0.1  # fraction of heads masked per step of the pruning curve
    prune: float | None = None  # write a checkpoint with this fraction of heads masked
    prune_output: str | None = None  # default: <run>/checkpoints/pruned.pt
    device: str = "auto"
    batch_tokens: int = 4096
    outputs_root: str = "outputs"


CHOICES = {
    "data.source": ("builtin", "hub", "text", "tsv"),
    "data.tokenizer_type": ("bpe", "unigram"),
    "model.activation": ("relu", "gelu"),
    "model.positional": ("sinusoidal", "learned"),
    "optim.schedule": ("inverse_sqrt", "cosine", "constant"),
    "trainer.precision": ("auto", "fp32", "bf16"),
    "trainer.nan_policy": ("stop", "skip"),
}


def check_choices(cfg) -> None:
    """Fields that take one of a few words: say which words, instead of failing later."""
    from omegaconf import OmegaConf

    from tinymt.errors import TinyMTError

    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value is not None and value not in allowed:
            raise TinyMTError(f"{key}={value!r}: choose one of {', '.join(allowed)}")


def _dirname(text: str, limit: int = 100) -> str:
    """A folder name from a sweep's overrides: no slashes, at most ``limit`` characters."""
    import hashlib

    name = str(text).replace("/", "_") or "run"
    if len(name) > limit:
        name = f"{name[: limit - 9]}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"
    return name


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def register_configs() -> None:
    """Register the schemas (YAMLs name them first in their defaults lists) and three
    resolvers: ``${or_else:${a},b}`` is ``a`` unless it is null, else ``b``;
    ``${dirname:text}`` makes a safe, bounded folder name;
    ``${on_main_rank:a,b}`` is ``a`` on rank 0 (or without torchrun), else ``b``."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("or_else"):
        OmegaConf.register_new_resolver("or_else", lambda a, b: b if a is None else a)
    if not OmegaConf.has_resolver("dirname"):
        OmegaConf.register_new_resolver("dirname", _dirname)
    if not OmegaConf.has_resolver("on_main_rank"):
        # under torchrun only rank 0 writes the run dir; the other ranks' Hydra gets a
        # scratch folder (the trainer hands every rank rank 0's run dir)
        OmegaConf.register_new_resolver(
            "on_main_rank", lambda main, other: main if _rank() == 0 else other)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="prepare_schema", node=PrepareConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="analyze_schema", node=AnalyzeConfig)


register_configs()
