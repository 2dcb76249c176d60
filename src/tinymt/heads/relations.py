"""Which grammatical relation does each self-attention head track? (Clark et al., 2019)

The built-in corpus knows, for every sentence, typed word-to-word relations on both
sides (:mod:`tinymt.corpus.relations`: subject -> verb, determiner -> noun, ...). For
every encoder self-attention head (source words) and decoder self-attention head (target
words, teacher-forced on the reference) this module counts how often the word a query
word attends to most is its gold partner, per relation and **direction**:

* ``dep->head``: the query is the dependent (the subject), the partner its head (the verb);
* ``head->dep``: the query is the head, the partner its dependent(s).

Word attention is piece attention summed, as the alignment error rate does it
(:func:`tinymt.words.piece_word_weights`): the attention rows of a word's
pieces are added, and what they give each key piece is added per key word; EOS / BOS
belong to no word and count for nothing. The attended word is the *other* word with the
most mass: what a word gives itself is set aside (it is never a partner, and many heads
keep much of a word on itself), as the baseline never uses offset 0. A multi-word partner
("Li Lei") is found when any of its words is the one attended; a multi-word dependent is
one instance per word.

Decoder self-attention is causal: a target word can only see words to its left, so its
instances keep only the partners to the left, and instances with none are left out.

**Baseline** per relation and direction (as Clark et al.): the best fixed offset, i.e.
"always attend to the word ``k`` to the left / right", with ``k`` chosen on the same
instances (left only, for the decoder). A head **tracks** a relation when its accuracy
beats that baseline by at least :data:`MARGIN` (absolute) on at least
:data:`MIN_INSTANCES` instances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinymt.corpus.relations import RELATIONS

MARGIN = 0.10  # a head "tracks" a relation: accuracy >= best fixed offset + 10 points
MIN_INSTANCES = 20  # ... counted over at least this many instances
DIRECTIONS = ("dep->head", "head->dep")  # which end the query word is
MAX_OFFSET = 40  # fixed offsets tried by the baseline: -40..40 words (sentences <= 30)
# kind -> causal: encoder heads see the source words (src_relations), decoder self heads
# the target words to their left (tgt_relations)
RELATION_KINDS = {"encoder_self": False, "decoder_self": True}


def relation_instances(relations, causal: bool) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """``(relation, direction, query word, partner words)`` for one sentence.

    ``relations``: ``(relation, dependent, head)`` triples of word indices. ``direction``
    0 is dep->head, 1 head->dep (an index into :data:`DIRECTIONS`). With ``causal`` only
    partners left of the query are kept (and instances without one dropped).
    """
    partners: dict[tuple[int, int, int], set[int]] = {}
    for r, d, h in relations:
        partners.setdefault((r, 0, d), set()).add(h)
        partners.setdefault((r, 1, h), set()).add(d)
    out = []
    for (r, direction, q), gold in sorted(partners.items()):
        if causal:
            gold = {g for g in gold if g < q}
        if gold:
            out.append((r, direction, q, tuple(sorted(gold))))
    return out


def word_attention(attn: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Piece attention ``(..., T, T)`` -> word attention ``(..., n_words, n_words)``:
    row = query word (its pieces' rows summed), column = key word (mass on its pieces
    summed). ``weights`` ``(T, n_words)``: how much of each position is each word."""
    w = np.asarray(weights, dtype=np.float64)
    return w.T @ np.asarray(attn, dtype=np.float64) @ w


def attended_words(attn: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The other word each query word attends to most, ``(..., n_words)`` (-1: none
    gets any mass), and the share of the query word's attention it gets."""
    mass = word_attention(attn, weights)
    total = mass.sum(axis=-1)
    n = mass.shape[-1]
    mass[..., np.arange(n), np.arange(n)] = -1.0  # the word itself: never a partner
    best = mass.argmax(axis=-1)
    top = mass.max(axis=-1)
    attended = np.where(top > 0, best, -1)
    return attended, np.where(top > 0, top, 0.0) / np.where(total > 0, total, 1.0)


@dataclass
class RelationCounts:
    """Hits per head, instances and baseline hits per fixed offset, for each ``(kind,
    relation, direction)``."""

    shapes: dict[str, tuple[int, int]]  # kind -> (n_layers, n_heads)
    hits: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict)
    n: dict[tuple[str, int, int], int] = field(default_factory=dict)
    offsets: dict[tuple[str, int, int], np.ndarray] = field(default_factory=dict)

    def add(self, kind: str, attn: np.ndarray, weights: np.ndarray, relations) -> None:
        """One sentence: ``attn`` ``(n_layers, n_heads, T, T)`` of ``kind``, ``weights``
        ``(T, n_words)`` (zero rows for BOS / EOS), gold ``relations`` triples."""
        instances = relation_instances(relations, RELATION_KINDS[kind])
        if not instances:
            return
        pred, _ = attended_words(attn, weights)  # (L, h, n_words)
        n_words = weights.shape[1]
        for r, direction, q, gold in instances:
            if q >= n_words:
                continue
            key = (kind, r, direction)
            if key not in self.n:
                self.hits[key] = np.zeros(self.shapes[kind])
                self.n[key] = 0
                self.offsets[key] = np.zeros(2 * MAX_OFFSET + 1)
            self.hits[key] += np.isin(pred[:, :, q], gold)
            self.n[key] += 1
            for g in gold:  # the offsets that would have found it
                if abs(g - q) <= MAX_OFFSET:
                    self.offsets[key][g - q + MAX_OFFSET] += 1


def relation_summary(counts: RelationCounts) -> dict:
    """Per kind: one row per (relation, direction) seen, with the accuracy of every head
    ``(L, h)``, the instances, the best head, the best fixed offset and whether the
    best head tracks the relation (:data:`MARGIN`, :data:`MIN_INSTANCES`)."""
    out: dict[str, dict] = {}
    for kind in RELATION_KINDS:
        rows = []
        for r, name in enumerate(RELATIONS):
            for direction, dname in enumerate(DIRECTIONS):
                key = (kind, r, direction)
                if key not in counts.n:
                    continue
                n = counts.n[key]
                acc = counts.hits[key] / n
                offsets = counts.offsets[key].copy()
                offsets[MAX_OFFSET] = -1  # offset 0 is the query itself: never a partner
                k = int(offsets.argmax())
                best = np.unravel_index(int(acc.argmax()), acc.shape)
                baseline = float(offsets[k] / n)
                rows.append({
                    "relation": name, "direction": dname, "instances": n,
                    "accuracy": acc, "best_head": (int(best[0]), int(best[1])),
                    "best_accuracy": float(acc[best]), "baseline": baseline,
                    "baseline_offset": k - MAX_OFFSET,
                    "tracks": bool(acc[best] >= baseline + MARGIN and n >= MIN_INSTANCES),
                })
        out[kind] = {"rows": rows, "shape": counts.shapes[kind],
                     "tracked": sorted({row["relation"] for row in rows if row["tracks"]})}
    return out


def tracking_heads(summary: dict, kind: str) -> dict[tuple[int, int], list[str]]:
    """``{(layer, head): [relation (direction), ...]}``: every head of ``kind`` that
    beats the baseline of a relation by :data:`MARGIN` (not only the best head)."""
    out: dict[tuple[int, int], list[str]] = {}
    for row in summary[kind]["rows"]:
        if row["instances"] < MIN_INSTANCES:
            continue
        for (layer, h), a in np.ndenumerate(row["accuracy"]):
            if a >= row["baseline"] + MARGIN:
                out.setdefault((layer, h), []).append(f"{row['relation']} ({row['direction']})")
    return out
