"""``prepare``: load, normalise, train the tokenizer(s), tokenize, filter, cache.

:func:`normalize` is the project's one text normaliser: translation input and the
trainer's probe sentences go through it too, so they look like the training text.
"""

from __future__ import annotations

import contextlib
import gc
import time
import unicodedata
from pathlib import Path

import datasets

from tinymt.data.cache import cache_path, config_dict, load_complete, mark_complete, replaceable
from tinymt.data.prepared import (
    TOKENIZER_DIR,
    PreparedData,
    load_prepared,
    save_splits,
    save_stats,
)
from tinymt.data.sources import SPLITS, Columns, Log, load_columns, to_dataset
from tinymt.data.summary import token_stats
from tinymt.errors import TinyMTError
from tinymt.files import write_folder
from tinymt.tokenizer import Tokenizer


def target_language(cfg) -> str:
    """The language the model writes: ``tgt_lang``, or ``src_lang`` when ``reverse``
    (works on a DataConfig, a DictConfig or the plain dict saved in a checkpoint)."""
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    return get("src_lang") if get("reverse", False) else get("tgt_lang", "en")


def source_language(cfg) -> str:
    """The language the model reads (``target_language``'s counterpart)."""
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    return get("tgt_lang") if get("reverse", False) else get("src_lang", "zh")


def normalize(text: str) -> str:
    """Unicode NFKC, whitespace runs collapsed to one space, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _describe(cfg) -> str:
    where = "" if cfg.source == "builtin" else f" {cfg.path}"
    return f"{cfg.name} ({cfg.source}{where}, {cfg.src_lang}->{cfg.tgt_lang}" + (
        ", reversed)" if cfg.reverse else ")"
    )


def _select(cols: Columns, keep: list[int]) -> Columns:
    return {name: [values[i] for i in keep] for name, values in cols.items()}


# ----------------------------------------------------------------------------------------
# the steps of a build


def _normalise_split(cfg, split: str, cols: Columns) -> tuple[Columns, int]:
    """NFKC + whitespace on both sides, pairs with an empty side dropped (and counted)."""
    if not cols["src"]:
        raise TinyMTError(f"the {split} split of {_describe(cfg)} has no pairs")
    src = [normalize(s) for s in cols["src"]]
    tgt = [normalize(t) for t in cols["tgt"]]
    keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s and t]
    cols = dict(cols, src=src, tgt=tgt)
    if not keep:
        raise TinyMTError(
            f"the {split} split is empty after dropping empty pairs: all {len(src)} pairs "
            "have an empty side after normalisation"
        )
    return (_select(cols, keep) if len(keep) < len(src) else cols), len(src) - len(keep)


def _train_tokenizers(cfg, train: Columns, tok_dir: Path) -> tuple[Tokenizer, Tokenizer]:
    """sentencepiece on the train split only: one joint model, or one per side."""
    common = {
        "vocab_size": cfg.vocab_size,
        "model_type": cfg.tokenizer_type,
        "character_coverage": cfg.character_coverage,
    }
    if cfg.joint_vocab:
        tok = Tokenizer.train(
            (s for side in (train["src"], train["tgt"]) for s in side),
            tok_dir / "spm.model",
            **common,
        )
        return tok, tok
    src_tok = Tokenizer.train(train["src"], tok_dir / "src.model", **common)
    tgt_tok = Tokenizer.train(train["tgt"], tok_dir / "tgt.model", **common)
    return src_tok, tgt_tok


def _encode(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Batch-encode, each distinct sentence once (generated corpora repeat many)."""
    unique = list(dict.fromkeys(texts))
    if len(unique) == len(texts):
        return tok.encode_batch(texts)
    ids = dict(zip(unique, tok.encode_batch(unique)))
    return [ids[t] for t in texts]


def _length_filter(cfg, train: Columns, dropped: dict[str, int]) -> Columns:
    """The max_len and max_len_ratio filters, in that order, each one's drops counted in
    ``dropped``. Applied to train only: valid/test pairs are never dropped for length."""
    n = len(train["src"])
    lens = [(len(s), len(t)) for s, t in zip(train["src_ids"], train["tgt_ids"])]
    keep = list(range(n))
    filters = [
        (
            "max_len",
            cfg.max_len > 0,
            lambda a, b: a <= cfg.max_len and b <= cfg.max_len,
            "raise data.max_len",
        ),
        (
            "max_len_ratio",
            cfg.max_len_ratio > 0,
            lambda a, b: max(a, b) <= cfg.max_len_ratio * max(1, min(a, b)),
            "raise data.max_len_ratio",
        ),
    ]
    for name, active, ok, fix in filters:
        before = len(keep)
        if active:
            keep = [i for i in keep if ok(*lens[i])]
        dropped[name] = before - len(keep)
        if not keep:
            value = getattr(cfg, name)
            raise TinyMTError(
                f"the train split is empty after the {name} filter (data.{name}={value} "
                f"removed all {before} remaining pairs): {fix}"
            )
    return _select(train, keep) if len(keep) < n else train


