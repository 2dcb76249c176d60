"""What ``prepare`` returns, and the folder it is kept in.

A prepared folder holds ``tokenizer/`` (``spm.model`` joint, or ``src.model`` +
``tgt.model``), ``splits/`` (a saved ``DatasetDict``), ``stats.json`` and ``config.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from tinymt.data.sources import SPLITS
from tinymt.errors import TinyMTError, first_line
from tinymt.files import write_text
from tinymt.loaders import load_json_file
from tinymt.tokenizer import Tokenizer, load_tokenizers

TOKENIZER_DIR = "tokenizer"
SPLITS_DIR = "splits"
MAX_STATS_BYTES = 1 << 20  # stats.json: a few kB


@dataclass
class PreparedData:
    """Tokenized splits, their tokenizers and the numbers that describe them."""

    splits: dict[str, datasets.Dataset]  # train/valid/test: src, tgt, src_ids, tgt_ids (+ builtin)
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer  # the same object when the vocabulary is joint
    tokenizer_dir: Path  # holds spm.model (joint) or src.model + tgt.model
    stats: dict
    cache_hit: bool
    _ids: dict = field(default_factory=dict, repr=False, compare=False)  # {split: ids}

    def ids(self, split: str) -> tuple[list[list[int]], list[list[int]]]:
        """``(src_ids, tgt_ids)`` of a split as plain lists: index these in a training loop
        (``splits[s]["src_ids"]`` is a lazy datasets Column; indexing it row by row is slow).
        Read from Arrow once per split (about a second for 200k pairs) and kept: the same
        lists on every call, so do not modify them."""
        if split not in self._ids:
            ds = self.splits[split]
            self._ids[split] = (ds["src_ids"][:], ds["tgt_ids"][:])
        return self._ids[split]

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        """Token counts (no bos/eos) per pair, straight from Arrow: TokenBatchSampler's input."""
        table = self.splits[split].with_format("arrow")
        return (
            pc.list_value_length(table["src_ids"]).to_pylist(),
            pc.list_value_length(table["tgt_ids"]).to_pylist(),
        )


def save_splits(folder: Path, dd: datasets.DatasetDict) -> None:
    dd.save_to_disk(str(folder / SPLITS_DIR))


def save_stats(folder: Path, stats: dict, config: dict) -> None:
    write_text(json.dumps(stats, indent=2), folder / "stats.json")
    write_text(json.dumps(config, indent=2, default=str), folder / "config.json")


class DamagedCache(TinyMTError):
    """A prepared folder whose contents are evidently wrong (missing, changed or unreadable
    files): rebuild it. Any other error reading it is not
    evidence of damage (out of memory, no thread, permissions) and is raised as it is."""


# what reading a damaged folder raises: a file missing, bytes that do not parse
_DAMAGE = (FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError, KeyError,
           EOFError, pa.ArrowException, TinyMTError)


def load_prepared(folder: Path, cache_hit: bool) -> PreparedData:
    """The prepared data in ``folder``; :class:`DamagedCache` when it is evidently damaged:
    a file missing or unparsable, or contents that contradict each other (see
    :func:`check_splits`), found before anything uses them."""
    try:
        stats = load_json_file(folder / "stats.json", "the data stats", MAX_STATS_BYTES)
        splits = {s: _load_split(folder / SPLITS_DIR / s) for s in SPLITS}
        src_tok, tgt_tok = load_tokenizers(folder / TOKENIZER_DIR)
        check_splits(folder, splits, stats, src_tok, tgt_tok)
    except MemoryError:  # pyarrow's is an ArrowException too: not evidence of damage
        raise
    except DamagedCache:
        raise
    except _DAMAGE as e:
        raise DamagedCache(f"{type(e).__name__}: {e}".splitlines()[0]) from None
    stats["cache_hit"] = cache_hit
    stats["cache_dir"] = str(folder)
    return PreparedData(
        splits=splits,
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        tokenizer_dir=folder / TOKENIZER_DIR,
        stats=stats,
        cache_hit=cache_hit,
    )


def _load_split(where: Path) -> datasets.Dataset:
    """One split's folder (as ``save_to_disk`` writes it); damage named by that folder."""
    try:
        return datasets.load_from_disk(str(where))
    except MemoryError:
        raise
    except _DAMAGE as e:
        raise DamagedCache(f"{where}: {type(e).__name__}: {first_line(e)}") from None


def check_splits(folder: Path, splits: dict[str, datasets.Dataset], stats: dict,
                 src_tok: Tokenizer, tgt_tok: Tokenizer) -> None:
    """What the files of an entry say agrees, or :class:`DamagedCache` naming the file:
    ``stats.json``'s vocabulary sizes are the tokenizers', its pair counts the splits';
    each split's Arrow data is valid (offsets within their buffers), its id columns are
    lists of integers without nulls, and every id lies in ``[0, vocabulary size)`` of its
    side. Vectorised (Arrow's min/max over the flattened ids): milliseconds for 200k pairs.
    Digests alone cannot tell: a marker can be recomputed over wrong ids."""
    sizes = {"src": src_tok.vocab_size, "tgt": tgt_tok.vocab_size}
    if stats.get("vocab_size") != sizes:
        raise DamagedCache(f"{folder / 'stats.json'}: vocab_size {stats.get('vocab_size')!r:.60} "
                           f"but the tokenizers have {sizes}")
    pairs = stats.get("pairs")
    for split, ds in splits.items():
        where = folder / SPLITS_DIR / split
        declared = pairs.get(split) if isinstance(pairs, dict) else None
        if type(declared) is not int or declared != ds.num_rows:
            raise DamagedCache(f"{where} holds {ds.num_rows} pairs, but stats.json says "
                               f"{declared!r:.40}")
        table = ds.with_format("arrow")[:]
        try:
            table.validate(full=True)
        except pa.ArrowInvalid as e:
            raise DamagedCache(f"{where} is not valid Arrow data ({first_line(e)})") from None
        for side, size in sizes.items():
            _check_ids(table, f"{side}_ids", size, where)


def _check_ids(table: pa.Table, name: str, size: int, where: Path) -> None:
    if name not in table.column_names:
        raise DamagedCache(f"{where} has no {name} column")
    column = table.column(name)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or not \
            pa.types.is_integer(column.type.value_type):
        raise DamagedCache(f"{where}: {name} holds {column.type}, not lists of token ids")
    ids = pc.list_flatten(column)
    if column.null_count or ids.null_count:
        raise DamagedCache(f"{where}: {name} has missing values")
    if not len(ids):
        return
    extremes = pc.min_max(ids)
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    if low < 0 or high >= size:
        bad = low if low < 0 else high
        raise DamagedCache(f"{where}: {name} holds the token id {bad}, outside the vocabulary "
                           f"of {size} pieces")
