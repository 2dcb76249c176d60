"""Every corpus source -> normalised, tokenized, filtered, cached splits.

``prepare(cfg)`` is the one entry point. ``cfg.source`` picks the loader
(:mod:`tinymt.data.sources`): ``hub`` (``datasets.load_dataset(cfg.path)``: a Hugging Face
dataset name or a local folder in that layout, ``src_lang`` / ``tgt_lang`` naming the
columns or the keys of a ``translation`` column), ``text`` (line-aligned files
``<path>/<split>.<lang>[.txt][.gz]``), ``tsv`` (one file, ``src_column`` / ``tgt_column``;
valid/test carved off a seeded shuffle) or ``builtin`` (:func:`tinymt.corpus.generate_splits`).

Every split (``train`` / ``valid`` / ``test``) has columns ``src``, ``tgt`` (builtin adds
``src_words``, ``tgt_words``, ``alignment`` as ``[src_i, tgt_i]`` pairs and
``src_relations`` / ``tgt_relations`` as ``[relation, dependent, head]`` triples). Then
(:mod:`tinymt.data.pipeline`): NFKC + whitespace normalisation, empty pairs dropped,
sentencepiece trained on the train split, everything tokenized, the length filters
(``max_len``, ``max_len_ratio``) applied **to train only**. Each step streams chunks of
``CHUNK_PAIRS`` pairs through Arrow files, and training reads the ids memory-mapped
(:class:`~tinymt.data.prepared.Ragged`), so memory does not grow with a text corpus.
:mod:`tinymt.data.sampling` re-segments the train split every epoch (not cached).

The result is cached under ``<cache_dir>/<hash>/`` (:mod:`tinymt.data.cache`: hash of the
data config, the source files' size+mtime, the corpus / pipeline versions), built in a
temporary folder, marked ``COMPLETE`` and renamed into place, so an interrupted run is
never trusted later. :mod:`tinymt.data.prepared`: :class:`PreparedData`, the folder's
layout, the stats and their table.
"""

from tinymt.data.cache import COMPLETE, PIPELINE_VERSION, cache_key, cache_path
from tinymt.data.pipeline import normalize, prepare, source_language, target_language
from tinymt.data.prepared import PreparedData, summary_table
from tinymt.data.sampling import TrainSegments
from tinymt.data.sources import MAX_LINE_CHARS, SPLITS, capped_lines, read_lines

__all__ = [
    "COMPLETE", "MAX_LINE_CHARS", "PIPELINE_VERSION", "SPLITS", "TrainSegments",
    "PreparedData", "cache_key", "capped_lines", "cache_path", "normalize", "prepare",
    "read_lines", "summary_table", "source_language", "target_language"
]
