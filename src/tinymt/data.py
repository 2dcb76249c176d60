"""Every corpus source -> one ``DatasetDict`` -> normalised, tokenized, filtered, cached.

``prepare(cfg)`` is the one entry point. ``cfg.source`` picks the loader:

- ``hub``: ``datasets.load_dataset(cfg.path)``, a Hugging Face dataset name or a local
  folder in the same layout; ``src_lang`` / ``tgt_lang`` name the columns (a
  ``translation`` column of ``{lang: text}`` dicts works too).
- ``text``: line-aligned plain-text files ``<path>/<split>.<lang>[.txt][.gz]``.
- ``tsv``: one TSV file (optionally .gz); ``src_column`` / ``tgt_column`` pick the columns;
  valid/test are carved off a seeded shuffle (``split_seed``, ``valid_size``, ``test_size``).
- ``builtin``: the pairs of :func:`tinymt.corpus.build_dataset_dict` (zh/en with word
  alignments), read through ``generate_splits`` when it exists (same pairs, no Arrow trip).

Every loader returns splits ``train`` / ``valid`` / ``test`` with columns ``src``, ``tgt``
(builtin adds ``src_words``, ``tgt_words`` and ``alignment`` as ``[src_i, tgt_i]`` pairs).
Then: NFKC + whitespace normalisation, empty pairs dropped, sentencepiece trained on the
train split, everything tokenized, and the length filters (``max_len``, ``max_len_ratio``)
applied **to train only** -- valid/test pairs are never dropped for length.

The result is cached under ``<cache_dir>/<hash>/`` (hash of the data config, the source
files' size+mtime, the corpus / pipeline versions). A cache is built in a temporary folder,
marked ``COMPLETE`` and renamed into place, so an interrupted run is never trusted later.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import gzip
import hashlib
import json
import os
import shutil
import time
import unicodedata
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sentencepiece as spm

from tinymt.errors import TinyMTError
from tinymt.tokenizer import UNK_ID, Tokenizer, load_tokenizers

# Bump when the processing below changes in a way that changes cached results.
PIPELINE_VERSION = 1
SPLITS = ("train", "valid", "test")
SOURCES = ("builtin", "hub", "text", "tsv")
COMPLETE = "COMPLETE"
TEXT_SUFFIXES = ("", ".gz", ".txt", ".txt.gz")
HUB_PROBE_TIMEOUT_S = 3.0
_STALE_TMP_S = 3600

Log = Callable[[str], None]
Columns = dict[str, list]  # column name -> values, one split


@dataclass
class PreparedData:
    """Tokenized splits, their tokenizers and the numbers that describe them."""

    splits: dict[str, datasets.Dataset]  # train/valid/test: src, tgt, src_ids, tgt_ids (+ builtin)
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer  # the same object when the vocabulary is joint
    tokenizer_dir: Path  # holds spm.model (joint) or src.model + tgt.model
    stats: dict
    cache_hit: bool

    def ids(self, split: str) -> tuple[list[list[int]], list[list[int]]]:
        """``(src_ids, tgt_ids)`` of a split as plain lists: index these in a training loop
        (``splits[s]["src_ids"]`` is a lazy datasets Column; indexing it row by row is slow)."""
        ds = self.splits[split]
        return ds["src_ids"][:], ds["tgt_ids"][:]

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        """Token counts (no bos/eos) per pair, straight from Arrow: TokenBatchSampler's input."""
        table = self.splits[split].with_format("arrow")
        return (
            pc.list_value_length(table["src_ids"]).to_pylist(),
            pc.list_value_length(table["tgt_ids"]).to_pylist(),
        )


# ----------------------------------------------------------------------------------------
# config helpers


def _cfg_dict(cfg) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)


