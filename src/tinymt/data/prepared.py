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
from tinymt.errors import TinyMTError
from tinymt.tokenizer import Tokenizer, load_tokenizers

TOKENIZER_DIR = "tokenizer"
SPLITS_DIR = "splits"


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
    (folder / "stats.json").write_text(json.dumps(stats, indent=2))
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))


class DamagedCache(TinyMTError):
    """A prepared folder whose contents are evidently wrong (missing, changed or unreadable
    files): rebuild it. Any other error reading it is not
    evidence of damage (out of memory, no thread, permissions) and is raised as it is."""


# what reading a damaged folder raises: a file missing, bytes that do not parse
_DAMAGE = (FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError, KeyError,
           EOFError, pa.ArrowException, TinyMTError)


def load_prepared(folder: Path, cache_hit: bool) -> PreparedData:
    """The prepared data in ``folder``; :class:`DamagedCache` when it is evidently damaged."""
    try:
        stats = json.loads((folder / "stats.json").read_text(encoding="utf-8"))
        dd = datasets.load_from_disk(str(folder / SPLITS_DIR))
        src_tok, tgt_tok = load_tokenizers(folder / TOKENIZER_DIR)
        if not isinstance(stats, dict):
            raise ValueError("stats.json is not an object")
        splits = {s: dd[s] for s in SPLITS}
    except MemoryError:  # pyarrow's is an ArrowException too: not evidence of damage
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

