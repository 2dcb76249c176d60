"""What does each head do? Importance, pruning, alignment, entropy, distance, relations.

``analyze(cfg)`` (``scripts/analyze_heads.py run=<run dir>``) loads a trained run, takes
the first ``max_sentences`` pairs of one of its data splits and measures, for every head
of every kind (``encoder_self``, ``decoder_self``, ``cross``) and layer, one module a part:

1. :mod:`~tinymt.heads.pruning`: **importance** (Michel et al., 2019: ``E_x |dL(x)/dxi_h|``
   for a gate ``xi_h = 1`` on the head, normalised per layer) and the **pruning curves**
   (heads masked least important first, greedy BLEU after each step, no retraining);
2. :mod:`~tinymt.heads.stats`: the **entropy** and **distance** from the diagonal of its
   attention rows and, for cross-attention, the **alignment error rate** against the
   built-in corpus's gold word alignments (one teacher-forced pass, which also counts 3);
3. :mod:`~tinymt.heads.relations`: the grammatical **relations** (built-in corpus; Clark et
   al., 2019) each self-attention head tracks, against the best fixed-offset baseline.

:mod:`~tinymt.heads.gates` names the heads and gates them, :mod:`~tinymt.heads.sentences`
loads the analysed split and the showcase sentence, :mod:`~tinymt.heads.report` writes
figures and scalars under ``heads/...`` in the run's TensorBoard (an events file of its
own, replaced by the next analysis), ``<run>/heads.md`` with the PNGs in ``<run>/heads/``,
``<run>/heads.json`` and a sweep's ``heads_sweep.md``; with ``prune=<fraction>``
:mod:`~tinymt.heads.analysis` also writes a checkpoint whose least important heads have
zero ``W_O`` columns (``scripts/translate.py checkpoint=<it>`` loads it unchanged).
"""

from tinymt.heads.analysis import analyze
from tinymt.heads.gates import all_heads, gates_without
from tinymt.heads.pruning import head_importance, normalize_importance
from tinymt.heads.relations import relation_summary
from tinymt.heads.sentences import load_sentences
from tinymt.heads.stats import alignment_summary, attention_pass, head_labels

__all__ = ["alignment_summary", "all_heads", "analyze", "attention_pass", "gates_without",
           "head_importance", "head_labels", "load_sentences", "normalize_importance",
           "relation_summary"]
