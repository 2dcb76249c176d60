"""Translating with an exported model: ``translate.py engine=ct2``, the benchmark's rows.

:func:`translate_export_ids` takes and returns what :func:`tinymt.decoding.translate_ids`
does, so all around it is the same for both engines; how it maps our decoding rules onto
``translate_batch``: docs/architecture.md's table (tests/test_export.py holds it to ours).

:func:`load_export` refuses a folder, in one line naming the file, unless each file's digest
and then :func:`check_files` pass (what they check, and cannot: docs/reliability.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tinymt.checkpoint import file_sha256
from tinymt.config import as_model_config
from tinymt.ct2.convert import QUANTIZATIONS, build_spec, require_ct2
from tinymt.ct2.export import FORMAT, META, meta_digest
from tinymt.decoding import check_beam, max_output_length
from tinymt.decoding.search import Hyps
from tinymt.errors import TinyMTError, first_line
from tinymt.files import load_json
from tinymt.model import Transformer
from tinymt.runtime import progress_bar
from tinymt.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, load_tokenizers


@dataclass
class LoadedExport:
    """An exported model, ready to translate: the counterpart of ``rundir.LoadedRun``."""

    translator: object  # ctranslate2.Translator
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    meta: dict  # tinymt_export.json
    path: Path

    @property
    def max_positions(self) -> int:
        return int(self.meta["max_positions"])

    @property
    def config(self) -> dict:
        """The training config's ``data`` part, as ``LoadedRun.config`` holds it."""
        return {"data": self.meta.get("data", {})}


def read_meta(path: Path) -> dict:
    """``tinymt_export.json`` of ``path`` (plain JSON: reading it runs nothing), checked."""
    file = path / META  # (a missing folder: no META either)
    if not os.path.lexists(file):
        raise TinyMTError(f"model_dir={path} is not a tinymt CTranslate2 export (no {META}); "
                          "make one with scripts/export.py")
    # a regular file of at most 1 MiB, UTF-8 JSON: else one line naming it
    meta = load_json(file, "the export's description", top=object)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TinyMTError(f"{file} is not a tinymt CTranslate2 export description")
    if meta_digest(meta) != meta.get("meta_sha256"):  # (missing or not a digest: the same)
        raise TinyMTError(f"{file} was changed after export (its contents do not match its "
                          "meta_sha256); re-export the model")
    if problem := _shape_problem(meta):
        raise TinyMTError(f"{file} is damaged ({problem}); re-export the model")
    return meta


def _shape_problem(meta: dict) -> str | None:
    """What is wrong with the keys and types of a description (None: nothing)."""
    if meta.get("quantization") not in tuple(QUANTIZATIONS):
        return f"quantization: expected one of {', '.join(QUANTIZATIONS)}"
    data = meta.get("data")
    if not isinstance(data, dict) or data.get("reverse") not in (None, True, False) or any(
            not isinstance(data.get(k), str | None) for k in ("name", "src_lang", "tgt_lang")):
        return "data: expected {name, src_lang, tgt_lang: strings, reverse: true/false}"
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        return "files: expected {file name: sha256}"
    for name in files:  # (a digest that is not the file's: verify_files says so)
        if name in ("", ".", "..", META) or Path(name).name != name or "\\" in name:
            return f"files: {name!r}: expected a file name of the export"
    return None


def verify_files(path: Path, meta: dict) -> None:
    """Every file recorded in ``meta["files"]`` is there with the bytes exported; else one
    line naming the file."""
    for name, digest in meta["files"].items():
        file = path / name
        if not file.is_file():
            raise TinyMTError(f"{file} is missing: {path} was changed after export; "
                              "re-export the model with scripts/export.py")
        try:
            same = file_sha256(file) == digest
        except OSError as e:
            raise TinyMTError(f"cannot read {file}: {e.strerror}") from None
        if not same:
            raise TinyMTError(f"{file} was changed after export; re-export the model with "
                              "scripts/export.py")


