"""View documents as TensorBoard summaries, and back (no torch: the plugin imports this).

Each probe is one tag, ``probe_<k>``, of string tensors (one per validation step) under our
plugin's name; the tag's metadata carries the probe's sentence and reference
(:func:`summary_metadata`, version-checked by :func:`parse_meta`), so listing the probes
needs no tensor. A tensor holds the document packed: zlib over ``MAGIC``, the JSON header's
length (4 bytes, little-endian), the JSON header (everything but the weights, plus each
kind's weight shape) and every kind's uint8 weights, kind by kind.

:func:`decode`, the one reader of a record, trusts nothing in it: the header is checked
field by field before a weight is inflated, and no more bytes are inflated than the header
declares (at most :data:`MAX_CELLS`).
"""

from __future__ import annotations

import json
import math
import struct
import zlib

import numpy as np
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from tinymt.files import MAX_JSON_BYTES, parse_json

PLUGIN_NAME = "tinymt_attention"
VERSION = 1  # of the tag metadata's JSON: {"version", "sentence", "reference"}
MAX_DEPTH = 8  # JSON nesting (a record's header nests 5 deep: kinds.cross.gold[0][2])
MAGIC = b"TMAV1"  # tinymt attention view, format 1
KINDS = ("encoder_self", "decoder_self", "cross")  # model.KINDS (no torch here)
MAX_TOKENS = 4096  # rows or columns of one kind
MAX_HEADS = 1024  # layers x heads of one kind
MAX_CELLS = 1 << 24  # weights of one record, all kinds: 16 MiB, 67 MB of JSON to the page
TOP_FIELDS = {"sentence", "reference", "translation", "forced", "step", "scale", "kinds"}
KIND_FIELDS = {"rows", "cols", "entropy", "gold", "shape"}
OPTIONAL_KIND_FIELDS = {"labels"}  # each head's label at that step (tinymt.labels)
MAX_LABEL = 200  # characters of one head's label


def encode(doc: dict) -> bytes:
    """A view document (weights as uint8 arrays or nested lists) -> compact bytes."""
    header = {k: v for k, v in doc.items() if k != "kinds"}
    header["kinds"] = {}
    blobs = []
    for kind, view in doc["kinds"].items():
        w = np.asarray(view["weights"], dtype=np.uint8)
        header["kinds"][kind] = {**{k: v for k, v in view.items() if k != "weights"},
                                 "shape": list(w.shape)}
        blobs.append(np.ascontiguousarray(w).tobytes())
    head = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return zlib.compress(MAGIC + struct.pack("<I", len(head)) + head + b"".join(blobs), 6)


def decode(blob: bytes) -> dict:
    """The inverse of :func:`encode`, checked and bounded; weights come back as uint8
    arrays. Anything else raises a one-line ``ValueError``."""
    if not isinstance(blob, bytes):
        raise ValueError(f"not an attention view record (a {type(blob).__name__}, not bytes)")
    stream = _Inflater(blob)
    prefix = stream.read(len(MAGIC) + 4)
    if prefix[:len(MAGIC)] != MAGIC:
        raise ValueError("not an attention view record (bad magic)")
    (n,) = struct.unpack_from("<I", prefix, len(MAGIC))
    if n > MAX_JSON_BYTES:
        raise ValueError(f"the record's header is {n:,} bytes (at most {MAX_JSON_BYTES:,})")
    doc = parse_json(stream.read(n), "the record's header", MAX_DEPTH, ValueError)
    shapes = check_header(doc)
    raw = stream.read(sum(math.prod(s) for s in shapes.values()))
    stream.finish()
    pos = 0
    for kind, shape in shapes.items():  # shape: (layers, heads, T_q, T_k)
        view = doc["kinds"][kind]
        del view["shape"]
        view["weights"] = np.frombuffer(raw, np.uint8, math.prod(shape), pos).reshape(shape)
        pos += math.prod(shape)
    return doc


