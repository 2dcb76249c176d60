"""What ``prepare`` returns, and the folder it is kept in.

A prepared folder holds ``tokenizer/`` (``spm.model`` joint, or ``src.model`` +
``tgt.model``), ``splits/`` (a saved ``DatasetDict``), ``stats.json`` (the numbers that
describe it: :func:`side_stats`, shown by :func:`summary_table`) and ``config.json``.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import json
import mmap
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tinymt.checkpoint import file_sha256
from tinymt.data.sources import SPLITS, ChunkWriter
from tinymt.files import TOKENIZER, load_json, write_text
from tinymt.tokenizer import Tokenizer, load_tokenizers

if TYPE_CHECKING:  # datasets: imported where used (tinymt.data.sources says why)
    import datasets

SPLITS_DIR = "splits"
DATA_FILE = "data-00000-of-00001.arrow"  # a split's one shard


@dataclass
class PreparedData:
    """Tokenized splits, their tokenizers and the numbers that describe them."""

    splits: dict[str, datasets.Dataset]  # train/valid/test: src, tgt, src_ids, tgt_ids (+ builtin)
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer  # the same object when the vocabulary is joint
    tokenizer_dir: Path  # holds spm.model (joint) or src.model + tgt.model
    stats: dict  # (its cache_hit: found in the cache, not built)
    _ids: dict = field(default_factory=dict, repr=False, compare=False)  # {split: ids}

    def ids(self, split: str) -> tuple[Ragged, Ragged]:
        """``(src_ids, tgt_ids)`` of a split: ``src_ids[i]`` is pair ``i``'s list of ids,
        read from the memory-mapped cache when it is asked for (a training set of any size
        costs a few bytes a pair in memory). The same objects on every call."""
        if split not in self._ids:
            table = self.splits[split].with_format("arrow")[:]
            self._ids[split] = (Ragged(table["src_ids"]), Ragged(table["tgt_ids"]))
        return self._ids[split]

    def lengths(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Token counts (no bos/eos) per pair, ``int32`` from the Arrow offsets:
        TokenBatchSampler's input."""
        src, tgt = self.ids(split)
        return src.lengths(), tgt.lengths()


_PAGE = mmap.PAGESIZE
_MADV_RANDOM = getattr(mmap, "MADV_RANDOM", None)


def advise_random(array: np.ndarray) -> None:
    """Tell the kernel that ``array``'s pages (memory-mapped from a file) are read at
    random: a page fault then maps that page alone, not its 64 KB neighbourhood
    (``madvise(MADV_RANDOM)``), so a training step's rows cost their own pages in RSS.
    A no-op where there is no ``madvise`` or the array is not a mapping."""
    if _MADV_RANDOM is None or not array.nbytes:
        return
    start = array.ctypes.data & ~(_PAGE - 1)
    length = array.ctypes.data + array.nbytes - start
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), _MADV_RANDOM)


class Ragged(Sequence):
    """One side of a split's token ids as a sequence of lists, over an Arrow column of
    ``list<int32>`` without copying it: each chunk's offsets and values as numpy views
    (zero-copy, memory-mapped when the dataset is), a row made into a list when it is read.

    >>> src_ids, _ = data.ids("train")
    >>> src_ids[3]                       # [48, 912, 7, ...]
    >>> len(src_ids), src_ids.lengths()  # pairs, and each one's token count
    """

    def __init__(self, column: pa.ChunkedArray | pa.Array):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        chunks = [c for c in chunks if len(c)]
        self._offsets = [c.offsets.to_numpy(zero_copy_only=True) for c in chunks]
        self._values = [c.values.to_numpy(zero_copy_only=True) for c in chunks]
        for values in self._values:  # rows are read at random: map only the pages read
            advise_random(values)
        # first row of each chunk, as Python ints for bisect: a step reads every row of its
        # batch, each in 1.8 us over five chunks (6.5 with numpy's searchsorted on one number)
        self._starts = [0, *accumulate(len(c) for c in chunks)]
        self._lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} of {n}")
        i = int(i) % n
        c = bisect.bisect_right(self._starts, i) - 1
        offsets, row = self._offsets[c], i - self._starts[c]
        return self._values[c][offsets[row]:offsets[row + 1]].tolist()

    def __iter__(self):
        for offsets, values in zip(self._offsets, self._values):
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
                yield values[a:b].tolist()

    def lengths(self) -> np.ndarray:
        """Each row's length, ``int32`` (computed once, from the offsets)."""
        if self._lengths is None:
            self._lengths = np.concatenate([np.zeros(0, np.int32)] + [
                np.diff(offsets).astype(np.int32, copy=False) for offsets in self._offsets])
        return self._lengths


