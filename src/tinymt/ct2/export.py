"""``scripts/export.py``: a run's checkpoint -> a CTranslate2 model folder, published whole.

    <out>/model.bin, config.json         CTranslate2's model (float32 or int8 weights)
    <out>/shared_vocabulary.json         our pieces in id order (or source_/target_vocabulary.json)
    <out>/spm.model                      the run's sentencepiece model(s) (or src.model, tgt.model)
    <out>/tinymt_export.json             what tinymt reads: format, quantization, languages,
                                         maximum positions, where it came from, the sha256 of
                                         every other file, and its own digest
                                         (plain JSON; all checked when the export is loaded)

The folder is built beside ``out`` and renamed into place (:func:`tinymt.files.write_folder`):
a failed export leaves nothing at ``out``, and an existing ``out`` is refused untouched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tinymt import __version__
from tinymt.ct2.convert import build_spec, require_ct2
from tinymt.data.cache import digests
from tinymt.errors import TinyMTError
from tinymt.files import check_output, write_folder, write_text
from tinymt.rundir import LoadedRun
from tinymt.tokenizer import save_tokenizers, tokenizer_digest

META = "tinymt_export.json"
FORMAT = "tinymt-ct2"


def export_run(run: LoadedRun, out: str | Path, quantization: str = "none") -> Path:
    """Write the CTranslate2 model of ``run``'s loaded checkpoint to the new folder ``out``."""
    check_output(out, "out", folder=True)
    ct2 = require_ct2()
    spec = build_spec(run.model, run.src_tokenizer, run.tgt_tokenizer, quantization)
    data = run.config.get("data", {}) or {}
    meta = {  # what load_export reads back
        "format": FORMAT, "quantization": quantization,
        "tinymt_version": __version__, "ctranslate2_version": ct2.__version__,
        "from": {"run_dir": str(run.run_dir), "checkpoint": str(run.checkpoint),
                 "step": run.state.get("step")},
        "tokenizer_sha256": tokenizer_digest(run.src_tokenizer, run.tgt_tokenizer),
        "joint_vocab": run.src_tokenizer is run.tgt_tokenizer,
        "data": {k: data.get(k) for k in ("name", "src_lang", "tgt_lang", "reverse")},
        "model": dict(run.state["model_config"]),
        "max_positions": run.model.max_positions,
    }

    def build(tmp: Path) -> None:
        spec.save(str(tmp))
        save_tokenizers(tmp, run.src_tokenizer, run.tgt_tokenizer)
        # every file but this one: all that decides the export's output
        signed = {**meta, "files": digests(tmp, META)}
        signed["meta_sha256"] = meta_digest(signed)
        write_text(json.dumps(signed, indent=2) + "\n", tmp / META)

    if not write_folder(build, out):
        raise TinyMTError(f"{out} appeared while it was being written: left as it is")
    return Path(out)


def meta_digest(meta: dict) -> str:
    """sha256 of the description itself (``meta_sha256`` left out), in a canonical JSON
    spelling: a bit flipped anywhere in tinymt_export.json is caught."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=True,
                                     separators=(",", ":")).encode("ascii")).hexdigest()