def _check_config(cfg) -> None:
    if cfg.source not in SOURCES:
        raise TinyMTError(f"data.source={cfg.source!r} is not one of {', '.join(SOURCES)}")
    if cfg.source != "builtin" and not cfg.path:
        raise TinyMTError(f"data.source={cfg.source} needs data.path (it is not set)")
    if cfg.source == "builtin" and {cfg.src_lang, cfg.tgt_lang} != {"zh", "en"}:
        raise TinyMTError(
            f"the built-in corpus is zh/en: data.src_lang={cfg.src_lang!r}, "
            f"data.tgt_lang={cfg.tgt_lang!r} must be zh and en (data.reverse=true swaps them)"
        )
    if cfg.src_lang == cfg.tgt_lang:
        raise TinyMTError(f"data.src_lang and data.tgt_lang are both {cfg.src_lang!r}")
    if cfg.tokenizer_type not in ("bpe", "unigram"):
        raise TinyMTError(f"data.tokenizer_type={cfg.tokenizer_type!r}: use bpe or unigram")
    if cfg.vocab_size < 8:
        raise TinyMTError(f"data.vocab_size={cfg.vocab_size} is too small (at least 8)")
    for key in ("train_size", "valid_size", "test_size"):
        if getattr(cfg, key) < 0:
            raise TinyMTError(f"data.{key}={getattr(cfg, key)} must not be negative")


def _looks_local(path: str) -> bool:
    p = path.replace("\\", "/")
    return p.startswith(("/", "./", "../", "~")) or p.count("/") > 1 or os.path.isabs(path)


# ----------------------------------------------------------------------------------------
# reading files


def _read_text(path: Path) -> str:
    """The whole file decoded as UTF-8 (gzip by suffix), BOM dropped, errors with line no."""
    try:
        raw = path.read_bytes()
        if path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
    except FileNotFoundError:
        raise TinyMTError(f"file not found: {path}") from None
    except (OSError, EOFError, zlib.error) as e:
        raise TinyMTError(f"cannot read {path}: {e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise TinyMTError(
            f"{path}: line {line} is not valid UTF-8 ({e.reason} at byte {e.start}); "
            "convert the file to UTF-8"
        ) from None
    return text.removeprefix("\ufeff")


def _lines(text: str) -> list[str]:
    lines = text.split("\n")  # only \n: str.splitlines would also split on U+2028 etc.
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_lines(path: str | Path) -> list[str]:
    """A UTF-8 text file (gzip by suffix) as its lines, without line ends: one-line errors
    for a missing file, a folder, or bytes that are not UTF-8 (file and line named)."""
    path = Path(path)
    if path.is_dir():
        raise TinyMTError(f"{path} is a folder, not a text file")
    return _lines(_read_text(path))


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


# ----------------------------------------------------------------------------------------
# loaders: each returns {split: {"src": [...], "tgt": [...], ...}}


def _load_text(cfg, log: Log) -> dict[str, Columns]:
    out = {}
    for split, (src_path, tgt_path) in _text_files(cfg).items():
        src, tgt = read_lines(src_path), read_lines(tgt_path)
        if len(src) != len(tgt):
            raise TinyMTError(
                f"{split} files are not line-aligned: {src_path} has {len(src)} lines, "
                f"{tgt_path} has {len(tgt)} lines"
            )
        out[split] = {"src": src, "tgt": tgt}
    return out


