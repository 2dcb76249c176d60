"""``scripts/export.py``: a run's checkpoint -> a CTranslate2 model folder, published whole.

    <out>/model.bin, config.json         CTranslate2's model (float32 or int8 weights)
    <out>/shared_vocabulary.json         our pieces in id order (or source_/target_vocabulary.json)
    <out>/spm.model (+ spm.vocab)        the run's sentencepiece model(s) (or src.model, tgt.model)
    <out>/tinymt_export.json             what tinymt reads: format, quantization, languages,
                                         maximum positions, where it came from, the sha256 of
                                         every other file but the README, and its own digest
                                         (plain JSON; all checked when the export is loaded)
    <out>/README.md                      how to load it, with tinymt or with plain Python

The folder is built beside ``out`` and renamed into place (:func:`tinymt.files.write_folder`):
a failed export leaves nothing at ``out``, and an existing ``out`` is refused untouched.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tinymt import __version__
from tinymt.checkpoint import file_sha256
from tinymt.ct2.convert import build_spec, require_ct2
from tinymt.errors import TinyMTError
from tinymt.files import check_output, write_folder, write_text
from tinymt.rundir import LoadedRun
from tinymt.tokenizer import save_tokenizers, tokenizer_digest

META = "tinymt_export.json"
README = "README.md"
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
        # every file but these two: all that decides the export's output
        signed = {**meta, "files": {f.name: file_sha256(f) for f in sorted(tmp.iterdir())
                                    if f.is_file() and f.name not in (META, README)}}
        signed["meta_sha256"] = meta_digest(signed)
        write_text(json.dumps(signed, indent=2) + "\n", tmp / META)
        write_text(readme(meta, str(out)), tmp / README)

    if not write_folder(build, out):
        raise TinyMTError(f"{out} appeared while it was being written: left as it is")
    return Path(out)


def meta_digest(meta: dict) -> str:
    """sha256 of the description itself (``meta_sha256`` left out), in a canonical JSON
    spelling: a bit flipped anywhere in tinymt_export.json is caught."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=True,
                                     separators=(",", ":")).encode("ascii")).hexdigest()


def readme(meta: dict, name: str) -> str:
    """How to use the export, written beside it."""
    sp = ("spm.model", "spm.model") if meta["joint_vocab"] else ("src.model", "tgt.model")
    d, cap = meta["data"], meta["max_positions"] - 1
    return f"""# {name}: a tinymt model for CTranslate2

{d.get('src_lang')} -> {d.get('tgt_lang')}{' (reversed)' if d.get('reverse') else ''}, \
weights {'int8' if meta['quantization'] == 'int8' else 'float32'}, exported by tinymt \
{meta['tinymt_version']} (CTranslate2 {meta['ctranslate2_version']}) from
`{meta['from']['checkpoint']}`. Details: `tinymt_export.json`.

With tinymt (the same options, outputs and `ref=` scoring as the PyTorch engine):

    python scripts/translate.py engine=ct2 model_dir={name} decode.beam=5 "a sentence"

With plain Python (`pip install ctranslate2 sentencepiece`):

    import ctranslate2, sentencepiece as spm
    src, tgt = spm.SentencePieceProcessor(model_file="{name}/{sp[0]}"), \
spm.SentencePieceProcessor(model_file="{name}/{sp[1]}")
    translator = ctranslate2.Translator("{name}", device="cpu")
    pieces = src.encode("a sentence", out_type=str)      # the source EOS is added for you
    limit = min(int(1.5 * (len(pieces) + 1) + 10), {cap})  # tinymt's decode.max_len_a/b
    result = translator.translate_batch(
        [pieces], beam_size=5, length_penalty=1.0, max_decoding_length=limit,
        min_decoding_length=0, return_end_token=True, max_input_length=0,
        suppress_sequences=[["<pad>"], ["<s>"]])[0]
    out = [p for p in result.hypotheses[0] if p != "</s>"]
    print(tgt.decode(out))

Normalise the input as tinymt does (Unicode NFKC, whitespace runs collapsed) for the same
results. Beam search here is CTranslate2's (the beam stays full): the PyTorch engine gives the
same translations with `decode.beam_rule=full`; its default rule, `shrink`, differs on a few. Sources longer than {cap} pieces need truncating first (the position tables hold
{meta['max_positions']} positions).
"""
