"""One teacher-forced pass with attention weights (:func:`attention_pass`): every head's
row statistics (:class:`tinymt.labels.AttentionStats`: entropy, distance, offsets), the
cross heads' word alignments and the self-attention heads' relation counts
(:class:`tinymt.relations.RelationCounts`).

Alignment: decoder row ``t`` predicts target piece ``t``; pieces are mapped to words by
their characters (:func:`tinymt.words.piece_word_weights`). :class:`AlignmentCounts` adds
up ``|A & G|``, ``|A|`` and ``|G|`` over the split for ``AER = 1 - 2|A & G| / (|A| + |G|)``
(sure = possible = gold). One link per target word cannot reproduce many-to-one gold links
(这 个 -> "This"): that floor is the "oracle AER".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinymt.batching import eval_batches
from tinymt.heads.gates import head_shapes
from tinymt.labels import AttentionStats, attention_batches
from tinymt.model import Transformer
from tinymt.relations import RelationCounts
from tinymt.runtime import progress_bar

_TIE = 1e-6  # word masses this close (relatively) to the maximum count as a tie


def attention_links(attn: np.ndarray, src_weights: np.ndarray,
                    tgt_weights: np.ndarray) -> np.ndarray:
    """Word links of cross-attention ``attn`` ``(..., T_q, S)``: bool ``(..., n_src_words,
    n_tgt_words)``. ``src_weights`` ``(S, n_src_words)`` / ``tgt_weights`` ``(T_q,
    n_tgt_words)``: how much of each key / of the piece each row predicts is each word (zero
    rows for EOS). A target word is linked to the source word whose pieces get the most of its
    pieces' attention (several on an exact tie), unless the positions of no word (EOS = NULL)
    together get more."""
    attn = np.asarray(attn, dtype=np.float64)
    src_weights = np.asarray(src_weights, dtype=np.float64)
    n_src = src_weights.shape[1]
    null = 1.0 - src_weights.sum(axis=1, keepdims=True)  # (S, 1): EOS, unmapped pieces
    to_src = np.concatenate([src_weights, null.clip(0.0, 1.0)], axis=1)  # (S, W_s + 1)
    to_tgt = np.asarray(tgt_weights, dtype=np.float64).T  # (W_t, T_q)
    mass = to_tgt @ attn @ to_src  # (..., W_t, W_s + 1)
    best = mass.max(axis=-1, keepdims=True)
    links = (mass >= best * (1 - _TIE)) & (best > 0)
    links[..., :n_src] &= ~links[..., n_src:]  # NULL wins: no link
    links &= (to_tgt.sum(axis=1) > 0)[:, None]  # only target words that have pieces
    return np.swapaxes(links[..., :n_src], -1, -2)  # (..., W_s, W_t)


def aer(hits: float, n_pred: float, n_gold: float) -> float:
    """Alignment error rate with sure = possible = gold: ``1 - 2|A&G| / (|A| + |G|)``."""
    return 1.0 - 2.0 * hits / (n_pred + n_gold) if n_pred + n_gold else float("nan")


@dataclass
class AlignmentCounts:
    """``|A & G|`` and ``|A|`` per cross head, per layer average, overall average; ``|G|``."""

    heads: np.ndarray  # (n_layers, n_heads, 2): hits, predicted
    layers: np.ndarray  # (n_layers, 2): the head-average of each layer
    overall: np.ndarray  # (2,): the average of every cross head
    gold: int = 0
    oracle_pred: int = 0  # target words with a gold link (one link each: the best possible)

    @classmethod
    def zeros(cls, n_layers: int, n_heads: int) -> AlignmentCounts:
        return cls(np.zeros((n_layers, n_heads, 2)), np.zeros((n_layers, 2)), np.zeros(2))

    def add(self, cross: np.ndarray, src_weights: np.ndarray, tgt_weights: np.ndarray,
            gold_links) -> None:
        """One sentence: ``cross`` ``(n_layers, n_heads, T_q, S)``; weights as
        :func:`attention_links` takes them; gold links ``[(src_i, tgt_i), ...]``."""
        gold = np.zeros((src_weights.shape[1], tgt_weights.shape[1]), dtype=bool)
        for i, j in gold_links:
            gold[i, j] = True
        for attn, target in ((cross, self.heads), (cross.mean(axis=1), self.layers),
                             (cross.mean(axis=(0, 1)), self.overall)):
            links = attention_links(attn, src_weights, tgt_weights)
            target[..., 0] += (links & gold).sum(axis=(-2, -1))
            target[..., 1] += links.sum(axis=(-2, -1))
        self.gold += int(gold.sum())
        self.oracle_pred += int(gold.any(axis=0).sum())

    def aer(self, counts: np.ndarray) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        return np.vectorize(lambda h, p: aer(h, p, self.gold))(c[..., 0], c[..., 1])

    @property
    def oracle_aer(self) -> float:
        return aer(self.oracle_pred, self.oracle_pred, self.gold)


def alignment_summary(counts: AlignmentCounts) -> dict:
    """The numbers the report gives: AER per cross head ``(n_layers, n_heads)``, per layer
    (heads averaged), of all cross heads averaged, the best head and its AER, the oracle
    AER and the number of gold links."""
    head_aer = counts.aer(counts.heads)  # (L, h)
    best = np.unravel_index(np.nanargmin(head_aer), head_aer.shape) \
        if np.isfinite(head_aer).any() else (0, 0)
    return {"aer": head_aer, "layer_average_aer": counts.aer(counts.layers),
            "average_aer": float(counts.aer(counts.overall)),
            "best_head": (int(best[0]), int(best[1])),
            "best_aer": float(head_aer[best]), "oracle_aer": counts.oracle_aer,
            "gold_links": counts.gold}


def attention_pass(model: Transformer, src_ids, tgt_ids, batch_tokens: int = 4096,
                   device="cpu", words: dict | None = None, progress: bool = False
                   ) -> tuple[AttentionStats, AlignmentCounts | None, RelationCounts | None]:
    """Every head's entropy / distance statistics and (with ``words``: per sentence, or
    None to skip it, ``src_weights`` / ``tgt_weights`` as :func:`attention_links` takes
    them, ``alignment``, ``src_relations`` / ``tgt_relations`` as
    :meth:`RelationCounts.add`) the cross heads' alignment and self heads' relation counts."""
    stats = AttentionStats()
    shapes = head_shapes(model)
    counts = AlignmentCounts.zeros(*shapes["cross"]) if words is not None else None
    relations = RelationCounts(shapes) if words and "src_relations" in words else None
    batches = progress_bar(eval_batches(src_ids, tgt_ids, batch_tokens), desc="attention",
                           unit="batch", disable=not progress)
    for idx, stacked, src_len, tgt_len in attention_batches(model, batches, device, stats,
                                                            arrays=counts is not None):
        for b, i in enumerate(idx):  # the gold words of each sentence
            src_w, tgt_w = words["src_weights"][i], words["tgt_weights"][i]
            if src_w is None:
                continue
            n_t, n_s = int(tgt_len[b]), int(src_len[b])
            counts.add(stacked["cross"][b, :, :, :n_t, :n_s], src_w, tgt_w, words["alignment"][i])
            if relations is not None:
                relations.add_sentence(stacked, b, words, i, n_s, n_t)
    return stats, counts, relations