def _log_counts(splits: dict[str, Columns], dropped: dict[str, dict[str, int]], log: Log):
    for split in SPLITS:
        removed = ", ".join(f"{k} {v}" for k, v in dropped[split].items() if v)
        log(
            f"data: {split}: {len(splits[split]['src'])} pairs"
            + (f" (removed: {removed})" if removed else "")
        )


def _build(cfg, tmp: Path, log: Log) -> dict:
    """Load, clean, tokenize and filter into ``tmp``; returns the stats."""
    t0 = time.perf_counter()
    log(f"data: loading {_describe(cfg)}")
    raw = load_columns(cfg, log)
    dropped: dict[str, dict[str, int]] = {s: {} for s in SPLITS}
    splits: dict[str, Columns] = {}
    for split in SPLITS:
        splits[split], dropped[split]["empty"] = _normalise_split(cfg, split, raw[split])
    t_load = time.perf_counter()

    src_tok, tgt_tok = _train_tokenizers(cfg, splits["train"], tmp / TOKENIZER_DIR)
    t_tok = time.perf_counter()
    log(
        f"data: trained {'joint ' if cfg.joint_vocab else ''}{cfg.tokenizer_type} tokenizer "
        f"({src_tok.vocab_size}"
        + ("" if cfg.joint_vocab else f"/{tgt_tok.vocab_size}")
        + f" pieces) in {t_tok - t_load:.1f}s"
    )

    for cols in splits.values():
        cols["src_ids"] = _encode(src_tok, cols["src"])
        cols["tgt_ids"] = _encode(tgt_tok, cols["tgt"])
    log(f"data: tokenized in {time.perf_counter() - t_tok:.1f}s")

    splits["train"] = _length_filter(cfg, splits["train"], dropped["train"])
    for split in ("valid", "test"):
        dropped[split].update(max_len=0, max_len_ratio=0)
    _log_counts(splits, dropped, log)

    src_name, tgt_name = (
        (cfg.tgt_lang, cfg.src_lang) if cfg.reverse else (cfg.src_lang, cfg.tgt_lang)
    )
    stats = {
        "name": cfg.name,
        "source": _describe(cfg),
        "direction": f"{src_name}->{tgt_name}",
        "pairs": {s: len(splits[s]["src"]) for s in SPLITS},
        "dropped": dropped,
        "joint_vocab": bool(cfg.joint_vocab),
        "vocab_size": {"src": src_tok.vocab_size, "tgt": tgt_tok.vocab_size},
        "tokens": token_stats(splits),
    }
    save_splits(tmp, datasets.DatasetDict({s: to_dataset(cols) for s, cols in splits.items()}))
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    return stats


# ----------------------------------------------------------------------------------------
# prepare


@contextlib.contextmanager
def _gc_paused():
    """Millions of small lists, no cycles: the cyclic GC would only rescan them (10x slower)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _quiet_datasets():
    was_enabled = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def prepare(cfg, log: Log = print) -> PreparedData:
    """Load, clean, tokenize and filter the corpus of ``cfg`` (a ``DataConfig``), cached."""
    with _quiet_datasets():
        return _prepare(cfg, log)


def _prepare(cfg, log: Log) -> PreparedData:
    final = cache_path(cfg)
    cached = load_complete(final, log)
    if cached is not None:
        return cached
    found = final.stat().st_mtime if final.exists() else None  # damaged or incomplete
    stats: dict = {}

    def build(tmp: Path) -> None:
        with _gc_paused():
            stats.update(_build(cfg, tmp, log))
        save_stats(tmp, stats, config_dict(cfg))
        mark_complete(tmp)

    # another process's complete entry is used; a damaged one (as found) is replaced
    if write_folder(build, final, replace=lambda f: replaceable(f, found)):
        log(f"data: prepared in {stats['seconds']:.1f}s, cached in {final}")
    return load_prepared(final, cache_hit=False)
