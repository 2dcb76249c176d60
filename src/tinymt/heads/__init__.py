"""What does each head do? Importance, pruning, alignment, entropy, distance, relations.

``analyze(cfg)`` (``scripts/analyze_heads.py run=<run dir>``) loads a trained run and, on
the first ``max_sentences`` pairs of one split, measures every head of every kind and
layer: :mod:`~tinymt.heads.pruning` its **importance** (Michel et al., 2019) and the
**pruning curves** (no retraining); :mod:`~tinymt.heads.stats` its **entropy**, **distance**
from the diagonal and, for cross-attention, the **alignment error rate** against the
built-in corpus's gold alignments; :mod:`~tinymt.relations` the grammatical
**relations** each self-attention head tracks (Clark et al., 2019).
:mod:`~tinymt.heads.report` writes the figures, ``heads.md`` and ``heads.json``;
``prune=<fraction>`` also writes a checkpoint whose least important heads have zero
``W_O`` columns (``scripts/translate.py`` loads it unchanged).
"""

from tinymt.heads.analysis import analyze
from tinymt.heads.gates import all_heads, gates_without
from tinymt.heads.pruning import head_importance, normalize_importance
from tinymt.heads.sentences import load_sentences
from tinymt.heads.stats import alignment_summary, attention_pass
from tinymt.labels import head_labels
from tinymt.relations import relation_summary

__all__ = ["alignment_summary", "all_heads", "analyze", "attention_pass", "gates_without",
           "head_importance", "head_labels", "load_sentences", "normalize_importance",
           "relation_summary"]