class _Inflater:
    """A zlib stream read in exact amounts: never more inflated than asked for."""

    def __init__(self, blob: bytes):
        self._z, self._input = zlib.decompressobj(), blob

    def _inflate(self, n: int) -> bytes:
        try:
            out = self._z.decompress(self._input, n)
        except zlib.error as e:
            raise ValueError(f"not an attention view record ({e})") from None
        self._input = self._z.unconsumed_tail
        return out

    def read(self, n: int) -> bytes:
        """Exactly ``n`` more bytes, or ``ValueError``."""
        out = bytearray()
        while len(out) < n:
            chunk = self._inflate(n - len(out))
            if not chunk:
                raise ValueError(f"the record is truncated ({len(out):,} of {n:,} bytes)")
            out += chunk
        return bytes(out)

    def finish(self) -> None:
        """The stream must end here: no byte more, nothing missing, nothing after."""
        if self._inflate(1):
            raise ValueError("the record inflates past the size its header declares")
        if not self._z.eof:
            raise ValueError("the record is truncated (its zlib stream does not end)")
        if self._z.unused_data:
            raise ValueError("the record has bytes after its zlib stream")


# ----------------------------------------------------------------------------- the header
def check_header(doc) -> dict[str, tuple[int, ...]]:
    """Every field of a record's header is what :func:`encode` writes (tokens, shapes,
    gold cells in range, finite numbers); returns ``{kind: weight shape}``."""
    _fields(doc, TOP_FIELDS, "the record")
    for name in ("sentence", "translation"):
        _text(doc[name], name)
    if doc["reference"] is not None:
        _text(doc["reference"], "reference")
    if doc["forced"] not in ("reference", "translation"):
        raise ValueError("forced is neither 'reference' nor 'translation'")
    _integer(doc["step"], "step", -(1 << 63), (1 << 63) - 1)
    if not _number(doc["scale"]) or doc["scale"] <= 0:
        raise ValueError("scale is not a positive finite number")
    if not isinstance(doc["kinds"], dict) or not set(doc["kinds"]) <= set(KINDS):
        raise ValueError(f"kinds is not an object of {', '.join(KINDS)}")
    shapes, cells = {}, 0
    for kind, view in doc["kinds"].items():
        shapes[kind] = _check_kind(view, kind)
        cells += math.prod(shapes[kind])
        if cells > MAX_CELLS:
            raise ValueError(f"the record declares over {MAX_CELLS:,} weights")
    return shapes


def _check_kind(view, kind: str) -> tuple[int, ...]:
    _fields(view, KIND_FIELDS, kind, OPTIONAL_KIND_FIELDS)
    for axis in ("rows", "cols"):
        tokens = view[axis]
        if not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_TOKENS:
            raise ValueError(f"{kind}.{axis} is not a list of 1 to {MAX_TOKENS} tokens")
        for tok in tokens:
            _text(tok, f"{kind}.{axis}")
    shape = view["shape"]
    if not isinstance(shape, list) or len(shape) != 4:
        raise ValueError(f"{kind}.shape is not [layers, heads, rows, columns]")
    for n, name in zip(shape, ("layers", "heads", "rows", "columns")):
        _integer(n, f"{kind}.shape's {name}", 1, MAX_HEADS if name in ("layers", "heads")
                 else MAX_TOKENS)
    layers, heads, t_q, t_k = shape
    if layers * heads > MAX_HEADS:
        raise ValueError(f"{kind}.shape has {layers * heads:,} heads (at most {MAX_HEADS:,})")
    if (t_q, t_k) != (len(view["rows"]), len(view["cols"])):
        raise ValueError(f"{kind}.shape {t_q}x{t_k} is not its {len(view['rows'])} rows x "
                         f"{len(view['cols'])} columns")
    entropy = view["entropy"]
    if not (isinstance(entropy, list) and len(entropy) == layers and all(
            isinstance(row, list) and len(row) == heads and all(map(_number, row))
            for row in entropy)):
        raise ValueError(f"{kind}.entropy is not {layers}x{heads} finite numbers")
    labels = view.get("labels", [[""] * heads] * layers)
    if not (isinstance(labels, list) and len(labels) == layers and all(
            isinstance(row, list) and len(row) == heads and all(
                isinstance(s, str) and len(s) <= MAX_LABEL for s in row) for row in labels)):
        raise ValueError(f"{kind}.labels is not {layers}x{heads} strings of at most "
                         f"{MAX_LABEL} characters")
    if not isinstance(view["gold"], list):
        raise ValueError(f"{kind}.gold is not a list")
    for cell in view["gold"]:
        if not (isinstance(cell, list) and len(cell) == 3 and isinstance(cell[2], str)):
            raise ValueError(f"{kind}.gold holds {_show(cell)}, not [row, column, label]")
        _integer(cell[0], f"{kind}.gold's row", 0, t_q - 1)
        _integer(cell[1], f"{kind}.gold's column", 0, t_k - 1)
    return tuple(shape)


