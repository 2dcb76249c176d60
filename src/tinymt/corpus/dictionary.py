"""Dictionary pairs: the lexicon's words alone and short phrases, beside the sentences.

Learners type a word first (猫, 李雷, 喜欢); a model that saw whole sentences only makes
one up. So the training split also holds every lexicon word as a pair, in its dictionary
form (猫 cat: a noun's singular, a verb's base form, a place without "the"), and short
phrases the grammar samples (三只猫 three cats, 看书 read books), lower case and without
punctuation. A Chinese word with two translations (看 read / watch) is left out, and a
fixed fifth of the words (``HELD_OUT``) is never a pair: they are only seen inside
sentences, so translating them alone measures what the model learned of the word.
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