def _load_tsv(cfg, log: Log) -> dict[str, Columns]:
    path = _tsv_file(cfg)
    need = max(cfg.src_column, cfg.tgt_column) + 1
    if min(cfg.src_column, cfg.tgt_column) < 0:
        raise TinyMTError("data.src_column and data.tgt_column must be >= 0")
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
    import huggingface_hub.constants as hub_constants

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
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TinyMTError(
                f"data.path={cfg.path}: cannot load it as a dataset ({first})"
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
        if not offline:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _hub_error(cfg, why) from None


def _load_hub(cfg, log: Log) -> dict[str, Columns]:
    dd = _load_hub_dataset(cfg, log)
    out = {}
    for ours, theirs in _split_names(cfg).items():
        key = {"train": "train_split", "valid": "valid_split", "test": "test_split"}[ours]
        if theirs not in dd:
            raise TinyMTError(
                f"{cfg.path} has no split {theirs!r} (data.{key}); it has: {', '.join(dd)}"
            )
        ds = dd[theirs]
        cols = {}
        for side, lang in (("src", cfg.src_lang), ("tgt", cfg.tgt_lang)):
            if lang in ds.column_names:
                values = ds[lang][:]  # [:] = a plain list (a datasets Column is lazy)
            elif "translation" in ds.column_names:
                values = [row.get(lang) if row else None for row in ds["translation"][:]]
                if all(v is None for v in values[:100]):
                    raise TinyMTError(
                        f"{cfg.path} split {theirs!r}: its translation column has no {lang!r} "
                        f"(data.{side}_lang)"
                    )
            else:
                raise TinyMTError(
                    f"{cfg.path} split {theirs!r} has no column {lang!r} (data.{side}_lang); "
                    f"columns: {', '.join(ds.column_names)}"
                )
            cols[side] = ["" if v is None else str(v) for v in values]
        out[ours] = cols
    return out


def _corpus_module():
    try:
        from tinymt import corpus
        from tinymt.corpus import build_dataset_dict  # noqa: F401
    except ImportError as e:
        raise TinyMTError(f"the built-in corpus (tinymt.corpus) is not available: {e}") from None
    return corpus


def _builtin_columns(cfg, corpus) -> dict[str, dict[str, list]]:
    """{corpus split: {zh, en, zh_words, en_words, alignment}} as plain lists."""
    kwargs = {
        "seed": cfg.split_seed,
        "train_size": cfg.train_size,
        "valid_size": cfg.valid_size,
        "test_size": cfg.test_size,
    }
    try:
        generate = getattr(corpus, "generate_splits", None)
        if generate is not None:  # the same pairs as build_dataset_dict, minus a slow Arrow trip
            return {
                name: {
                    "zh": [p.zh for p in pairs],
                    "en": [p.en for p in pairs],
                    "zh_words": [list(p.zh_words) for p in pairs],
                    "en_words": [list(p.en_words) for p in pairs],
                    "alignment": [[list(a) for a in p.alignment] for p in pairs],
                }
                for name, pairs in generate(**kwargs).items()
            }
        dd = corpus.build_dataset_dict(**kwargs)
    except (ValueError, RuntimeError) as e:
        raise TinyMTError(
            f"the built-in corpus cannot make {cfg.train_size}/{cfg.valid_size}/{cfg.test_size} "
            f"pairs (data.train_size/valid_size/test_size): {e}"
        ) from None
    return {name: {c: ds[c][:] for c in ds.column_names} for name, ds in dd.items()}


def _load_builtin(cfg, log: Log) -> dict[str, Columns]:
    splits = _builtin_columns(cfg, _corpus_module())
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
        }
    return out


_LOADERS = {"builtin": _load_builtin, "hub": _load_hub, "text": _load_text, "tsv": _load_tsv}


def _reverse(cols: Columns) -> Columns:
    swapped = {"src": cols["tgt"], "tgt": cols["src"]}
    if "src_words" in cols:
        swapped["src_words"], swapped["tgt_words"] = cols["tgt_words"], cols["src_words"]
    if "alignment" in cols:
        swapped["alignment"] = [[[b, a] for a, b in sent] for sent in cols["alignment"]]
    return swapped


def _load_columns(cfg, log: Log) -> dict[str, Columns]:
    _check_config(cfg)
    splits = _LOADERS[cfg.source](cfg, log)
    if cfg.reverse:
        splits = {name: _reverse(cols) for name, cols in splits.items()}
    return splits


_ARROW_TYPES = {
    "src": pa.string(),
    "tgt": pa.string(),
    "src_ids": pa.list_(pa.int32()),
    "tgt_ids": pa.list_(pa.int32()),
    "src_words": pa.list_(pa.string()),
    "tgt_words": pa.list_(pa.string()),
    "alignment": pa.list_(pa.list_(pa.int32())),
}


def _dataset(cols: Columns) -> datasets.Dataset:
    """Columns -> Dataset through one Arrow table (much faster than Dataset.from_dict)."""
    table = pa.table(
        {name: pa.array(values, type=_ARROW_TYPES[name]) for name, values in cols.items()}
    )
    return datasets.Dataset(table)


