"""Dictionary pairs: the lexicon's words alone and short phrases, beside the sentences.

Why, which words and phrases, and the fifth of the words never a pair (``HELD_OUT``, to
measure what the model learned of a word): docs/corpus.md, "Words and phrases alone".
"""

from __future__ import annotations

import random

from tinymt.corpus import lexicon as L
from tinymt.corpus.grammar import sample_phrase
from tinymt.corpus.pair import Pair
from tinymt.corpus.render import render_phrase


def _words() -> dict[str, tuple[str, ...]]:
    forms = ([(p.zh, (p.subj,)) for p in L.PRONOUNS] + [(n.zh, n.en) for n in L.NAMES + L.NOUNS]
             + [(p.zh, p.obj[1:] if p.obj[0] == "the" else p.obj) for p in L.PLACES]
             + [(t.zh, t.en) for t in L.TIMES] + [(v.zh, v.base) for v in L.VERBS]
             + [(a.zh, (a.en,)) for a in L.ADJECTIVES + L.ADVERBS])
    english: dict[str, set] = {}
    for zh, en in forms:
        english.setdefault(zh, set()).add(en)
    return {zh: en for zh, en in forms if len(english[zh]) == 1}


WORDS = _words()  # Chinese word -> its English words, lexicon order
HELD_OUT = frozenset(list(WORDS)[2::5])


# Beside 200,000 sentences a few hundred words must weigh: a word pair (each word in turn)
# per WORD_SHARE training sentences, a phrase per PHRASE_SHARE (how these were chosen:
# docs/corpus.md)
WORD_SHARE, PHRASE_SHARE = 25, 50


def dictionary_pairs(seed: int, sentences: int) -> list[Pair]:
    """The dictionary pairs that go with ``sentences`` training sentences: the words not
    held out, in turn, then distinct phrases of 2-6 Chinese words."""
    words = [Pair((zh,), en, tuple((0, j) for j in range(len(en))))
             for zh, en in WORDS.items() if zh not in HELD_OUT]
    pairs = [words[k % len(words)] for k in range(sentences // WORD_SHARE)]
    r, seen, total = random.Random(f"dictionary {seed}"), set(), len(pairs) + sentences // PHRASE_SHARE
    while len(pairs) < total:
        p = render_phrase(sample_phrase(r))
        if 2 <= len(p.zh_words) <= 6 and p.zh not in seen and p.en not in seen:
            seen.update((p.zh, p.en))
            pairs.append(p)
    return pairs
