"""``prepare``: load, normalise, train the tokenizer(s), tokenize, filter, cache.

:func:`normalize` is the project's one text normaliser: translation input and the
trainer's probe sentences go through it too, so they look like the training text.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import datasets
import numpy as np

from tinymt.data.cache import cache_path, config_dict, load_complete, mark_complete, replaceable
from tinymt.data.prepared import (
    TOKENIZER_DIR,
    PreparedData,
    SplitWriter,
    load_prepared,
    save_splits,
    save_stats,
)
from tinymt.data.sources import SPLITS, Columns, Log, as_table, load_chunks
from tinymt.data.stream import ChunkWriter, read_chunks
from tinymt.data.summary import count_unknown, side_stats
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


STAGING = ".staging"  # a build's intermediate files, inside its temporary folder


def _describe(cfg) -> str:
    where = "" if cfg.source == "builtin" else f" {cfg.path}"
    return f"{cfg.name} ({cfg.source}{where}, {cfg.src_lang}->{cfg.tgt_lang}" + (
        ", reversed)" if cfg.reverse else ")"
    )


def _select(cols: Columns, keep: list[int]) -> Columns:
    return {name: [values[i] for i in keep] for name, values in cols.items()}


# ----------------------------------------------------------------------------------------
# the steps of a build: each reads a split chunk by chunk and writes the next file
# (tinymt.data.stream), so memory is bounded by CHUNK_PAIRS, not by the corpus


def _normalise_split(cfg, split: str, chunks, path: Path) -> int:
    """NFKC + whitespace on both sides, pairs with an empty side dropped, the rest written
    to ``path``; returns how many were dropped."""
    seen = 0
    with ChunkWriter(path) as out:
        for cols in chunks:
            seen += len(cols["src"])
            src = [normalize(s) for s in cols["src"]]
            tgt = [normalize(t) for t in cols["tgt"]]
            keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s and t]
            cols = dict(cols, src=src, tgt=tgt)
            if keep:
                out.write(_select(cols, keep) if len(keep) < len(src) else cols)
    if not seen:
        raise TinyMTError(f"the {split} split of {_describe(cfg)} has no pairs")
    if not out.rows:
        raise TinyMTError(
            f"the {split} split is empty after dropping empty pairs: all {seen} pairs "
            "have an empty side after normalisation"
        )
    return seen - out.rows


def _sentences(path: Path, *sides: str) -> Iterator[str]:
    """Every sentence of ``sides`` of a staged split, side after side, chunk by chunk."""
    for side in sides:
        for cols in read_chunks(path, [side]):
            yield from cols[side]


def _train_tokenizers(cfg, train: Path, tok_dir: Path) -> tuple[Tokenizer, Tokenizer]:
    """sentencepiece on the train split only (``train``: its staged file): one joint model,
    or one per side. It keeps a sample of ``INPUT_SENTENCE_SIZE`` sentences, not them all."""
    common = {
        "vocab_size": cfg.vocab_size,
        "model_type": cfg.tokenizer_type,
        "character_coverage": cfg.character_coverage,
    }
    if cfg.joint_vocab:
        tok = Tokenizer.train(_sentences(train, "src", "tgt"), tok_dir / "spm.model", **common)
        return tok, tok
    src_tok = Tokenizer.train(_sentences(train, "src"), tok_dir / "src.model", **common)
    tgt_tok = Tokenizer.train(_sentences(train, "tgt"), tok_dir / "tgt.model", **common)
    return src_tok, tgt_tok


def _encode(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Batch-encode, each distinct sentence once (generated corpora repeat many)."""
    unique = list(dict.fromkeys(texts))
    if len(unique) == len(texts):
        return tok.encode_batch(texts)
    ids = dict(zip(unique, tok.encode_batch(unique)))
    return [ids[t] for t in texts]