def load_source(cfg) -> datasets.DatasetDict:
    """The raw corpus of ``cfg`` as splits train/valid/test, columns src/tgt (+ builtin's).

    No normalisation, no tokenization: what the source holds, in our split/column names,
    direction already swapped when ``data.reverse`` is set.
    """
    splits = _load_columns(cfg, lambda _: None)
    return datasets.DatasetDict({name: _dataset(cols) for name, cols in splits.items()})


# ----------------------------------------------------------------------------------------
# cache key


def _stat(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _source_fingerprint(cfg) -> Any:
    if cfg.source == "builtin":
        corpus = _corpus_module()
        folder = Path(corpus.__file__).parent
        digest = hashlib.sha256()
        for f in sorted(folder.rglob("*.py")):
            digest.update(f.relative_to(folder).as_posix().encode())
            digest.update(f.read_bytes())
        version = getattr(corpus, "CORPUS_VERSION", getattr(corpus, "__version__", None))
        return {"corpus_version": version, "corpus_source": digest.hexdigest()}
    if cfg.source == "text":
        return {split: [_stat(a), _stat(b)] for split, (a, b) in _text_files(cfg).items()}
    if cfg.source == "tsv":
        return _stat(_tsv_file(cfg))
    local = Path(cfg.path).expanduser()
    if local.exists():  # hub layout in a local folder (or a single file)
        files = (
            [local]
            if local.is_file()
            else sorted(
                f
                for f in local.rglob("*")
                if f.is_file() and not any(p.startswith(".") for p in f.relative_to(local).parts)
            )
        )
        return {"local": [_stat(f) for f in files]}
    return {"hub": cfg.path}


def cache_key(cfg) -> str:
    """Hash of everything that determines the prepared data (not ``name``/``cache_dir``)."""
    _check_config(cfg)
    fields = {k: v for k, v in _cfg_dict(cfg).items() if k not in ("name", "cache_dir")}
    payload = {
        "pipeline": PIPELINE_VERSION,
        "sentencepiece": spm.__version__,
        "config": fields,
        "source": _source_fingerprint(cfg),
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_path(cfg) -> Path:
    """``<cache_dir>/<cache_key(cfg)>``: where ``prepare(cfg)`` keeps its results."""
    return Path(cfg.cache_dir) / cache_key(cfg)


# ----------------------------------------------------------------------------------------
# processing


def target_language(cfg) -> str:
    """The language the model writes: ``tgt_lang``, or ``src_lang`` when ``reverse``
    (works on a DataConfig, a DictConfig or the plain dict saved in a checkpoint)."""
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    return get("src_lang") if get("reverse", False) else get("tgt_lang", "en")


def normalize(text: str) -> str:
    """Unicode NFKC, whitespace runs collapsed to one space, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _select(cols: Columns, keep: list[int]) -> Columns:
    return {name: [values[i] for i in keep] for name, values in cols.items()}


def _encode(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Batch-encode, each distinct sentence once (generated corpora repeat many)."""
    unique = list(dict.fromkeys(texts))
    if len(unique) == len(texts):
        return tok.encode_batch(texts)
    ids = dict(zip(unique, tok.encode_batch(unique)))
    return [ids[t] for t in texts]


def _side_stats(ids: list[list[int]]) -> dict:
    lens = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    total = int(lens.sum())
    unk = sum(x.count(UNK_ID) for x in ids)
    return {
        "mean": float(lens.mean()) if len(lens) else 0.0,
        "p95": float(np.percentile(lens, 95)) if len(lens) else 0.0,
        "max": int(lens.max()) if len(lens) else 0,
        "unk_pct": 100.0 * unk / total if total else 0.0,
    }


def _describe(cfg) -> str:
    where = "" if cfg.source == "builtin" else f" {cfg.path}"
    return f"{cfg.name} ({cfg.source}{where}, {cfg.src_lang}->{cfg.tgt_lang}" + (
        ", reversed)" if cfg.reverse else ")"
    )


def _build(cfg, tmp: Path, log: Log) -> dict:
    """Load, clean, tokenize and filter into ``tmp``; returns the stats."""
    t0 = time.perf_counter()
    src_name, tgt_name = (
        (cfg.tgt_lang, cfg.src_lang) if cfg.reverse else (cfg.src_lang, cfg.tgt_lang)
    )
    log(f"data: loading {_describe(cfg)}")
    raw = _load_columns(cfg, log)
    dropped: dict[str, dict[str, int]] = {s: {} for s in SPLITS}
    splits: dict[str, Columns] = {}
    for split in SPLITS:
        cols = raw[split]
        if not cols["src"]:
            raise TinyMTError(f"the {split} split of {_describe(cfg)} has no pairs")
        src = [normalize(s) for s in cols["src"]]
        tgt = [normalize(t) for t in cols["tgt"]]
        keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s and t]
        cols = dict(cols, src=src, tgt=tgt)
        dropped[split]["empty"] = len(src) - len(keep)
        if not keep:
            raise TinyMTError(
                f"the {split} split is empty after dropping empty pairs: all {len(src)} pairs "
                "have an empty side after normalisation"
            )
        splits[split] = _select(cols, keep) if len(keep) < len(src) else cols
    t_load = time.perf_counter()

    # tokenizer: trained on the train split only
    tok_dir = tmp / "tokenizer"
    train = splits["train"]
    common = {
        "vocab_size": cfg.vocab_size,
        "model_type": cfg.tokenizer_type,
        "character_coverage": cfg.character_coverage,
    }
    if cfg.joint_vocab:
        src_tok = tgt_tok = Tokenizer.train(
            (s for side in (train["src"], train["tgt"]) for s in side),
            tok_dir / "spm.model",
            **common,
        )
    else:
        src_tok = Tokenizer.train(train["src"], tok_dir / "src.model", **common)
        tgt_tok = Tokenizer.train(train["tgt"], tok_dir / "tgt.model", **common)
    t_tok = time.perf_counter()
    log(
        f"data: trained {'joint ' if cfg.joint_vocab else ''}{cfg.tokenizer_type} tokenizer "
        f"({src_tok.vocab_size}"
        + ("" if cfg.joint_vocab else f"/{tgt_tok.vocab_size}")
        + f" pieces) in {t_tok - t_load:.1f}s"
    )

    for split in SPLITS:
        cols = splits[split]
        cols["src_ids"] = _encode(src_tok, cols["src"])
        cols["tgt_ids"] = _encode(tgt_tok, cols["tgt"])
    log(f"data: tokenized in {time.perf_counter() - t_tok:.1f}s")

    # length filters: train only
    train = splits["train"]
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
        dropped["train"][name] = before - len(keep)
        if not keep:
            value = getattr(cfg, name)
            raise TinyMTError(
                f"the train split is empty after the {name} filter (data.{name}={value} "
                f"removed all {before} remaining pairs): {fix}"
            )
    for split in ("valid", "test"):
        dropped[split].update(max_len=0, max_len_ratio=0)
    if len(keep) < n:
        splits["train"] = _select(train, keep)

    for split in SPLITS:
        d = dropped[split]
        removed = ", ".join(f"{k} {v}" for k, v in d.items() if v)
        log(
            f"data: {split}: {len(splits[split]['src'])} pairs"
            + (f" (removed: {removed})" if removed else "")
        )

    stats = {
        "name": cfg.name,
        "source": _describe(cfg),
        "direction": f"{src_name}->{tgt_name}",
        "pairs": {s: len(splits[s]["src"]) for s in SPLITS},
        "dropped": dropped,
        "joint_vocab": bool(cfg.joint_vocab),
        "vocab_size": {"src": src_tok.vocab_size, "tgt": tgt_tok.vocab_size},
        "tokens": {
            s: {"src": _side_stats(splits[s]["src_ids"]), "tgt": _side_stats(splits[s]["tgt_ids"])}
            for s in SPLITS
        },
    }

    dd = datasets.DatasetDict({s: _dataset(cols) for s, cols in splits.items()})
    dd.save_to_disk(str(tmp / "splits"))
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    return stats


def _load_cached(folder: Path, cache_hit: bool) -> PreparedData:
    stats = json.loads((folder / "stats.json").read_text())
    dd = datasets.load_from_disk(str(folder / "splits"))
    src_tok, tgt_tok = load_tokenizers(folder / "tokenizer")
    stats["cache_hit"] = cache_hit
    stats["cache_dir"] = str(folder)
    return PreparedData(
        splits={s: dd[s] for s in SPLITS},
        src_tokenizer=src_tok,
        tgt_tokenizer=tgt_tok,
        tokenizer_dir=folder / "tokenizer",
        stats=stats,
        cache_hit=cache_hit,
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _clean_stale_tmp(root: Path) -> None:
    """Remove temp folders of interrupted runs (dead process, untouched for an hour)."""
    now = time.time()
    for d in root.glob(".tmp-*"):
        try:
            pid = int(d.name.split("-")[1])
            if not _pid_alive(pid) and now - d.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(d, ignore_errors=True)
        except (IndexError, ValueError, OSError):
            continue


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
    root = Path(cfg.cache_dir)
    final = root / cache_key(cfg)
    if (final / COMPLETE).is_file():
        try:
            data = _load_cached(final, cache_hit=True)
        except Exception as e:  # noqa: BLE001  (a damaged cache is rebuilt, not trusted)
            log(f"data: cache {final} is unreadable ({type(e).__name__}: {e}); rebuilding")
            shutil.rmtree(final, ignore_errors=True)
        else:
            log(f"data: cache hit {final}")
            return data
    elif final.exists():
        log(f"data: ignoring incomplete cache {final} (no {COMPLETE} marker); rebuilding")

    root.mkdir(parents=True, exist_ok=True)
    _clean_stale_tmp(root)
    tmp = root / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}-{final.name}"
    tmp.mkdir()
    try:
        with _gc_paused():
            stats = _build(cfg, tmp, log)
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2))
        (tmp / "config.json").write_text(json.dumps(_cfg_dict(cfg), indent=2, default=str))
        (tmp / COMPLETE).write_text("ok\n")
        if final.exists():
            if (final / COMPLETE).is_file():  # another process finished first: use theirs
                shutil.rmtree(tmp, ignore_errors=True)
                return _load_cached(final, cache_hit=False)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"data: prepared in {stats['seconds']:.1f}s, cached in {final}")
    return _load_cached(final, cache_hit=False)


