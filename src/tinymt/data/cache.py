"""Where prepared data is cached (``<cache_dir>/<cache_key>/``), and how an entry is
marked complete (``COMPLETE``: every file's digest) and checked when it is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import sentencepiece as spm
from omegaconf import OmegaConf

import tinymt.corpus as corpus
from tinymt.checkpoint import file_sha256
from tinymt.config import check_data
from tinymt.data.prepared import PreparedData, load_prepared
from tinymt.data.sources import Log, _text_files, _tsv_file
from tinymt.errors import TinyMTError
from tinymt.files import load_json, write_text

# Bump when the processing changes in a way that changes cached results.
PIPELINE_VERSION = 2
COMPLETE = "COMPLETE"


def config_dict(cfg) -> dict[str, Any]:
    """A ``DataConfig`` or its ``DictConfig`` (what Hydra hands over) as a plain dict."""
    return (dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg)
            else OmegaConf.to_container(cfg, resolve=True))


def _stat(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _source_fingerprint(cfg) -> Any:
    if cfg.source == "builtin":  # the generator's code: its sentences change with it
        folder, digest = Path(corpus.__file__).parent, hashlib.sha256()
        for f in sorted(folder.rglob("*.py")):
            digest.update(f.relative_to(folder).as_posix().encode())
            digest.update(f.read_bytes())
        return {"corpus_source": digest.hexdigest()}
    if cfg.source == "text":
        return {split: [_stat(a), _stat(b)] for split, (a, b) in _text_files(cfg).items()}
    if cfg.source == "tsv":
        return _stat(_tsv_file(cfg))
    local = Path(cfg.path).expanduser()
    if not local.exists():
        return {"hub": cfg.path}
    try:  # hub layout in a local folder: its files, hidden ones aside
        return {"local": [_stat(f) for f in sorted(local.rglob("*")) if f.is_file() and
                          not any(p.startswith(".") for p in f.relative_to(local).parts)]}
    except FileNotFoundError as e:  # (a file removed while it is listed)
        raise TinyMTError(f"data.path={cfg.path} changed while it was read ({e.filename} "
                          "is gone); run again once it is complete") from None


# data keys the prepared folder does not depend on: labels, where it lives, and the
# train-time segmentation sampling (tinymt.data.sampling), drawn afresh by every run
NOT_CACHED = ("name", "cache_dir", "sampling_alpha", "sampling_nbest_size")


def cache_key(cfg) -> str:
    """Hash of everything that determines the prepared data (not :data:`NOT_CACHED`)."""
    check_data(cfg)
    fields = {k: v for k, v in config_dict(cfg).items() if k not in NOT_CACHED}
    payload = {"pipeline": PIPELINE_VERSION, "sentencepiece": spm.__version__,
               "config": fields, "source": _source_fingerprint(cfg)}
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cache_path(cfg) -> Path:
    """``<cache_dir>/<cache_key(cfg)>``: where ``prepare(cfg)`` keeps its results."""
    return Path(cfg.cache_dir) / cache_key(cfg)


def load_complete(final: Path, log: Log) -> PreparedData | None:
    """The entry at ``final`` if its files are those its ``COMPLETE`` marker records;
    else None: a damaged entry (a missing marker too) is left where it is, for
    :func:`tinymt.files.write_folder` to replace once a new one is complete. Any other
    error reading it is raised as it is, and the entry is kept."""
    if not final.exists():
        return None
    if damage := entry_damage(final):
        log(f"data: cache {final} is damaged ({damage}); rebuilding")
        return None
    log(f"data: cache hit {final}")
    return load_prepared(final, cache_hit=True)


def digests(folder: Path, marker: str = COMPLETE) -> dict[str, str]:
    """sha256 of every file under ``folder`` but its ``marker`` (their record), by relative path."""
    return {f.relative_to(folder).as_posix(): file_sha256(f) for f in sorted(folder.rglob("*"))
            if f.is_file() and f.name != marker}


def entry_damage(folder: Path) -> str | None:
    """Why a file of the entry is not the one that was written (a flipped bit in a token
    id would otherwise be read as another token), or why its marker is unreadable; None:
    every file is."""
    try:
        recorded = load_json(folder / COMPLETE, f"its {COMPLETE} marker").get("files")
    except TinyMTError as e:
        return str(e)
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        return f"{folder / COMPLETE} holds no {{file: sha256}} record"
    found = digests(folder)
    if found.keys() != recorded.keys():
        return "files are missing or were added"
    changed = next((name for name, h in found.items() if recorded[name] != h), None)
    return changed and f"{changed} was changed after it was written"


def mark_complete(tmp: Path) -> None:
    """Write ``COMPLETE``: the digest of every file of the entry built in ``tmp``."""
    write_text(json.dumps({"files": digests(tmp)}, indent=1) + "\n", tmp / COMPLETE)


def replaceable(final: Path, found: float | None) -> bool:
    """Whether the entry now at ``final`` is the damaged or incomplete one found before
    building (modification time ``found``), to be replaced; False: another process
    published a complete one meanwhile, which is kept."""
    return not (final / COMPLETE).is_file() or final.stat().st_mtime == found
