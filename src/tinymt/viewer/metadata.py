"""The plugin data of a probe's tag: what the trainer writes into its summary metadata
(:func:`summary_metadata`) and what the Attention tab reads back (:func:`parse_meta`,
checked: a tag whose metadata is not ours refuses in one line, the other tags still list).

No torch here: the TensorBoard plugin imports this module.
"""

from __future__ import annotations

import json

from tensorboard.compat.proto import summary_pb2

from tinymt.errors import TinyMTError
from tinymt.files import parse_json

PLUGIN_NAME = "tinymt_attention"
VERSION = 1  # of the metadata's JSON: {"version", "sentence", "reference"}
MAX_JSON_BYTES = 1 << 20  # a tag's metadata, a record's header: 1 MiB of JSON at most
MAX_DEPTH = 8  # JSON nesting (a record's header nests 5 deep: kinds.cross.gold[0][2])


def summary_metadata(sentence: str, reference: str | None) -> summary_pb2.SummaryMetadata:
    """The metadata of a probe's tag: its sentence and reference, under our plugin."""
    content = {"version": VERSION, "sentence": sentence, "reference": reference}
    return summary_pb2.SummaryMetadata(
        summary_description=sentence, data_class=summary_pb2.DATA_CLASS_TENSOR,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME,
            content=json.dumps(content, ensure_ascii=False).encode("utf-8")))


def load_json(text: bytes, what: str):
    """JSON of at most :data:`MAX_JSON_BYTES`, nested at most :data:`MAX_DEPTH` deep,
    finite numbers only; a one-line ``ValueError`` naming ``what`` otherwise."""
    if len(text) > MAX_JSON_BYTES:
        raise ValueError(f"{what} is {len(text):,} bytes (at most {MAX_JSON_BYTES:,})")
    try:
        return parse_json(bytes(text), what, MAX_DEPTH)
    except TinyMTError as e:
        raise ValueError(str(e)) from None


def parse_meta(content: bytes) -> dict:
    """A tag's metadata -> ``{"sentence", "reference"}``; ``ValueError`` unless it is
    version 1 of what :func:`summary_metadata` writes."""
    meta = load_json(content, "the tag's metadata")
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
