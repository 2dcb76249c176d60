"""Which grammatical relation does each self-attention head track? (Clark et al., 2019)

The measure, the baseline and what *tracks* means (:data:`MARGIN`, :data:`MIN_INSTANCES`):
docs/heads.md. Directions: ``dep->head`` (the query is the dependent), ``head->dep``. Word
attention is piece attention summed, as for the alignment; EOS / BOS belong to no word. A
multi-word partner ("Li Lei") is found when any of its words is attended; a multi-word
dependent is one instance per word. Counted by the head analysis (``tinymt.heads``) over a
split and by the trainer at every probe frame (:mod:`tinymt.labels`) over a sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinymt.corpus.relations import RELATIONS

MARGIN = 0.10  # a head "tracks" a relation: accuracy >= best fixed offset + 10 points
MIN_INSTANCES = 20  # ... counted over at least this many instances
DIRECTIONS = ("dep->head", "head->dep")  # which end the query word is
ARROWS = {"dep->head": "→", "head->dep": "←"}  # dependent → head, head ← dependent
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
    found = [(key, tuple(sorted(g for g in gold if not causal or g < key[2])))
             for key, gold in sorted(partners.items())]
    return [(*key, gold) for key, gold in found if gold]


def word_attention(attn: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``(..., n_words, n_words)``: the share of each query word's attention on each word,
    for piece attention ``attn`` ``(..., T, T)`` and ``weights`` ``(T, n_words)``: how much
    of each position is each word (a word's rows are summed, and the mass on its columns)."""
    w = np.asarray(weights, dtype=np.float64)
    mass = w.T @ np.asarray(attn, dtype=np.float64) @ w  # (..., n_words, n_words)
    total = mass.sum(axis=-1, keepdims=True)
    return mass / np.where(total > 0, total, 1.0)


def relation_heads(attn: np.ndarray, weights: np.ndarray, relations, causal: bool) -> list[dict]:
    """Each gold relation of one sentence (:func:`relation_instances`, one entry per query
    word and partner) with the head that puts the most of the query word's attention on
    the partner: ``{"relation", "direction", "query", "key" (word indices), "head" (layer,
    head), "weight"}``, for ``attn`` ``(L, h, T, T)`` of one kind."""
    share = word_attention(attn, weights)  # (L, h, n, n)
    out = []
    for r, direction, q, partners in relation_instances(relations, causal):
        for k in partners:
            best = np.unravel_index(int(share[..., q, k].argmax()), share.shape[:2])
            out.append({"relation": RELATIONS[r], "direction": DIRECTIONS[direction], "query": q,
                        "key": k, "head": tuple(map(int, best)),
                        "weight": float(share[(*best, q, k)])})
    return out


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
        share = word_attention(attn, weights)  # (L, h, n_words, n_words)
        n = share.shape[-1]
        share[..., np.arange(n), np.arange(n)] = -1.0  # the word itself: never a partner
        pred = np.where(share.max(-1) > 0, share.argmax(-1), -1)  # the word each attends to most
        for r, direction, q, gold in instances:
            key = (kind, r, direction)
            if key not in self.n:
                self.hits[key] = np.zeros(self.shapes[kind])
                self.n[key] = 0
                self.offsets[key] = np.zeros(2 * MAX_OFFSET + 1)
            self.hits[key] += (pred[:, :, q, None] == gold).any(-1)  # (np.isin: 5x slower)
            self.n[key] += 1
            for g in gold:  # the offsets that would have found it
                if abs(g - q) <= MAX_OFFSET:
                    self.offsets[key][g - q + MAX_OFFSET] += 1

    def add_sentence(self, attn: dict[str, np.ndarray], b: int, words: dict, i: int,
                     n_src: int, n_tgt: int) -> None:
        """Sentence ``i`` of ``words`` (as :func:`tinymt.labels.sentence_words` gives
        them), row ``b`` of a batch's ``attn`` ``{kind: (B, L, h, T_q, T_k)}``, its
        ``n_src`` / ``n_tgt`` positions real."""
        tgt_w = words["tgt_weights"][i]
        # decoder input = BOS + the target pieces: the rows of tgt_w (+ EOS) shifted
        dec_w = np.concatenate([np.zeros((1, tgt_w.shape[1])), tgt_w[:-1]])
        self.add("encoder_self", attn["encoder_self"][b, :, :, :n_src, :n_src],
                 words["src_weights"][i], words["src_relations"][i])
        self.add("decoder_self", attn["decoder_self"][b, :, :, :n_tgt, :n_tgt], dec_w,
                 words["tgt_relations"][i])


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


def row_label(row: dict) -> str:
    """``subject →`` (the dependent looks for its head) / ``subject ←`` (the reverse)."""
    return f"{row['relation']} {ARROWS[row['direction']]}"
