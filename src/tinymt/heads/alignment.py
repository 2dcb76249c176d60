"""Cross-attention as word alignment: pieces -> words, links, alignment error rate.

Pieces are mapped to words by their characters (:func:`tinymt.words.piece_word_weights`); a target
word is linked to the source word whose pieces get the most of its pieces' attention
(:func:`attention_links`, the source EOS acting as NULL), and
:class:`AlignmentCounts` adds up ``|A & G|``, ``|A|`` and ``|G|`` over a split for
``AER = 1 - 2|A & G| / (|A| + |G|)`` (sure = possible = gold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_TIE = 1e-6  # word masses this close (relatively) to the maximum count as a tie


def attention_links(attn: np.ndarray, src_weights: np.ndarray,
                    tgt_weights: np.ndarray) -> np.ndarray:
    """Word links of cross-attention ``attn`` ``(..., T_q, S)`` as a bool array
    ``(..., n_src_words, n_tgt_words)``.

    ``src_weights`` ``(S, n_src_words)`` / ``tgt_weights`` ``(T_q, n_tgt_words)``: how much
    of each source position (key) / of the target piece each decoder row predicts belongs
    to each word (:func:`piece_word_weights`; zero rows for EOS). For each target word the
    attention of its pieces is summed, then summed over each source word's pieces; the
    source word with the most mass is linked (several on an exact tie), unless the
    source positions of no word (EOS = NULL) together get more.
    """
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
    covered = to_tgt.sum(axis=1) > 0  # target words that have pieces at all
    links &= covered[:, None]
    return np.swapaxes(links[..., :n_src], -1, -2)  # (..., W_s, W_t)


def gold_matrix(alignment: Sequence[Sequence[int]], n_src_words: int,
                n_tgt_words: int) -> np.ndarray:
    """Gold links ``[(src_i, tgt_i), ...]`` -> bool ``(n_src_words, n_tgt_words)``."""
    gold = np.zeros((n_src_words, n_tgt_words), dtype=bool)
    for i, j in alignment:
        gold[i, j] = True
    return gold


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
        :func:`attention_links` takes them."""
        gold = gold_matrix(gold_links, src_weights.shape[1], tgt_weights.shape[1])
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
