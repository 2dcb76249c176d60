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

import numpy as np

from tinymt.data.cache import cache_path, config_dict, load_complete, mark_complete, replaceable
from tinymt.data.prepared import (
    PreparedData,
    SplitWriter,
    load_prepared,
    save_splits,
    save_stats,
    side_stats,
)
from tinymt.data.sources import SPLITS, ChunkWriter, Columns, Log, load_chunks, read_chunks, select
from tinymt.errors import TinyMTError
from tinymt.files import TOKENIZER, write_folder
from tinymt.tokenizer import UNK_ID, Tokenizer


def _direction(cfg) -> tuple[str, str]:
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    langs = get("src_lang", "zh"), get("tgt_lang", "en")
    return langs[::-1] if get("reverse", False) else langs


def target_language(cfg) -> str:
    """The language the model writes: ``tgt_lang``, or ``src_lang`` when ``reverse``
    (works on a DataConfig, a DictConfig or the plain dict saved in a checkpoint)."""
    return _direction(cfg)[1]


def source_language(cfg) -> str:
    """The language the model reads (``target_language``'s counterpart)."""
    return _direction(cfg)[0]


def normalize(text: str) -> str:
    """Unicode NFKC, whitespace runs collapsed to one space, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


STAGING = ".staging"  # a build's intermediate files, inside its temporary folder


def _describe(cfg) -> str:
    where = "" if cfg.source == "builtin" else f" {cfg.path}"
    reversed_ = ", reversed" if cfg.reverse else ""
    return f"{cfg.name} ({cfg.source}{where}, {cfg.src_lang}->{cfg.tgt_lang}{reversed_})"


# ----------------------------------------------------------------------------------------
# the steps of a build: each reads a split chunk by chunk and writes the next file
# (tinymt.data.sources.ChunkWriter), so memory is bounded by CHUNK_PAIRS, not by the corpus


def _normalise_split(cfg, split: str, chunks, path: Path) -> int:
    """NFKC + whitespace on both sides, pairs with an empty side dropped, the rest written
    to ``path``; returns how many were dropped."""
    seen = 0
    with contextlib.closing(ChunkWriter(path)) as out:
        for cols in chunks:
            seen += len(cols["src"])
            src = [normalize(s) for s in cols["src"]]
            tgt = [normalize(t) for t in cols["tgt"]]
            keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s and t]
            cols = dict(cols, src=src, tgt=tgt)
            if keep:
                out.write(select(cols, keep) if len(keep) < len(src) else cols)
    if not seen:
        raise TinyMTError(f"the {split} split of {_describe(cfg)} has no pairs")
    if not out.rows:
        raise TinyMTError(f"the {split} split is empty after dropping empty pairs: all {seen} "
                          "pairs have an empty side after normalisation")
    return seen - out.rows


def _sentences(path: Path, *sides: str) -> Iterator[str]:
    """Every sentence of ``sides`` of a staged split, side after side, chunk by chunk."""
    for side in sides:
        for cols in read_chunks(path, [side]):
            yield from cols[side]


def _train_tokenizers(cfg, train: Path, tok_dir: Path) -> tuple[Tokenizer, Tokenizer]:
    """sentencepiece on the train split only (``train``: its staged file): one joint model,
    or one per side. It keeps a sample of ``INPUT_SENTENCE_SIZE`` sentences, not them all."""
    common = {"vocab_size": cfg.vocab_size, "model_type": cfg.tokenizer_type,
              "character_coverage": cfg.character_coverage}
    if cfg.joint_vocab:
        tok = Tokenizer.train(_sentences(train, "src", "tgt"), tok_dir / "spm.model", **common)
        return tok, tok
    src_tok = Tokenizer.train(_sentences(train, "src"), tok_dir / "src.model", **common)
    tgt_tok = Tokenizer.train(_sentences(train, "tgt"), tok_dir / "tgt.model", **common)
    return src_tok, tgt_tok


def _length_filter(cfg, cols: Columns, left: list[int]) -> Columns:
    """The max_len and max_len_ratio filters, in that order, on a chunk of the train split
    (valid/test pairs are never dropped for length); ``left`` counts the pairs before the
    filters and after each."""
    ratio, most = cfg.max_len_ratio, cfg.max_len  # (read once: a DictConfig's read is ~35 us)
    lens = [(len(s), len(t)) for s, t in zip(cols["src_ids"], cols["tgt_ids"])]
    short = [i for i, n in enumerate(lens) if most <= 0 or max(n) <= most]
    keep = [i for i in short if ratio <= 0 or max(lens[i]) <= ratio * max(1, min(lens[i]))]
    for k, n in enumerate((len(lens), len(short), len(keep))):
        left[k] += n
    return select(cols, keep) if len(keep) < len(lens) else cols


def _length_dropped(cfg, left: list[int]) -> dict[str, int]:
    """Each length filter's drops (``left``: :func:`_length_filter`'s counts); one line
    when a filter left no pair."""
    for k, name in enumerate(("max_len", "max_len_ratio"), start=1):
        if not left[k]:
            raise TinyMTError(f"the train split is empty after the {name} filter (data.{name}="
                              f"{getattr(cfg, name)} removed all {left[k - 1]} remaining "
                              f"pairs): raise data.{name}")
    return {"max_len": left[0] - left[1], "max_len_ratio": left[1] - left[2]}


def _tokenize_split(text: Path, toks: tuple[Tokenizer, Tokenizer], out: SplitWriter,
                    keep=None) -> dict:
    """Encode a staged split into ``out`` (``keep``: the train split's length filter);
    returns each side's :func:`side_stats`."""
    lens: dict[str, list] = {"src": [], "tgt": []}
    unk = {"src": 0, "tgt": 0}
    for cols in read_chunks(text):
        cols["src_ids"] = toks[0].encode_batch(cols["src"])
        cols["tgt_ids"] = toks[1].encode_batch(cols["tgt"])
        if keep is not None:
            cols = keep(cols)
        if not cols["src"]:
            continue
        out.write(cols)
        for side in lens:
            ids = cols[f"{side}_ids"]
            lens[side].append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
            unk[side] += sum(x.count(UNK_ID) for x in ids)
    return {side: side_stats(np.concatenate(lens[side] or [np.zeros(0, np.int64)]), unk[side])
            for side in lens}


def _build(cfg, tmp: Path, log: Log) -> dict:
    """Load, clean, tokenize and filter into ``tmp``; returns the stats."""
    t0 = time.perf_counter()
    log(f"data: loading {_describe(cfg)}")
    staging = tmp / STAGING  # made by its first ChunkWriter
    chunks = load_chunks(cfg, log)
    texts = {split: staging / f"{split}.text.arrow" for split in SPLITS}
    dropped: dict[str, dict[str, int]] = {
        split: {"empty": _normalise_split(cfg, split, chunks[split], texts[split])}
        for split in SPLITS}
    t_load = time.perf_counter()

    src_tok, tgt_tok = _train_tokenizers(cfg, texts["train"], tmp / TOKENIZER)
    t_tok = time.perf_counter()
    sizes = "" if cfg.joint_vocab else f"/{tgt_tok.vocab_size}"
    log(f"data: trained {'joint ' if cfg.joint_vocab else ''}{cfg.tokenizer_type} tokenizer "
        f"({src_tok.vocab_size}{sizes} pieces) in {t_tok - t_load:.1f}s")

    pairs, tokens, left = {}, {}, [0, 0, 0]
    for split in SPLITS:
        out = SplitWriter(tmp, split)
        keep = (lambda cols: _length_filter(cfg, cols, left)) if split == "train" else None
        tokens[split] = _tokenize_split(texts[split], (src_tok, tgt_tok), out, keep)
        # train: one line if a filter left no pair; valid/test are never filtered
        dropped[split].update(_length_dropped(cfg, left) if keep else
                              {"max_len": 0, "max_len_ratio": 0})
        out.close()
        pairs[split] = out.rows
        texts[split].unlink()
    log(f"data: tokenized in {time.perf_counter() - t_tok:.1f}s")
    for split in SPLITS:
        removed = ", ".join(f"{k} {v}" for k, v in dropped[split].items() if v)
        log(f"data: {split}: {pairs[split]} pairs" + (f" (removed: {removed})" if removed else ""))
    stats = {"name": cfg.name, "source": _describe(cfg), "direction": "->".join(_direction(cfg)),
             "pairs": pairs, "dropped": dropped, "joint_vocab": bool(cfg.joint_vocab),
             "vocab_size": {"src": src_tok.vocab_size, "tgt": tgt_tok.vocab_size},
             "tokens": tokens}
    save_splits(tmp, SPLITS)
    shutil.rmtree(staging)
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    return stats


@contextlib.contextmanager
def _quiet_and_uncollected():
    """No datasets progress bars, and no cyclic GC: millions of small lists, no cycles, which
    it would only rescan (10x slower). A decorator too (``contextlib``), each call its own."""
    import datasets  # (where used: tinymt.data.sources says why)
    bars, collecting = not datasets.are_progress_bars_disabled(), gc.isenabled()
    datasets.disable_progress_bars()
    gc.disable()
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()
        if collecting:
            gc.enable()


@_quiet_and_uncollected()
def prepare(cfg, log: Log = print) -> PreparedData:
    """Load, clean, tokenize and filter the corpus of ``cfg`` (a ``DataConfig``), cached."""
    final = cache_path(cfg)
    cached = load_complete(final, log)
    if cached is not None:
        return cached
    found = final.stat().st_mtime if final.exists() else None  # damaged or incomplete
    stats: dict = {}

    def build(tmp: Path) -> None:
        stats.update(_build(cfg, tmp, log))
        save_stats(tmp, stats, config_dict(cfg))
        mark_complete(tmp)

    # another process's complete entry is used; a damaged one (as found) is replaced
    if write_folder(build, final, replace=lambda f: replaceable(f, found)):
        log(f"data: prepared in {stats['seconds']:.1f}s, cached in {final}")
    return load_prepared(final, cache_hit=False)
