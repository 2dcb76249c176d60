"""Reading a corpus: each source (builtin, hub, text, tsv) -> chunks of plain columns per
split (:func:`load_chunks`; the columns: :mod:`tinymt.data`). :func:`read_lines` is the
project's one UTF-8 line reader; :class:`ChunkWriter` and :func:`read_chunks` pass a build
through Arrow stream files, a chunk at a time.
"""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

import tinymt.corpus as corpus
from tinymt.errors import TinyMTError, first_line
from tinymt.runtime import progress_bar

if TYPE_CHECKING:  # datasets is imported where used: a second to import, which translate
    import datasets  # and serve, reading no prepared data, need not spend

SPLITS = ("train", "valid", "test")
TEXT_SUFFIXES = ("", ".gz", ".txt", ".txt.gz")
# pairs read, normalised, tokenized and written at a time: what bounds prepare's memory
CHUNK_PAIRS = 50_000
ROWS_PER_BATCH = 50_000  # rows per Arrow record batch of a file (:class:`ChunkWriter`)

Log = Callable[[str], None]
Columns = dict[str, list]  # column name -> values, one split

# the longest line read (a long paragraph is ~10,000 characters): memory stays bounded on
# an endless line (input=<a pipe>, stdin < /dev/zero), which is an error
MAX_LINE_CHARS = 100_000


def read_lines(path: str | Path) -> list[str]:
    """A UTF-8 text file (gzip by suffix) as its lines (:func:`capped_lines`): one-line
    errors for a missing file, a folder, or a line that is not UTF-8 or too long."""
    return list(iter_lines(path))


def iter_lines(path: str | Path) -> Iterator[str]:
    """:func:`read_lines` one line at a time: a file of any size in bounded memory."""
    path = Path(path).expanduser()
    try:
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as f:
            yield from capped_lines(f, str(path))
    except FileNotFoundError:
        raise TinyMTError(f"file not found: {path}") from None
    except (OSError, EOFError, zlib.error) as e:
        raise TinyMTError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def capped_lines(stream, name: str) -> Iterator[str]:
    """Lines of ``stream`` (bytes, or text) without line ends (only ``\n`` ends a line; a
    ``\r`` before it is dropped), a BOM dropped, decoded as UTF-8 line by line: at most
    ``MAX_LINE_CHARS`` characters are ever held, so an endless line is an error, not memory
    without bound. Errors name ``name`` (the file, or stdin) and the line."""
    limit = 4 * MAX_LINE_CHARS + 2  # UTF-8 takes at most 4 bytes a character; then \r\n
    for n in itertools.count(1):
        line = stream.readline(limit)
        if not line:
            return
        too_long = TinyMTError(f"{name}: line {n} is longer than {MAX_LINE_CHARS:,} characters")
        if len(line) == limit and line[-1:] not in (b"\n", "\n"):
            raise too_long  # more than `limit` bytes: more than MAX_LINE_CHARS characters
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                raise TinyMTError(f"{name}: line {n} is not valid UTF-8") from None
        line = line.removesuffix("\n").removesuffix("\r")
        if n == 1:
            line = line.removeprefix("\ufeff")
        if len(line) > MAX_LINE_CHARS:
            raise too_long
        yield line


def _find_text_file(folder: Path, split: str, lang: str) -> Path:
    candidates = [folder / f"{split}.{lang}{suffix}" for suffix in TEXT_SUFFIXES]
    if found := next((c for c in candidates if c.is_file()), None):
        return found
    names = ", ".join(c.name for c in candidates)
    raise TinyMTError(f"no {split} file for language {lang!r} in {folder} (looked for {names})")


def _split_names(cfg) -> dict[str, str]:
    return {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}


def _text_files(cfg) -> dict[str, tuple[Path, Path]]:
    folder = Path(cfg.path).expanduser()  # (not a folder: no train file found in it)
    return {ours: (_find_text_file(folder, theirs, cfg.src_lang),
                   _find_text_file(folder, theirs, cfg.tgt_lang))
            for ours, theirs in _split_names(cfg).items()}


def _tsv_file(cfg) -> Path:
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise TinyMTError(f"data.path={cfg.path}: file not found (data.source=tsv)")
    return path


def _text_chunks(src_path: Path, tgt_path: Path, split: str) -> Iterator[Columns]:
    """The pairs of two line-aligned files, ``CHUNK_PAIRS`` at a time, read as they are
    needed; a file with more lines than the other is an error naming both counts."""
    pairs, done = itertools.zip_longest(iter_lines(src_path), iter_lines(tgt_path)), 0
    while chunk := list(itertools.islice(pairs, CHUNK_PAIRS)):
        if None in chunk[-1]:  # one file ended first: count the lines of both
            n = [done, done]
            for pair in itertools.chain(chunk, pairs):
                n = [n[0] + (pair[0] is not None), n[1] + (pair[1] is not None)]
            raise TinyMTError(f"{split} files are not line-aligned: {src_path} has {n[0]} "
                              f"lines, {tgt_path} has {n[1]} lines")
        done += len(chunk)
        yield {"src": [a for a, _ in chunk], "tgt": [b for _, b in chunk]}