def load_export(path: str | Path, device: str = "auto", threads: int = 0) -> LoadedExport:
    """An export written by ``scripts/export.py``; ``threads``: CTranslate2's intra-op
    threads (0 = its default). Nothing in the folder is unpickled or executed."""
    path = Path(path)
    meta = read_meta(path)
    verify_files(path, meta)
    src_tok, tgt_tok = load_tokenizers(path)  # the ones exported: their digests are in meta
    ct2 = require_ct2()
    check_files(path, meta, src_tok, tgt_tok)
    kind, _, index = device.partition(":")  # our device= as CTranslate2's (mps: it refuses)
    try:
        translator = ct2.Translator(str(path), device=kind, device_index=int(index or 0),
                                    intra_threads=threads)
    except (RuntimeError, ValueError, OSError) as e:
        raise TinyMTError(f"model_dir={path}: CTranslate2 cannot load it ({first_line(e)})"
                          ) from None
    return LoadedExport(translator, src_tok, tgt_tok, meta, path)


def check_files(path: Path, meta: dict, src_tok: Tokenizer, tgt_tok: Tokenizer) -> None:
    """All of the export that CTranslate2 and tinymt read but the weights' values (module
    docstring) is what ``export_run`` writes for an untrained model of ``meta["model"]`` and
    these tokenizers; else one line naming the file and the first difference."""
    try:
        cfg = as_model_config(meta.get("model"), max(src_tok.vocab_size, tgt_tok.vocab_size))
    except TinyMTError as e:
        raise TinyMTError(f"{path / META} is damaged ({e}); re-export the model") from None
    with torch.random.fork_rng(devices=[]):  # (the caller's random draws stay the same)
        model = Transformer(cfg, src_tok.vocab_size, tgt_tok.vocab_size, src_tok is tgt_tok)
    spec = build_spec(model, src_tok, tgt_tok, meta["quantization"])
    ct2 = require_ct2()
    src, tgt = (t.pieces(range(t.vocab_size)) for t in (src_tok, tgt_tok))
    want = {  # file -> what export_run writes there (a list as {index: item})
        META: {"max_positions": cfg.max_positions},
        "config.json": json.loads(json.dumps(spec.config.to_dict())),
        **{f"{k}_vocabulary.json": dict(enumerate(v)) for k, v in  # (as CTranslate2 saves)
           ({"shared": src} if src == tgt else {"source": src, "target": tgt}).items()},
        "model.bin": _layout([
            ("format", (ct2.specs.model_spec.CURRENT_BINARY_VERSION, spec.name, spec.revision)),
            *((n, v if isinstance(v, str) else (tuple(v.shape), v.dtype, v.num_bytes(),
                                                None if v.shape else v.to_bytes()))
              for n, v in spec.variables(ordered=True))])}
    for name, expected in want.items():
        got = ({k: meta[k] for k in expected if k in meta} if name == META else
               read_model_bin(path / name, len(expected)) if name == "model.bin" else
               load_json(path / name, "the export's file", max_bytes=64 << 20, top=object))
        got = dict(enumerate(got)) if isinstance(got, list) else got
        for key in [*expected, *(k for k in got if k not in expected)]:
            a, b = (repr(d[key]) if key in d else "none" for d in (got, expected))
            if a != b:  # (by repr: 0 is not false)
                raise TinyMTError(f"{path / name} is not what scripts/export.py writes for this "
                                  f"model with CTranslate2 {ct2.__version__} ({key}: {a}, "
                                  f"expected {b}): re-export the model")


def _layout(named: list) -> dict:
    """``{name: (shape, type, bytes, a scalar's value)}`` of a model.bin's ``[(name, those or
    an alias's target)]``, an alias as its target and its target's scale (CTranslate2 stores
    equal arrays once, which ones does not matter)."""
    layout = {n: v for n, v in named if not isinstance(v, str)}
    for alias, target in ((n, v) for n, v in named if isinstance(v, str)):
        layout[alias] = layout.get(target, f"an alias of {target!r}")
        if f"{target}_scale" in layout:
            layout[f"{alias}_scale"] = layout[f"{target}_scale"]
    return layout