# ----------------------------------------------------------------------------------------
# reporting


def summary_table(stats: dict) -> str:
    """A plain-text table of the prepared data: pairs, drops, lengths, unknowns."""
    header = (
        "split",
        "pairs",
        "empty",
        "max_len",
        "ratio",
        "src mean",
        "src p95",
        "tgt mean",
        "tgt p95",
        "src unk%",
        "tgt unk%",
    )
    rows = [header]
    for s in SPLITS:
        d, tok = stats["dropped"][s], stats["tokens"][s]
        rows.append(
            (
                s,
                str(stats["pairs"][s]),
                str(d.get("empty", 0)),
                str(d.get("max_len", 0)),
                str(d.get("max_len_ratio", 0)),
                f"{tok['src']['mean']:.1f}",
                f"{tok['src']['p95']:.0f}",
                f"{tok['tgt']['mean']:.1f}",
                f"{tok['tgt']['p95']:.0f}",
                f"{tok['src']['unk_pct']:.2f}",
                f"{tok['tgt']['unk_pct']:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    v = stats["vocab_size"]
    vocab = f"{v['src']} joint" if stats["joint_vocab"] else f"{v['src']} src / {v['tgt']} tgt"
    top = [
        f"data: {stats['source']}",
        (
            f"vocabulary: {vocab} pieces; tokens per sentence (no bos/eos); "
            "empty/max_len/ratio = pairs dropped by each filter (length filters: train only)"
        ),
    ]
    bottom = [
        f"cache: {stats.get('cache_dir', '?')} ({'hit' if stats.get('cache_hit') else 'built'})"
    ]
    return "\n".join(top + lines + bottom)
