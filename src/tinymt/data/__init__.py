"""Every corpus source -> normalised, tokenized, filtered, cached splits.

``prepare(cfg)`` is the one entry point: :mod:`~tinymt.data.sources` loads ``cfg.source``
(``builtin``, ``hub``, ``text`` or ``tsv``) as ``train`` / ``valid`` / ``test`` columns
(``src``, ``tgt``; builtin adds its gold words, alignments and relations);
:mod:`~tinymt.data.pipeline` normalises them, trains sentencepiece on train, tokenizes and
applies the length filters **to train only**. Each step streams ``CHUNK_PAIRS`` pairs at a
time through Arrow files, and training reads the ids memory-mapped
(:class:`~tinymt.data.prepared.Ragged`), so memory does not grow with a text corpus.
:mod:`~tinymt.data.cache` keeps the result under ``<cache_dir>/<hash>/``, built in a
temporary folder, marked ``COMPLETE`` and renamed into place, so an interrupted build is
never trusted later. :mod:`~tinymt.data.sampling` re-segments train every epoch (not cached).
"""

from tinymt.data.cache import cache_path
from tinymt.data.pipeline import normalize, prepare, source_language, target_language
from tinymt.data.prepared import PreparedData, summary_table
from tinymt.data.sampling import TrainSegments
from tinymt.data.sources import MAX_LINE_CHARS, capped_lines, read_lines

__all__ = [
    "MAX_LINE_CHARS", "TrainSegments", "PreparedData", "capped_lines", "cache_path",
    "normalize", "prepare", "read_lines", "summary_table", "source_language", "target_language"
]
