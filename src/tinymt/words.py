"""Sentencepiece pieces -> words, by their characters: the built-in corpus's gold alignments
and relations are between *words*, the model sees *pieces* (head analysis and the viewer
map one to the other here).
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Sequence

import numpy as np

_SPECIAL = frozenset({"<unk>", "<s>", "</s>", "<pad>"})


def _chars(text: str) -> str:
    """NFKC, sentencepiece's word marker and all whitespace removed."""
    return "".join(unicodedata.normalize("NFKC", text).replace("\u2581", " ").split())


def piece_word_weights(pieces: Sequence[str], words: Sequence[str]) -> np.ndarray:
    """How much of each piece belongs to each word: ``(n_pieces, n_words)``, by characters.

    Both sides are compared as character strings (NFKC, whitespace and ``▁`` removed), for
    English and Chinese alike. Row ``p`` holds the fraction of piece ``p``'s characters in
    each word (fractions for a piece spanning words, such as 一个); a bare ``▁`` copies the
    next piece's row. Where the strings differ (``<unk>``, normalisation) the characters are
    matched with difflib; unmatched and special pieces get a row of zeros.
    """
    # word of each character of the joined words
    owner = [w for w, word in enumerate(words) for _ in _chars(word)]
    target_text = "".join(_chars(w) for w in words)
    texts = ["" if p in _SPECIAL else _chars(p) for p in pieces]
    joined = "".join(texts)
    # character i of `joined` -> character of target_text, or -1
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
