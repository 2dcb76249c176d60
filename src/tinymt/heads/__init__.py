"""What does each head do? Importance, pruning, alignment, entropy, distance, relations.

``analyze(cfg)`` (``scripts/analyze_heads.py run=<run dir>``) loads a trained run, takes
the first ``max_sentences`` pairs of one of its data splits and measures, for every head
of every kind (``encoder_self``, ``decoder_self``, ``cross``) and layer:

1. **Importance** (Michel et al., 2019, "Are Sixteen Heads Really Better than One?"):
   every head gets a gate ``xi = 1``; importance is the expected absolute gradient of the
   loss with respect to it, ``I_h = E_x |dL(x)/dxi_h|``. ``L(x)`` is the teacher-forced
   NLL of sentence ``x`` summed over its target tokens (no label smoothing, eval mode);
   the gates are per sentence, so one backward pass gives every sentence's own gradient,
   and the sum of their absolute values is divided by the number of target tokens.
   Scores are then normalised per layer (L2 over the heads of a layer), as in the paper.
2. **Pruning curve**: heads are masked (gate 0) in order of increasing normalised
   importance, ``prune_step`` of them at a time, globally across kinds ("all") and within
   each kind separately; after every step the split is translated greedily (no
   retraining) and scored with sacreBLEU. "Prunable" = the most heads masked such that no
   step up to there lost more than 1 BLEU point.
3. **Alignment error rate** of every cross-attention head against the built-in corpus's
   gold word alignments (teacher forcing on the reference). Decoder row ``t`` is the row
   that *predicts* target piece ``t`` (the rows of the attention figures). Pieces are
   mapped to words by character offsets (see :func:`piece_word_weights`; a piece spanning
   two words counts for both, in proportion to its characters); for each target word the
   attention of its pieces is summed, then summed over the pieces of each source word,
   and the source word with the most mass is linked (several on an exact tie). The
   source EOS acts as NULL: when it gets more mass than any word, the target word stays
   unaligned. ``AER = 1 - 2|A & G| / (|A| + |G|)`` (sure = possible = gold), counted over
   the whole split. One link per target word cannot reproduce many-to-one gold links
   (这 个 -> "This"): the report gives that floor as "oracle AER".
4. **Entropy** (nats) of each attention row and **distance**: ``sum_j w_ij |j - j*_i| /
   T_k`` with ``j*_i = (i + 1/2) T_k / T_q - 1/2`` (the diagonal; ``j* = i`` for
   self-attention), i.e. how far from the diagonal a head looks, as a fraction of the
   sentence. For self-attention the mass on offsets -1 / 0 / +1 and the mean signed
   offset show positional heads (previous token, same token, next token). All are means
   over the non-padding query rows of the split (the offsets and the entropy relative to
   the uniform's: over the rows with more than one key, i.e. not the decoder's BOS row).
5. **Relations** (built-in corpus; Clark et al., 2019): for every encoder self-attention
   head (source words) and decoder self-attention head (target words to the left), how
   often the word a word attends to most is its gold partner, per relation (subject,
   object, aux, ... of :mod:`tinymt.corpus.relations`) and direction, against the best
   fixed-offset baseline; and the showcase sentence drawn head by head.

Results: figures and scalars under ``heads/...`` in the run's TensorBoard (an events
file of its own, ``*.heads``, replaced by the next analysis), a markdown
report ``<run>/heads.md`` with the PNGs in ``<run>/heads/``, the relation numbers in
``<run>/heads.json``, and with ``prune=<fraction>``
a checkpoint whose persistent head masks (:class:`tinymt.model.Transformer`) switch the
least important heads off; ``scripts/translate.py checkpoint=<it>`` loads it unchanged.

The package, one module a part: :mod:`~tinymt.heads.gates` (heads and gates),
:mod:`~tinymt.heads.importance` (1), :mod:`~tinymt.heads.pruning` (2 and the pruned
checkpoint), :mod:`~tinymt.heads.alignment` (3), :mod:`~tinymt.heads.stats` (4 and the
attention pass that also counts 3 and 5), :mod:`~tinymt.heads.relations` (5),
:mod:`~tinymt.heads.showcase` (the showcase sentence per head),
:mod:`~tinymt.heads.sentences` (the analysed split), :mod:`~tinymt.heads.report` and
:mod:`~tinymt.heads.relation_report` (figures, TensorBoard, markdown, JSON),
:mod:`~tinymt.heads.sweep` (a sweep's runs compared) and
:mod:`~tinymt.heads.analysis` (``analyze``: the steps in order). It sits at
the top of tinymt, beside the trainer and translate: it imports lower tinymt modules,
and only ``scripts/analyze_heads.py`` and the tests import it.
"""

from tinymt.heads.alignment import (
    AlignmentCounts,
    aer,
    alignment_summary,
    attention_links,
    gold_matrix,
)
from tinymt.heads.analysis import analyze
from tinymt.heads.gates import SELF_KINDS, all_heads, gates_without, head_shapes
from tinymt.heads.importance import head_importance, normalize_importance
from tinymt.heads.pruning import (
    BLEU_DROP,
    CURVES,
    gated_bleu,
    prunable,
    prune_counts,
    prune_order,
    pruned_state,
    pruning_curves,
)
from tinymt.heads.relations import (
    MARGIN,
    MIN_INSTANCES,
    RelationCounts,
    attended_words,
    relation_instances,
    relation_summary,
)
from tinymt.heads.sentences import Sentences, load_sentences
from tinymt.heads.stats import (
    BROAD_ENTROPY,
    POSITIONAL_MASS,
    AttentionStats,
    attention_pass,
    head_labels,
)
from tinymt.words import one_hot, piece_word_weights, pieces_to_words

__all__ = [
    "BLEU_DROP", "BROAD_ENTROPY", "CURVES", "MARGIN", "MIN_INSTANCES", "POSITIONAL_MASS",
    "SELF_KINDS", "AlignmentCounts", "AttentionStats", "RelationCounts", "Sentences",
    "aer", "alignment_summary", "all_heads", "analyze", "attended_words", "attention_links",
    "attention_pass",
    "gated_bleu", "gates_without", "gold_matrix", "head_importance", "head_labels",
    "head_shapes", "load_sentences", "normalize_importance", "one_hot", "piece_word_weights",
    "pieces_to_words", "prunable", "prune_counts", "prune_order", "pruned_state",
    "pruning_curves", "relation_instances", "relation_summary",
]