def read_model_bin(file: Path, most: int) -> dict:
    """:func:`_layout` of a model.bin, ``format`` first, read as ``ModelSpec._serialize``
    writes it (CTranslate2 has no Python reader of it): weights skipped, never read; counts
    at most ``most``, every other number within the file's size. Truncated or malformed:
    ``format`` says where."""
    types = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # CTranslate2's ids
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size

        def num(n_bytes: int, most: int = size) -> int:  # little-endian, unsigned
            data = f.read(n_bytes)
            if len(data) < n_bytes or int.from_bytes(data, "little") > most:
                raise ValueError
            return int.from_bytes(data, "little")

        def string() -> str:  # (UTF-8, its NUL at the end)
            if (raw := f.read(num(2)))[-1:] != b"\0":
                raise ValueError
            return raw[:-1].decode()

        try:
            named = [("format", (num(4), string(), num(4)))]
            for _ in range(num(4, most)):
                name, shape = string(), tuple(num(4) for _ in range(num(1)))
                dtype, nbytes = types[num(1)], num(4)
                scalar = None if shape or nbytes > 8 else f.read(nbytes)
                if scalar is None and f.seek(nbytes, 1) > size:
                    raise ValueError
                named.append((name, (shape, dtype, nbytes, scalar)))
            named += [(string(), string()) for _ in range(num(4, most))]
            if f.tell() != size:
                raise ValueError
        except (ValueError, IndexError):  # (UnicodeDecodeError is a ValueError)
            return {"format": f"truncated or malformed at byte {f.tell():,}"}
    return _layout(named)


def export_attention(export: LoadedExport, src: Sequence[int], out: Sequence[int]):
    """``(len(out), len(src))``: each output token's attention on the source, teacher-forced
    on ``out`` (the export's alignment heads: the last layer's, averaged)."""
    [res] = export.translator.translate_batch(
        [export.src_tokenizer.pieces(src)], target_prefix=[export.tgt_tokenizer.pieces(out)],
        beam_size=1, max_decoding_length=len(out) + 1, min_decoding_length=0,
        return_attention=True, max_input_length=0)
    return np.asarray(res.attention[0], dtype=np.float32)[:len(out), :len(src)]


def translate_export_ids(export: LoadedExport, src_ids: Sequence[Sequence[int]], *, beam: int = 1,
                  len_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
                  nbest: int = 1, batch_tokens: int = 4096, progress: bool = False,
                  beam_rule: str = "full") -> Hyps:
    """What :func:`tinymt.decoding.translate_ids` returns, by CTranslate2 (``beam_rule=full``
    only: the config refuses ``shrink`` with ``engine=ct2``). Greedy goes in one call under the largest cap, each output cut at its own
    (greedy picks do not depend on the cap); beam search's last step does, so it goes in
    groups of sentences with equal caps, one call each."""
    check_beam(beam, nbest)
    # sources come cut to fit (tinymt.translate.source_ids; CTranslate2 refuses longer ones)
    caps = [max_output_length(len(s) + 1, max_len_a, max_len_b, export.max_positions)
            for s in src_ids]
    groups: dict[int, list[int]] = {}  # cap -> sentences (cap 0: no room for a token)
    for i, cap in enumerate(caps):
        if cap > 0:
            groups.setdefault(cap if beam > 1 else max(caps), []).append(i)
    results: Hyps = [[([], float("nan"))] for _ in src_ids]
    tgt = export.tgt_tokenizer
    eos = tgt.sp.id_to_piece(EOS_ID)
    for cap, idx in progress_bar(sorted(groups.items()), desc="translate", unit="call",
                                 disable=not progress):
        outs = export.translator.translate_batch(  # with our rules (module docstring)
            [export.src_tokenizer.pieces(src_ids[i]) for i in idx], beam_size=beam,
            num_hypotheses=nbest, length_penalty=len_penalty, max_batch_size=batch_tokens,
            max_decoding_length=cap, min_decoding_length=0, return_end_token=True,
            return_scores=beam > 1, max_input_length=0, batch_type="tokens",
            suppress_sequences=[[tgt.sp.id_to_piece(i)] for i in (PAD_ID, BOS_ID)])
        for i, out in zip(idx, outs):
            scores = out.scores if beam > 1 else [float("nan")] * len(out.hypotheses)
            results[i] = [([tgt.sp.piece_to_id(p) for p in (h[:-1] if h[-1:] == [eos] else h)
                            ][: caps[i]], float(sc)) for h, sc in zip(out.hypotheses, scores)]
    return results