def _fields(obj, fields: set, what: str, optional: set = frozenset()) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} is not a JSON object")
    if not fields <= set(obj) <= fields | optional:
        odd = sorted(fields - set(obj) | set(obj) - fields - optional)
        raise ValueError(f"{what} has fields {', '.join(map(repr, odd))[:120]} "
                         "missing or unknown")


def _text(value, what: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not a string")


def _integer(value, what: str, lo: int, hi: int) -> None:
    if type(value) is not int or not lo <= value <= hi:  # not a bool, not a float
        raise ValueError(f"{what} is {_show(value)}, not an integer in {lo}..{hi}")


def _show(value) -> str:
    """A JSON value as the record spells it, cut short (for a one-line error)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _number(value) -> bool:
    """An int or float (not a bool) that is finite as a float (as the page reads it)."""
    try:
        return type(value) in (int, float) and math.isfinite(float(value))
    except OverflowError:  # an int beyond any float
        return False


# ----------------------------------------------------------------------------- the tag
def summary_metadata(sentence: str, reference: str | None) -> summary_pb2.SummaryMetadata:
    """The metadata of a probe's tag: its sentence and reference, under our plugin."""
    content = {"version": VERSION, "sentence": sentence, "reference": reference}
    return summary_pb2.SummaryMetadata(
        summary_description=sentence, data_class=summary_pb2.DATA_CLASS_TENSOR,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME,
            content=json.dumps(content, ensure_ascii=False).encode("utf-8")))


def parse_meta(content: bytes) -> dict:
    """A tag's metadata -> ``{"sentence", "reference"}``; ``ValueError`` unless it is
    version 1 of what :func:`summary_metadata` writes."""
    if len(content) > MAX_JSON_BYTES:
        raise ValueError(f"the tag's metadata is {len(content):,} bytes (at most "
                         f"{MAX_JSON_BYTES:,})")
    meta = parse_json(bytes(content), "the tag's metadata", MAX_DEPTH, ValueError)
    if not isinstance(meta, dict):
        raise ValueError(f"the tag's metadata is a JSON {type(meta).__name__}, not an object")
    if type(meta.get("version")) is not int or meta["version"] != VERSION:
        raise ValueError(f"the tag's metadata has version {meta.get('version')!r} "
                         f"(this viewer reads {VERSION})")
    sentence, reference = meta.get("sentence"), meta.get("reference")
    if not isinstance(sentence, str):
        raise ValueError("the tag's metadata has no sentence (a string)")
    if reference is not None and not isinstance(reference, str):
        raise ValueError("the tag's metadata has a reference that is not a string")
    return {"sentence": sentence, "reference": reference}


def probe_summary(tag: str, doc: dict, sentence: str, reference: str | None
                  ) -> summary_pb2.Summary:
    """A ``Summary`` with one value: ``doc`` as a string tensor under our plugin."""
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING,
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                    string_val=[encode(doc)])
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=tag, metadata=summary_metadata(sentence, reference), tensor=tensor)])