class _LengthFilter:
    """The max_len and max_len_ratio filters, in that order, applied chunk by chunk to the
    train split (valid/test pairs are never dropped for length); ``left``: the pairs before
    the filters and after each."""

    def __init__(self, cfg):
        self.cfg, self.left = cfg, [0, 0, 0]
        self.tests = [
            (cfg.max_len > 0, lambda a, b: a <= cfg.max_len and b <= cfg.max_len),
            (cfg.max_len_ratio > 0,
             lambda a, b: max(a, b) <= cfg.max_len_ratio * max(1, min(a, b))),
        ]

    def __call__(self, cols: Columns) -> Columns:
        lens = [(len(s), len(t)) for s, t in zip(cols["src_ids"], cols["tgt_ids"])]
        keep = list(range(len(lens)))
        self.left[0] += len(keep)
        for k, (active, ok) in enumerate(self.tests, start=1):
            if active:
                keep = [i for i in keep if ok(*lens[i])]
            self.left[k] += len(keep)
        return _select(cols, keep) if len(keep) < len(lens) else cols

    def dropped(self) -> dict[str, int]:
        """Each filter's drops; one-line error when a filter left no pair."""
        fixes = {"max_len": "raise data.max_len", "max_len_ratio": "raise data.max_len_ratio"}
        for k, name in enumerate(fixes, start=1):
            if not self.left[k]:
                raise TinyMTError(
                    f"the train split is empty after the {name} filter (data.{name}="
                    f"{getattr(self.cfg, name)} removed all {self.left[k - 1]} remaining "
                    f"pairs): {fixes[name]}"
                )
        return {"max_len": self.left[0] - self.left[1],
                "max_len_ratio": self.left[1] - self.left[2]}


def _tokenize_split(text: Path, toks: tuple[Tokenizer, Tokenizer], out: SplitWriter,
                    keep=None) -> dict:
    """Encode a staged split into ``out`` (``keep``: the train split's length filter);
    returns each side's :func:`side_stats`."""
    lens: dict[str, list] = {"src": [], "tgt": []}
    unk = {"src": 0, "tgt": 0}
    for cols in read_chunks(text):
        cols["src_ids"] = _encode(toks[0], cols["src"])
        cols["tgt_ids"] = _encode(toks[1], cols["tgt"])
        if keep is not None:
            cols = keep(cols)
        if not cols["src"]:
            continue
        out.write(as_table(cols))
        for side in lens:
            ids = cols[f"{side}_ids"]
            lens[side].append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
            unk[side] += count_unknown(ids)
    return {side: side_stats(np.concatenate(lens[side] or [np.zeros(0, np.int64)]), unk[side])
            for side in lens}


def _log_counts(pairs: dict[str, int], dropped: dict[str, dict[str, int]], log: Log):
    for split in SPLITS:
        removed = ", ".join(f"{k} {v}" for k, v in dropped[split].items() if v)
        log(f"data: {split}: {pairs[split]} pairs" + (f" (removed: {removed})" if removed else ""))


def _build(cfg, tmp: Path, log: Log) -> dict:
    """Load, clean, tokenize and filter into ``tmp``; returns the stats."""
    t0 = time.perf_counter()
    log(f"data: loading {_describe(cfg)}")
    staging = tmp / STAGING
    staging.mkdir()
    chunks = load_chunks(cfg, log)
    texts = {split: staging / f"{split}.text.arrow" for split in SPLITS}
    dropped: dict[str, dict[str, int]] = {
        split: {"empty": _normalise_split(cfg, split, chunks[split], texts[split])}
        for split in SPLITS}
    t_load = time.perf_counter()

    src_tok, tgt_tok = _train_tokenizers(cfg, texts["train"], tmp / TOKENIZER_DIR)
    t_tok = time.perf_counter()
    log(
        f"data: trained {'joint ' if cfg.joint_vocab else ''}{cfg.tokenizer_type} tokenizer "
        f"({src_tok.vocab_size}"
        + ("" if cfg.joint_vocab else f"/{tgt_tok.vocab_size}")
        + f" pieces) in {t_tok - t_load:.1f}s"
    )

    pairs, tokens = {}, {}
    length_filter = _LengthFilter(cfg)
    for split in SPLITS:
        out = SplitWriter(tmp, split)
        keep = length_filter if split == "train" else None
        tokens[split] = _tokenize_split(texts[split], (src_tok, tgt_tok), out, keep)
        # train: one line if a filter left no pair; valid/test are never filtered
        dropped[split].update(length_filter.dropped() if keep else
                              {"max_len": 0, "max_len_ratio": 0})
        out.close()
        pairs[split] = out.rows
        texts[split].unlink()
    log(f"data: tokenized in {time.perf_counter() - t_tok:.1f}s")
    _log_counts(pairs, dropped, log)

    src_name, tgt_name = (
        (cfg.tgt_lang, cfg.src_lang) if cfg.reverse else (cfg.src_lang, cfg.tgt_lang)
    )
    stats = {
        "name": cfg.name,
        "source": _describe(cfg),
        "direction": f"{src_name}->{tgt_name}",
        "pairs": pairs,
        "dropped": dropped,
        "joint_vocab": bool(cfg.joint_vocab),
        "vocab_size": {"src": src_tok.vocab_size, "tgt": tgt_tok.vocab_size},
        "tokens": tokens,
    }
    save_splits(tmp, SPLITS)
    shutil.rmtree(staging)
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