def select(cols: Columns, keep: list[int]) -> Columns:
    """The rows ``keep`` of every column."""
    return {name: [values[i] for i in keep] for name, values in cols.items()}


def _load_tsv(cfg, log: Log) -> dict[str, Columns]:
    path = _tsv_file(cfg)
    need = max(cfg.src_column, cfg.tgt_column) + 1
    src, tgt = [], []
    for lineno, line in enumerate(iter_lines(path), start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < need:
            raise TinyMTError(f"{path}: line {lineno} has {len(cols)} tab-separated column(s), "
                              f"but data.src_column={cfg.src_column} and data.tgt_column="
                              f"{cfg.tgt_column} need at least {need}")
        src.append(cols[cfg.src_column])
        tgt.append(cols[cfg.tgt_column])
    n, n_held = len(src), cfg.valid_size + cfg.test_size
    if n_held >= n:
        raise TinyMTError(f"{path} has {n} pairs, not enough for data.valid_size="
                          f"{cfg.valid_size} + data.test_size={cfg.test_size} and a train "
                          "split: lower them")
    perm = np.random.default_rng(cfg.split_seed).permutation(n)
    parts = {"train": perm[n_held:], "valid": perm[cfg.test_size:n_held],
             "test": perm[:cfg.test_size]}
    return {split: select({"src": src, "tgt": tgt}, np.sort(part).tolist())
            for split, part in parts.items()}


def _load_hub_dataset(cfg) -> datasets.DatasetDict:
    import datasets
    local = Path(cfg.path).expanduser()
    if local.exists():
        try:
            return datasets.load_dataset(str(local),
                                         cache_dir=str(Path(cfg.cache_dir) / "hf-datasets"))
        except Exception as e:  # noqa: BLE001  (datasets raises many types for bad folders)
            raise TinyMTError(f"data.path={cfg.path}: cannot load it as a dataset "
                              f"({first_line(e)})") from None
    try:  # datasets falls back to its local cache when the hub is unreachable or offline
        return datasets.load_dataset(cfg.path)
    except Exception as e:  # noqa: BLE001  (connection, not-found, auth... all mean "no data")
        raise TinyMTError(
            f"cannot load the Hugging Face dataset {cfg.path!r} ({first_line(e)}). Download "
            "it once with network access (HF_HUB_OFFLINE=1: no retries while offline), or "
            "point data.path at a local copy: a folder in the same layout (one file per split, "
            "e.g. train.jsonl / validation.jsonl / test.jsonl, with columns "
            f"{cfg.src_lang!r} and {cfg.tgt_lang!r}), e.g. data.path=/path/to/local/folder"
        ) from None


def _hub_side(cfg, ds: datasets.Dataset, translation: list | None, split: str, side: str,
              lang: str) -> list[str]:
    """One language of a hub split: its own column, or its key in the split's
    ``translation`` column (``translation``: that column as a list, read once for both
    sides, or None)."""
    if lang in ds.column_names:
        values = ds[lang][:]  # [:] = a plain list (a datasets Column is lazy)
    elif translation is not None:
        values = [row.get(lang) if row else None for row in translation]
        if all(v is None for v in values[:100]):
            raise TinyMTError(f"{cfg.path} split {split!r}: its translation column has no {lang!r} "
                              f"(data.{side}_lang)")
    else:
        raise TinyMTError(f"{cfg.path} split {split!r} has no column {lang!r} (data.{side}_lang); "
                          f"columns: {', '.join(ds.column_names)}")
    return ["" if v is None else str(v) for v in values]


def _load_hub(cfg, log: Log) -> dict[str, Columns]:
    dd = _load_hub_dataset(cfg)
    out = {}
    for ours, theirs in _split_names(cfg).items():
        if theirs not in dd:
            raise TinyMTError(f"{cfg.path} has no split {theirs!r} (data.{ours}_split); it has: "
                              f"{', '.join(dd)}")
        ds, sides = dd[theirs], (("src", cfg.src_lang), ("tgt", cfg.tgt_lang))
        in_translation = "translation" in ds.column_names and \
            any(lang not in ds.column_names for _, lang in sides)
        translation = ds["translation"][:] if in_translation else None
        out[ours] = {side: _hub_side(cfg, ds, translation, theirs, side, lang)
                     for side, lang in sides}
    return out


def _load_builtin(cfg, log: Log) -> dict[str, Columns]:
    """The built-in corpus's splits in ``cfg``'s direction (it makes zh -> en pairs)."""
    sizes = dict(train_size=cfg.train_size, valid_size=cfg.valid_size, test_size=cfg.test_size)
    with progress_bar(None, total=sum(sizes.values()), desc="data: generating", unit="pair") as bar:
        splits = corpus.generate_splits(cfg.split_seed, progress=lambda n: bar.update(n - bar.n),
                                        **sizes)
    out = {}
    for ours, theirs in {"train": "train", "valid": "validation", "test": "test"}.items():
        pairs = splits[theirs]
        cols = {"src": [p.zh for p in pairs], "tgt": [p.en for p in pairs],
                "src_words": [list(p.zh_words) for p in pairs],
                "tgt_words": [list(p.en_words) for p in pairs],
                "alignment": [[list(a) for a in p.alignment] for p in pairs],  # [zh_i, en_i]
                "src_relations": [[list(r) for r in p.zh_relations] for p in pairs],
                "tgt_relations": [[list(r) for r in p.en_relations] for p in pairs]}
        out[ours] = _reverse(cols) if cfg.src_lang == "en" else cols
    return out


def _reverse(cols: Columns) -> Columns:
    """The other direction: each src_* column swapped with its tgt_*, alignments turned."""
    other = {"src": "tgt", "tgt": "src"}
    out = {name: cols[other.get(name[:3], name[:3]) + name[3:]] for name in cols}
    if "alignment" in cols:
        out["alignment"] = [[[b, a] for a, b in sent] for sent in cols["alignment"]]
    return out


def _slices(cols: Columns) -> Iterator[Columns]:
    for start in range(0, len(cols["src"]), CHUNK_PAIRS):
        yield {name: values[start:start + CHUNK_PAIRS] for name, values in cols.items()}


def load_chunks(cfg, log: Log) -> dict[str, Iterator[Columns]]:
    """The raw corpus of ``cfg`` per split, as chunks of at most ``CHUNK_PAIRS`` pairs
    (``data.reverse`` applied): text files are read as the chunks are used, so a corpus of
    any size passes through in bounded memory; the other sources are loaded whole first."""
    if cfg.source == "text":
        splits = {split: _text_chunks(a, b, split) for split, (a, b) in _text_files(cfg).items()}
    else:
        load = {"builtin": _load_builtin, "hub": _load_hub, "tsv": _load_tsv}[cfg.source]
        splits = {name: _slices(cols) for name, cols in load(cfg, log).items()}
    return {name: map(_reverse, chunks) if cfg.reverse else chunks
            for name, chunks in splits.items()}


ARROW_TYPES = {
    "src": pa.string(), "tgt": pa.string(),
    "src_ids": pa.list_(pa.int32()), "tgt_ids": pa.list_(pa.int32()),
    "src_words": pa.list_(pa.string()), "tgt_words": pa.list_(pa.string()),
    "alignment": pa.list_(pa.list_(pa.int32())),
    "src_relations": pa.list_(pa.list_(pa.int32())),  # [relation, dependent, head] words
    "tgt_relations": pa.list_(pa.list_(pa.int32())),
}


def as_table(cols: Columns) -> pa.Table:
    """Plain columns as one Arrow table of the project's column types (:data:`ARROW_TYPES`)."""
    return pa.table({name: pa.array(values, type=ARROW_TYPES[name])
                     for name, values in cols.items()})


class ChunkWriter:
    """Appends chunks of columns (names from :data:`ARROW_TYPES`) to one Arrow stream file
    (datasets' ``ArrowWriter``), created by the first chunk; ``rows``: how many so far.
    Record batches of ``ROWS_PER_BATCH``: datasets' 1,000 would put metadata every ~30 KB,
    and reading it (``load_from_disk``, ``Ragged.lengths``) would map most pages."""

    def __init__(self, path: Path):
        self.path, self.rows, self.features, self._writer = Path(path), 0, None, None

    def write(self, cols: Columns) -> None:
        table = as_table(cols)
        if self._writer is None:
            from datasets import Features
            from datasets.arrow_writer import ArrowWriter
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.features = Features.from_arrow_schema(table.schema)
            self._writer = ArrowWriter(features=self.features, path=str(self.path),
                                       writer_batch_size=ROWS_PER_BATCH)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> None:
        if self._writer is not None:
            self._writer.finalize()


def read_chunks(path: Path, columns: Sequence[str] | None = None) -> Iterator[Columns]:
    """The chunks of a :class:`ChunkWriter` file as plain columns (all, or ``columns``), a
    record batch in memory at a time (read, not memory-mapped: pages once read are not kept)."""
    with pa.OSFile(str(path)) as source:
        for batch in pa.ipc.open_stream(source):
            yield {name: batch.column(name).to_pylist() for name in columns or batch.schema.names}