class SplitWriter(ChunkWriter):
    """Writes one split of ``splits/`` chunk by chunk, in the layout ``save_to_disk`` gives
    (``tests/test_data.py`` compares the two), nothing of it in memory or memory-mapped
    (``save_to_disk`` would map every page into the RSS). The fingerprint is the data
    file's digest, so a rebuild writes the same bytes."""

    def __init__(self, folder: Path, split: str):
        self.folder = Path(folder) / SPLITS_DIR / split
        super().__init__(self.folder / DATA_FILE)

    def close(self) -> None:
        """Finish the data file and write the two JSON files beside it."""
        super().close()
        state = {"_data_files": [{"filename": DATA_FILE}],
                 "_fingerprint": file_sha256(self.folder / DATA_FILE)[:16],
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
                 "_output_all_columns": False, "_split": None}
        write_text(json.dumps(state, indent=2, sort_keys=True), self.folder / "state.json")
        import datasets
        from datasets.utils.py_utils import asdict  # datasets' own: defaults left out
        info = asdict(datasets.DatasetInfo(features=self.features))
        write_text(json.dumps({k: info[k] for k in sorted(info)}, indent=2),
                   self.folder / "dataset_info.json")


def save_splits(folder: Path, splits) -> None:
    """``splits/dataset_dict.json``, naming the splits that :class:`SplitWriter` wrote."""
    write_text(json.dumps({"splits": list(splits)}), Path(folder) / SPLITS_DIR /
               "dataset_dict.json")


def save_stats(folder: Path, stats: dict, config: dict) -> None:
    write_text(json.dumps(stats, indent=2), folder / "stats.json")
    write_text(json.dumps(config, indent=2, default=str), folder / "config.json")


def load_prepared(folder: Path, cache_hit: bool) -> PreparedData:
    """The prepared data in ``folder``, just built or found complete: its files are the
    ones written (the digests of ``COMPLETE``, :mod:`tinymt.data.cache`)."""
    import datasets
    stats = load_json(folder / "stats.json", "the data stats")
    splits = {s: datasets.load_from_disk(str(folder / SPLITS_DIR / s)) for s in SPLITS}
    src_tok, tgt_tok = load_tokenizers(folder / TOKENIZER)
    stats["cache_hit"] = cache_hit
    stats["cache_dir"] = str(folder)
    return PreparedData(splits, src_tok, tgt_tok, folder / TOKENIZER, stats)


def side_stats(lens: np.ndarray, unk: int) -> dict:
    """One side of one split: mean / p95 / max token count (``lens``: each sentence's) and
    the % of unknown pieces (``unk`` of them)."""
    total = int(lens.sum())
    return {
        "mean": float(lens.mean()) if len(lens) else 0.0,
        "p95": float(np.percentile(lens, 95)) if len(lens) else 0.0,
        "max": int(lens.max()) if len(lens) else 0,
        "unk_pct": 100.0 * unk / total if total else 0.0,
    }


def summary_table(stats: dict) -> str:
    """A plain-text table of the prepared data: pairs, drops, lengths, unknowns."""
    header = ("split", "pairs", "empty", "max_len", "ratio", "src mean", "src p95",
              "tgt mean", "tgt p95", "src unk%", "tgt unk%")
    rows = [header]
    for s in SPLITS:
        d, tok = stats["dropped"][s], stats["tokens"][s]
        rows.append((s, str(stats["pairs"][s]),
                     *(str(d.get(k, 0)) for k in ("empty", "max_len", "max_len_ratio")),
                     *(f"{tok[side][k]:{fmt}}" for side in ("src", "tgt")
                       for k, fmt in (("mean", ".1f"), ("p95", ".0f"))),
                     *(f"{tok[side]['unk_pct']:.2f}" for side in ("src", "tgt"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    v = stats["vocab_size"]
    vocab = f"{v['src']} joint" if stats["joint_vocab"] else f"{v['src']} src / {v['tgt']} tgt"
    return "\n".join([
        f"data: {stats['source']}",
        f"vocabulary: {vocab} pieces; tokens per sentence (no bos/eos); empty/max_len/ratio = "
        "pairs dropped by each filter (length filters: train only)", *lines,
        f"cache: {stats.get('cache_dir', '?')} ({'hit' if stats.get('cache_hit') else 'built'})"])
