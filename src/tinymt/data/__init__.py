"""Every corpus source -> one ``DatasetDict`` -> normalised, tokenized, filtered, cached.

``prepare(cfg)`` is the one entry point. ``cfg.source`` picks the loader
(:mod:`tinymt.data.sources`):

- ``hub``: ``datasets.load_dataset(cfg.path)``, a Hugging Face dataset name or a local
  folder in the same layout; ``src_lang`` / ``tgt_lang`` name the columns (a
  ``translation`` column of ``{lang: text}`` dicts works too).
- ``text``: line-aligned plain-text files ``<path>/<split>.<lang>[.txt][.gz]``.
- ``tsv``: one TSV file (optionally .gz); ``src_column`` / ``tgt_column`` pick the columns;
  valid/test are carved off a seeded shuffle (``split_seed``, ``valid_size``, ``test_size``).
- ``builtin``: the pairs of :func:`tinymt.corpus.generate_splits` (zh/en with word
  alignments).

Every loader returns splits ``train`` / ``valid`` / ``test`` with columns ``src``, ``tgt``
(builtin adds ``src_words``, ``tgt_words``, ``alignment`` as ``[src_i, tgt_i]`` pairs and
``src_relations`` / ``tgt_relations`` as ``[relation, dependent, head]`` triples).
Then (:mod:`tinymt.data.pipeline`): NFKC + whitespace normalisation, empty pairs dropped,
sentencepiece trained on the train split (a sample of at most 1M sentences), everything
tokenized, and the length filters (``max_len``, ``max_len_ratio``) applied **to train
only** -- valid/test pairs are never dropped for length. Each step streams chunks of
``CHUNK_PAIRS`` pairs through Arrow files (:mod:`tinymt.data.stream`), and training reads
the ids memory-mapped (:class:`~tinymt.data.prepared.Ragged`), so memory does not grow
with the corpus (text sources; the others are loaded whole first). :mod:`tinymt.data.sampling` re-segments the train split every epoch
(subword regularization, ``sampling_alpha``; not part of the cache).

The result is cached under ``<cache_dir>/<hash>/`` (:mod:`tinymt.data.cache`: hash of the
data config, the source files' size+mtime, the corpus / pipeline versions). A cache is
built in a temporary folder, marked ``COMPLETE`` and renamed into place, so an interrupted
run is never trusted later. :mod:`tinymt.data.prepared` holds :class:`PreparedData` and the
folder layout; :mod:`tinymt.data.summary` the stats and their table.
"""

from tinymt.data.cache import COMPLETE, PIPELINE_VERSION, cache_key, cache_path
from tinymt.data.pipeline import normalize, prepare, source_language, target_language
from tinymt.data.prepared import PreparedData
from tinymt.data.sampling import TrainSegments
from tinymt.data.sources import MAX_LINE_CHARS, SPLITS, capped_lines, read_lines
from tinymt.data.summary import summary_table

__all__ = [
    "COMPLETE",
    "MAX_LINE_CHARS",
    "PIPELINE_VERSION",
    "SPLITS",
    "TrainSegments",
    "PreparedData",
    "cache_key",
    "capped_lines",
    "cache_path",
    "normalize",
    "prepare",
    "read_lines",
    "summary_table",
    "source_language",
    "target_language",
]
