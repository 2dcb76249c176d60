"""View documents as TensorBoard summaries, and back.

Each probe is one tag, ``probe_<k>``, whose summaries are string tensors (one per
validation step) under our plugin's name, :data:`PLUGIN_NAME`; the tag's summary metadata
carries the probe's sentence and reference (JSON), so listing the probes needs no tensor.
The tensor holds the document packed: zlib over ``MAGIC``, the JSON header's length
(4 bytes, little-endian), the JSON header (everything but the weights, plus each kind's
weight shape) and every kind's uint8 weights, kind by kind.

No torch here: the TensorBoard plugin imports this module.
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

PLUGIN_NAME = "tinymt_attention"
MAGIC = b"TMAV1"  # tinymt attention view, format 1


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
    """The inverse of :func:`encode`; weights come back as uint8 arrays. Anything else
    raises ``ValueError``."""
    try:
        raw = zlib.decompress(blob)
    except zlib.error as e:
        raise ValueError(f"not an attention view record: {e}") from None
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 4:
        raise ValueError("not an attention view record (bad magic)")
    (n,) = struct.unpack_from("<I", raw, len(MAGIC))
    start = len(MAGIC) + 4
    doc = json.loads(raw[start:start + n].decode("utf-8"))
    pos = start + n
    for view in doc["kinds"].values():
        shape = tuple(view.pop("shape"))
        size = int(np.prod(shape))
        if pos + size > len(raw):
            raise ValueError("attention view record is truncated")
        view["weights"] = np.frombuffer(raw, np.uint8, size, pos).reshape(shape)
        pos += size
    return doc


def probe_summary(tag: str, doc: dict, sentence: str, reference: str | None
                  ) -> summary_pb2.Summary:
    """A ``Summary`` with one value: ``doc`` as a string tensor under our plugin."""
    meta = summary_pb2.SummaryMetadata(
        summary_description=sentence,
        data_class=summary_pb2.DATA_CLASS_TENSOR,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME,
            content=json.dumps({"version": 1, "sentence": sentence, "reference": reference},
                               ensure_ascii=False).encode("utf-8")))
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING,
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto(),
                                    string_val=[encode(doc)])
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, metadata=meta,
                                                                 tensor=tensor)])


def probe_meta(content: bytes) -> dict:
    """The tag metadata written by :func:`probe_summary`: ``{"sentence", "reference"}``."""
    try:
        meta = json.loads(bytes(content).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"sentence": "", "reference": None}
    return {"sentence": str(meta.get("sentence", "")), "reference": meta.get("reference")}
