"""Shared fixtures: the reference corpora, tiny synthetic corpora, data configs in tmp_path.

Tests never touch the network: the Hugging Face libraries are put in offline mode here,
before anything imports them.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # must precede any import of datasets / huggingface_hub
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import random
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``$TINYMT_SHARED_DATA`` or ``../shared/data`` next to the repository."""
    env = os.environ.get("TINYMT_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The reference corpora folder; tests using it skip (with the reason) when it is absent."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(
            f"reference corpora not found at {path}: put them at ../shared/data beside the "
            "repository or set TINYMT_SHARED_DATA"
        )
    return path


# A toy language pair: "src" words map one-to-one onto "tgt" words, so sentences are
# parallel and sentencepiece has a little structure to learn.
SRC_WORDS = [
    "der",
    "die",
    "das",
    "hund",
    "katze",
    "haus",
    "baum",
    "sieht",
    "läuft",
    "schnell",
    "klein",
    "groß",
    "rot",
    "blau",
    "ein",
]
TGT_WORDS = [
    "the",
    "the",
    "the",
    "dog",
    "cat",
    "house",
    "tree",
    "sees",
    "runs",
    "fast",
    "small",
    "big",
    "red",
    "blue",
    "a",
]


def make_pairs(n: int, seed: int = 0, min_len: int = 2, max_len: int = 8) -> list[tuple[str, str]]:
    """``n`` deterministic parallel (src, tgt) sentences of the toy language pair."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        idx = [rng.randrange(len(SRC_WORDS)) for _ in range(rng.randint(min_len, max_len))]
        pairs.append(
            (" ".join(SRC_WORDS[i] for i in idx) + " .", " ".join(TGT_WORDS[i] for i in idx) + " .")
        )
    return pairs


def write_text_corpus(
    folder: Path,
    splits: dict[str, list[tuple[str, str]]],
    src: str = "de",
    tgt: str = "en",
    suffix: str = "",
) -> Path:
    """``<folder>/<split>.<lang><suffix>`` files, one sentence a line (``.gz`` compresses)."""
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        for lang, side in ((src, 0), (tgt, 1)):
            data = "".join(p[side] + "\n" for p in pairs).encode("utf-8")
            path = folder / f"{split}.{lang}{suffix}"
            path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    return folder


@pytest.fixture
def text_corpus(tmp_path) -> Path:
    """A small text-source corpus: 300 / 20 / 20 pairs, de/en toy language."""
    return write_text_corpus(
        tmp_path / "corpus",
        {"train": make_pairs(300, 0), "valid": make_pairs(20, 1), "test": make_pairs(20, 2)},
    )


@pytest.fixture
def data_cfg(tmp_path):
    """``data_cfg(**overrides)`` -> a DataConfig with its cache in tmp_path and a small vocab."""
    from tinymt.config import DataConfig

    def make(**overrides):
        base = {
            "name": "test",
            "source": "text",
            "src_lang": "de",
            "tgt_lang": "en",
            "train_split": "train",
            "valid_split": "valid",
            "test_split": "test",
            "vocab_size": 40,
            "cache_dir": str(tmp_path / "cache"),
        }
        base.update(overrides)
        return DataConfig(**base)

    return make


# A tiny but real training run (built-in corpus, 2 heads, a few dozen steps), shared by
# the tests of everything that reads a run dir: translate, heads, average_checkpoints.
TINY_TRAIN_OVERRIDES = [
    "data.train_size=3000", "data.valid_size=60", "data.test_size=40", "data.vocab_size=800",
    "data.max_len=60",
    "model.d_model=32", "model.n_heads=2", "model.n_encoder_layers=2",
    "model.n_decoder_layers=1", "model.d_ff=64", "model.dropout=0.1", "model.max_positions=64",
    "optim.warmup_steps=10", "optim.lr=3e-3",
    "trainer.max_tokens=800", "trainer.max_minutes=0", "trainer.num_threads=1",
    "trainer.valid_sentences=20", "trainer.test_beam=2", "trainer.log_every=1",
    "trainer.n_probes=1",
]


def compose_train(tmp_path, *overrides):
    """The real train config, composed by Hydra, made tiny and pointed into tmp_path."""
    from hydra import compose, initialize_config_dir

    import tinymt.config  # noqa: F401

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
        return compose(config_name="train", overrides=[
            *TINY_TRAIN_OVERRIDES, f"data.cache_dir={tmp_path / 'cache'}",
            f"run_dir={tmp_path / 'run'}", *overrides])


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished tiny run dir (40 steps, step checkpoints kept)."""
    from tinymt.trainer import train

    tmp = tmp_path_factory.mktemp("tiny_run")
    train(compose_train(tmp, "trainer.max_steps=40", "trainer.valid_every=20",
                        "trainer.keep_last=2"))
    return tmp / "run"
