"""Reading a corpus: each source (builtin, hub, text, tsv) -> plain columns per split.

:func:`load_chunks` gives, per split train / valid / test, chunks of columns
``{"src": [...], "tgt": [...]}``, a text corpus read as the chunks are used (builtin adds
``src_words``, ``tgt_words``, ``alignment`` as ``[src_i, tgt_i]`` pairs and
``src_relations`` / ``tgt_relations`` as ``[relation, dependent, head]``
triples of word indices). :func:`read_lines` is the project's one UTF-8 line reader.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import datasets
import huggingface_hub.constants as hub_constants
import numpy as np
import pyarrow as pa

import tinymt.corpus as corpus
from tinymt.config import check_data
from tinymt.errors import TinyMTError, first_line

SPLITS = ("train", "valid", "test")
TEXT_SUFFIXES = ("", ".gz", ".txt", ".txt.gz")
HUB_PROBE_TIMEOUT_S = 3.0
# pairs read, normalised, tokenized and written at a time: what bounds prepare's memory
CHUNK_PAIRS = 50_000

Log = Callable[[str], None]
Columns = dict[str, list]  # column name -> values, one split


# ----------------------------------------------------------------------------------------
# reading files


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
    if path.is_dir():
        raise TinyMTError(f"{path} is a folder, not a text file")
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
    for c in candidates:
        if c.is_file():
            return c
    names = ", ".join(c.name for c in candidates)
    raise TinyMTError(f"no {split} file for language {lang!r} in {folder} (looked for {names})")


def _text_folder(cfg) -> Path:
    folder = Path(cfg.path).expanduser()
    if not folder.is_dir():
        raise TinyMTError(f"data.path={cfg.path}: folder not found (data.source=text)")
    return folder


def _split_names(cfg) -> dict[str, str]:
    return {"train": cfg.train_split, "valid": cfg.valid_split, "test": cfg.test_split}


def _text_files(cfg) -> dict[str, tuple[Path, Path]]:
    folder = _text_folder(cfg)
    return {
        ours: (
            _find_text_file(folder, theirs, cfg.src_lang),
            _find_text_file(folder, theirs, cfg.tgt_lang),
        )
        for ours, theirs in _split_names(cfg).items()
    }


def _tsv_file(cfg) -> Path:
    path = Path(cfg.path).expanduser()
    if not path.is_file():
        raise TinyMTError(f"data.path={cfg.path}: file not found (data.source=tsv)")
    return path


def _looks_local(path: str) -> bool:
    p = path.replace("\\", "/")
    return p.startswith(("/", "./", "../", "~")) or p.count("/") > 1 or os.path.isabs(path)


# ----------------------------------------------------------------------------------------
# loaders: each returns {split: {"src": [...], "tgt": [...], ...}}


def _text_chunks(src_path: Path, tgt_path: Path, split: str) -> Iterator[Columns]:
    """The pairs of two line-aligned files, ``CHUNK_PAIRS`` at a time, read as they are
    needed; a file with more lines than the other is an error naming both counts."""
    src_lines, tgt_lines = iter_lines(src_path), iter_lines(tgt_path)
    n, chunk = 0, {"src": [], "tgt": []}
    for a in src_lines:
        b = next(tgt_lines, None)
        if b is None:
            _not_aligned(split, src_path, n + 1 + sum(1 for _ in src_lines), tgt_path, n)
        n += 1
        chunk["src"].append(a)
        chunk["tgt"].append(b)
        if n % CHUNK_PAIRS == 0:
            yield chunk
            chunk = {"src": [], "tgt": []}
    rest = sum(1 for _ in tgt_lines)
    if rest:
        _not_aligned(split, src_path, n, tgt_path, n + rest)
    if chunk["src"]:
        yield chunk


def _not_aligned(split: str, src_path: Path, src_n: int, tgt_path: Path, tgt_n: int):
    raise TinyMTError(f"{split} files are not line-aligned: {src_path} has {src_n} lines, "
                      f"{tgt_path} has {tgt_n} lines")


def _load_text(cfg, log: Log) -> dict[str, Iterator[Columns]]:
    return {split: _text_chunks(src_path, tgt_path, split)
            for split, (src_path, tgt_path) in _text_files(cfg).items()}


def _load_tsv(cfg, log: Log) -> dict[str, Columns]:
    path = _tsv_file(cfg)
    need = max(cfg.src_column, cfg.tgt_column) + 1
    src, tgt = [], []
    for lineno, line in enumerate(read_lines(path), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < need:
            raise TinyMTError(
                f"{path}: line {lineno} has {len(cols)} tab-separated column(s), but "
                f"data.src_column={cfg.src_column} and data.tgt_column={cfg.tgt_column} need "
                f"at least {need}"
            )
        src.append(cols[cfg.src_column])
        tgt.append(cols[cfg.tgt_column])
    n, n_held = len(src), cfg.valid_size + cfg.test_size
    if n_held >= n:
        raise TinyMTError(
            f"{path} has {n} pairs, not enough for data.valid_size={cfg.valid_size} + "
            f"data.test_size={cfg.test_size} and a train split: lower them"
        )
    perm = np.random.default_rng(cfg.split_seed).permutation(n)
    parts = {
        "test": np.sort(perm[: cfg.test_size]),
        "valid": np.sort(perm[cfg.test_size : n_held]),
        "train": np.sort(perm[n_held:]),
    }
    return {
        split: {"src": [src[i] for i in idx.tolist()], "tgt": [tgt[i] for i in idx.tolist()]}
        for split, idx in ((s, parts[s]) for s in SPLITS)
    }


@contextlib.contextmanager
def _offline_mode():
    """Force datasets / huggingface_hub offline (use the local HF cache, no retries)."""
    saved = (datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def _hub_reachable() -> bool:
    request = urllib.request.Request(datasets.config.HF_ENDPOINT, method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=HUB_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
    return True


def _hub_error(cfg, why: str) -> TinyMTError:
    return TinyMTError(
        f"cannot load the Hugging Face dataset {cfg.path!r} ({why}). Download it once with "
        "network access, or point data.path at a local copy: a folder in the same layout "
        "(one file per split, e.g. train.jsonl / validation.jsonl / test.jsonl, with columns "
        f"{cfg.src_lang!r} and {cfg.tgt_lang!r}), e.g. data.path=/path/to/local/folder"
    )


def _load_hub_dataset(cfg, log: Log) -> datasets.DatasetDict:
    local = Path(cfg.path).expanduser()
    if local.exists():
        try:
            return datasets.load_dataset(
                str(local), cache_dir=str(Path(cfg.cache_dir) / "hf-datasets")
            )
        except Exception as e:  # noqa: BLE001  (datasets raises many types for bad folders)
            raise TinyMTError(
                f"data.path={cfg.path}: cannot load it as a dataset ({first_line(e)})"
            ) from None
    if _looks_local(cfg.path):
        raise TinyMTError(f"data.path={cfg.path}: folder not found (data.source=hub)")
    offline = bool(datasets.config.HF_HUB_OFFLINE)
    why = "HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
    if not offline and not _hub_reachable():
        log(f"data: {datasets.config.HF_ENDPOINT} is unreachable; trying the local HF cache")
        offline = True
        why = f"{datasets.config.HF_ENDPOINT} is unreachable and it is not in the local cache"
    try:
        with _offline_mode() if offline else contextlib.nullcontext():
            return datasets.load_dataset(cfg.path)
    except Exception as e:  # noqa: BLE001  (connection, not-found, auth... all mean "no data")
        raise _hub_error(cfg, why if offline else first_line(e)) from None


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
            raise TinyMTError(
                f"{cfg.path} split {split!r}: its translation column has no {lang!r} "
                f"(data.{side}_lang)"
            )
    else:
        raise TinyMTError(
            f"{cfg.path} split {split!r} has no column {lang!r} (data.{side}_lang); "
            f"columns: {', '.join(ds.column_names)}"
        )
    return ["" if v is None else str(v) for v in values]


def _load_hub(cfg, log: Log) -> dict[str, Columns]:
    dd = _load_hub_dataset(cfg, log)
    out = {}
    for ours, theirs in _split_names(cfg).items():
        if theirs not in dd:
            raise TinyMTError(
                f"{cfg.path} has no split {theirs!r} (data.{ours}_split); it has: {', '.join(dd)}"
            )
        ds, sides = dd[theirs], (("src", cfg.src_lang), ("tgt", cfg.tgt_lang))
        in_translation = "translation" in ds.column_names and \
            any(lang not in ds.column_names for _, lang in sides)
        translation = ds["translation"][:] if in_translation else None
        out[ours] = {side: _hub_side(cfg, ds, translation, theirs, side, lang)
                     for side, lang in sides}
    return out


def _builtin_columns(cfg) -> dict[str, dict[str, list]]:
    """{corpus split: {zh, en, zh_words, en_words, alignment, zh_relations,
    en_relations}} as plain lists."""
    try:
        splits = corpus.generate_splits(
            seed=cfg.split_seed,
            train_size=cfg.train_size,
            valid_size=cfg.valid_size,
            test_size=cfg.test_size,
        )
    except (ValueError, RuntimeError) as e:
        raise TinyMTError(
            f"the built-in corpus cannot make {cfg.train_size}/{cfg.valid_size}/{cfg.test_size} "
            f"pairs (data.train_size/valid_size/test_size): {e}"
        ) from None
    return {
        name: {
            "zh": [p.zh for p in pairs],
            "en": [p.en for p in pairs],
            "zh_words": [list(p.zh_words) for p in pairs],
            "en_words": [list(p.en_words) for p in pairs],
            "alignment": [[list(a) for a in p.alignment] for p in pairs],
            "zh_relations": [[list(r) for r in p.zh_relations] for p in pairs],
            "en_relations": [[list(r) for r in p.en_relations] for p in pairs],
        }
        for name, pairs in splits.items()
    }


def _load_builtin(cfg, log: Log) -> dict[str, Columns]:
    splits = _builtin_columns(cfg)
    names = {"train": "train", "valid": "validation", "test": "test"}
    out = {}
    for ours, theirs in names.items():
        cols = splits[theirs]
        alignment = cols["alignment"]  # [zh_i, en_i] pairs
        if cfg.src_lang == "en":
            alignment = [[[b, a] for a, b in sent] for sent in alignment]
        out[ours] = {
            "src": cols[cfg.src_lang],
            "tgt": cols[cfg.tgt_lang],
            "src_words": cols[f"{cfg.src_lang}_words"],
            "tgt_words": cols[f"{cfg.tgt_lang}_words"],
            "alignment": alignment,
            "src_relations": cols[f"{cfg.src_lang}_relations"],
            "tgt_relations": cols[f"{cfg.tgt_lang}_relations"],
        }
    return out


_LOADERS = {"builtin": _load_builtin, "hub": _load_hub, "tsv": _load_tsv}  # in memory
_STREAMS = {"text": _load_text}  # read as they are used


def _reverse(cols: Columns) -> Columns:
    swapped = {"src": cols["tgt"], "tgt": cols["src"]}
    if "src_words" in cols:
        swapped["src_words"], swapped["tgt_words"] = cols["tgt_words"], cols["src_words"]
    if "alignment" in cols:
        swapped["alignment"] = [[[b, a] for a, b in sent] for sent in cols["alignment"]]
    if "src_relations" in cols:
        swapped["src_relations"] = cols["tgt_relations"]
        swapped["tgt_relations"] = cols["src_relations"]
    return swapped


def _slices(cols: Columns) -> Iterator[Columns]:
    n = len(cols["src"])
    for start in range(0, n, CHUNK_PAIRS):
        yield {name: values[start:start + CHUNK_PAIRS] for name, values in cols.items()}


def load_chunks(cfg, log: Log) -> dict[str, Iterator[Columns]]:
    """The raw corpus of ``cfg`` per split, as chunks of at most ``CHUNK_PAIRS`` pairs
    (``data.reverse`` applied): text files are read as the chunks are used, so a corpus of
    any size passes through in bounded memory; the other sources are loaded whole first."""
    check_data(cfg)
    if cfg.source in _STREAMS:
        splits = _STREAMS[cfg.source](cfg, log)
    else:
        splits = {name: _slices(cols) for name, cols in _LOADERS[cfg.source](cfg, log).items()}
    if cfg.reverse:
        return {name: map(_reverse, chunks) for name, chunks in splits.items()}
    return splits


def load_columns(cfg, log: Log) -> dict[str, Columns]:
    """The raw corpus of ``cfg`` as plain columns per split (all of it in memory)."""
    out = {}
    for name, chunks in load_chunks(cfg, log).items():
        cols: Columns = {}
        for chunk in chunks:
            for key, values in chunk.items():
                cols.setdefault(key, []).extend(values)
        out[name] = cols or {"src": [], "tgt": []}
    return out


ARROW_TYPES = {
    "src": pa.string(),
    "tgt": pa.string(),
    "src_ids": pa.list_(pa.int32()),
    "tgt_ids": pa.list_(pa.int32()),
    "src_words": pa.list_(pa.string()),
    "tgt_words": pa.list_(pa.string()),
    "alignment": pa.list_(pa.list_(pa.int32())),
    "src_relations": pa.list_(pa.list_(pa.int32())),  # [relation, dependent, head] words
    "tgt_relations": pa.list_(pa.list_(pa.int32())),
}


def as_table(cols: Columns) -> pa.Table:
    """Plain columns as one Arrow table of the project's column types (:data:`ARROW_TYPES`)."""
    return pa.table({name: pa.array(values, type=ARROW_TYPES[name])
                     for name, values in cols.items()})


def to_dataset(cols: Columns) -> datasets.Dataset:
    """Columns -> Dataset through one Arrow table (much faster than Dataset.from_dict)."""
    return datasets.Dataset(as_table(cols))
