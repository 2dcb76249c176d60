"""Cross-attention as word alignment: pieces -> words, links, alignment error rate.

Pieces are mapped to words by their characters (:func:`piece_word_weights`); a target
word is linked to the source word whose pieces get the most of its pieces' attention
(:func:`attention_links`, the source EOS acting as NULL), and
:class:`AlignmentCounts` adds up ``|A & G|``, ``|A|`` and ``|G|`` over a split for
``AER = 1 - 2|A & G| / (|A| + |G|)`` (sure = possible = gold).
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_SPECIAL = frozenset({"<unk>", "<s>", "</s>", "<pad>"})
_TIE = 1e-6  # word masses this close (relatively) to the maximum count as a tie


def _chars(text: str) -> str:
    """NFKC, sentencepiece's word marker and all whitespace removed."""
    return "".join(unicodedata.normalize("NFKC", text).replace("\u2581", " ").split())


def piece_word_weights(pieces: Sequence[str], words: Sequence[str]) -> np.ndarray:
    """How much of each piece belongs to each word: ``(n_pieces, n_words)``, by characters.

    Pieces and words are compared as character strings with whitespace and ``▁``
    removed (after NFKC, as the data pipeline normalises text), so this works for English
    (pieces start with ``▁`` at word starts, punctuation attached to a word) and for
    Chinese (no spaces; words given by the corpus) alike. Row ``p`` holds the fraction of
    piece ``p``'s characters in each word: one 1 for a piece inside a word, fractions for
    a piece spanning words (Chinese BPE merges frequent pairs such as 一个). A bare ``▁``
    copies the next piece's row. When the two strings differ (``<unk>`` pieces,
    normalisation differences) the characters are matched with difflib; pieces with no
    matched character, and special pieces (``<unk>``, ``</s>``, ...), get a row of zeros.
    """
    owner: list[int] = []  # word of each character of the joined words
    for w, word in enumerate(words):
        owner += [w] * len(_chars(word))
    target_text = "".join(_chars(w) for w in words)
    texts = ["" if p in _SPECIAL else _chars(p) for p in pieces]
    joined = "".join(texts)
    # character i of `joined` -> character of target_text, or -1
    if joined == target_text:
        to_target = list(range(len(joined)))
    else:
        to_target = [-1] * len(joined)
        matcher = difflib.SequenceMatcher(None, joined, target_text, autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            to_target[a:a + size] = range(b, b + size)
    weights = np.zeros((len(pieces), len(words)))
    pos = 0
    for p, text in enumerate(texts):
        hits = [owner[to_target[c]] for c in range(pos, pos + len(text)) if to_target[c] >= 0]
        pos += len(text)
        for w in hits:
            weights[p, w] += 1.0 / len(hits)
    for p in range(len(pieces) - 2, -1, -1):  # bare "▁" pieces join the following word
        if pieces[p] not in _SPECIAL and not texts[p]:
            weights[p] = weights[p + 1]
    return weights


def pieces_to_words(pieces: Sequence[str], words: Sequence[str]) -> list[int]:
    """The word holding most of each piece (the first on a tie; -1: none); see
    :func:`piece_word_weights`."""
    weights = piece_word_weights(pieces, words)
    return [int(row.argmax()) if row.sum() > 0 else -1 for row in weights]


def one_hot(mapping: Sequence[int], n_words: int) -> np.ndarray:
    """``(len(mapping), n_words)`` weights of a hard position -> word map (-1: none)."""
    out = np.zeros((len(mapping), n_words))
    for i, w in enumerate(mapping):
        if w >= 0:
            out[i, w] = 1.0
    return out


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
