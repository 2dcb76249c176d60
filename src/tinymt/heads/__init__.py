"""What does each head do? Importance, pruning, alignment, entropy, distance, relations.

``analyze(cfg)`` (``scripts/analyze_heads.py run=<run dir>``) measures every head of a
trained run on one split: what each module measures, docs/architecture.md's table; the
measures and what they found, docs/heads.md.
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
