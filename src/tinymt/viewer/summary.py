"""View documents as TensorBoard summaries, and back (no torch: the plugin imports this).

Each probe is one tag, ``probe_<k>``, of string tensors (one per validation step) under our
plugin's name; the tag's metadata carries the probe's sentence and reference
(:func:`summary_metadata`, version-checked by :func:`parse_meta`), so listing the probes
needs no tensor. A tensor holds the document packed: zlib over ``MAGIC``, the JSON header's
length (4 bytes, little-endian), the JSON header (everything but the weights, plus each
kind's weight shape) and every kind's uint8 weights, kind by kind.

:func:`decode`, the one reader of a record, trusts nothing in it: the header is at most
:data:`~tinymt.files.MAX_JSON_BYTES`, what the reading and the views rely on in it is
checked before a weight is inflated (:func:`_shapes`), and no more bytes are inflated than
the header declares (at most :data:`MAX_CELLS`).
"""

from __future__ import annotations

import json
import math
import struct
import sys
import zlib

import numpy as np
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from tinymt.files import MAX_JSON_BYTES, parse_json

PLUGIN_NAME = "tinymt_attention"
VERSION = 1  # of the tag metadata's JSON: {"version", "sentence", "reference"}
MAGIC = b"TMAV1"  # tinymt attention view, format 1
MAX_TOKENS = 4096  # rows or columns of one kind
MAX_HEADS = 1024  # layers x heads of one kind
MAX_CELLS = 1 << 24  # weights of one record, all kinds: 16 MiB, 67 MB of JSON to the page


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
    """The inverse of :func:`encode`, bounded; weights come back as uint8 arrays. A record
    it cannot read raises a one-line ``ValueError``."""
    stream = _Inflater(blob)
    prefix = stream.read(len(MAGIC) + 4)
    if prefix[:len(MAGIC)] != MAGIC:
        raise ValueError("not an attention view record (bad magic)")
    (n,) = struct.unpack_from("<I", prefix, len(MAGIC))
    if n > MAX_JSON_BYTES:
        raise ValueError(f"the record's header is {n:,} bytes (at most {MAX_JSON_BYTES:,})")
    doc = parse_json(stream.read(n), "the record's header", ValueError)
    shapes = _shapes(doc)
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
        """At most ``n`` > 0 more bytes: fewer only where the stream ends."""
        try:
            out = self._z.decompress(self._input, n)
        except zlib.error as e:
            raise ValueError(f"not an attention view record ({e})") from None
        self._input = self._z.unconsumed_tail
        return out

    def read(self, n: int) -> bytes:
        """Exactly ``n`` more bytes, or ``ValueError``."""
        out = self._inflate(n) if n else b""  # zlib reads a limit of 0 as none
        if len(out) < n:
            raise ValueError(f"the record is truncated ({len(out):,} of {n:,} bytes)")
        return out

    def finish(self) -> None:
        """The weights must end here: not a byte more than the header declares."""
        if self._inflate(1):
            raise ValueError("the record inflates past the size its header declares")


# ----------------------------------------------------------------------------- the header
def _shapes(head) -> dict[str, tuple[int, ...]]:
    """``{kind: weight shape}`` of a record's header, checked for what the reading and the
    views rely on: each shape within bounds and as long as its tokens, all of them at most
    :data:`MAX_CELLS` weights; entropy ``layers x heads`` finite numbers (the trend plots
    them); gold cells ``[row, column, label]`` inside the grid (the trend indexes the
    weights with them); ``scale`` a positive finite number (the views divide by it). Every
    other field goes to the views as written: they show any JSON value as text."""
    try:
        scale = head["scale"]
        kinds = {kind: (tuple(view["shape"]), view["rows"], view["cols"],
                        np.array(view["entropy"], np.float64),
                        [(i, j) for i, j, _label in view["gold"]])
                 for kind, view in head["kinds"].items()}
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as e:
        raise ValueError(f"the record's header is not what encode writes ({type(e).__name__}: "
                         f"{str(e)[:80]})") from None
    if not (isinstance(scale, (int, float)) and 0 < scale <= sys.float_info.max):
        raise ValueError("scale is not a positive finite number")
    shapes = {}
    for kind, (shape, rows, cols, entropy, gold) in kinds.items():
        if not (len(shape) == 4 and all(type(n) is int and n > 0 for n in shape)
                and shape[0] * shape[1] <= MAX_HEADS and max(shape[2:]) <= MAX_TOKENS):
            raise ValueError(f"{kind}.shape is not [layers, heads, rows, columns] of at most "
                             f"{MAX_HEADS:,} heads and {MAX_TOKENS:,} tokens a side")
        if not (type(rows) is list and type(cols) is list and shape[2:] == (len(rows), len(cols))):
            raise ValueError(f"{kind}.shape {shape[2]}x{shape[3]} is not its lists of rows x "
                             "columns")
        if entropy.shape != shape[:2] or not np.isfinite(entropy).all():
            raise ValueError(f"{kind}.entropy is not {shape[0]}x{shape[1]} finite numbers")
        if not all(type(i) is int and type(j) is int and 0 <= i < shape[2] and 0 <= j < shape[3]
                   for i, j in gold):
            raise ValueError(f"{kind}.gold has a cell outside its {shape[2]}x{shape[3]} grid")
        shapes[kind] = shape
        if sum(map(math.prod, shapes.values())) > MAX_CELLS:
            raise ValueError(f"the record declares over {MAX_CELLS:,} weights")
    return shapes


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
    """A tag's metadata -> ``{"sentence", "reference"}`` (strings, the reference or
    ``None``: /runs writes them); ``ValueError`` unless it is version 1 of what
    :func:`summary_metadata` writes."""
    if len(content) > MAX_JSON_BYTES:
        raise ValueError(f"the tag's metadata is {len(content):,} bytes (at most "
                         f"{MAX_JSON_BYTES:,})")
    meta = parse_json(bytes(content), "the tag's metadata", ValueError)
    if not isinstance(meta, dict) or meta.get("version") != VERSION:
        raise ValueError(f"the tag's metadata is not version {VERSION} of this viewer's")
    sentence, reference = meta.get("sentence"), meta.get("reference")
    if not (isinstance(sentence, str) and isinstance(reference, (str, type(None)))):
        raise ValueError("the tag's metadata has no sentence and reference (strings)")
    return {"sentence": sentence, "reference": reference}


def probe_summary(tag: str, doc: dict, sentence: str, reference: str | None) -> summary_pb2.Summary:
    """A ``Summary`` with one value: ``doc`` as a string tensor under our plugin."""
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING,
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                    string_val=[encode(doc)])
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=tag, metadata=summary_metadata(sentence, reference), tensor=tensor)])
