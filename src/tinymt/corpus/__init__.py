"""The built-in Chinese<->English corpus: a synchronous grammar with gold alignments.

``python scripts/train.py`` with no data options trains on pairs generated here. The
grammar (``grammar.py``) samples a language-neutral sentence *structure* (clause,
subject, verb, tense, negation, question, noun phrases with measure words, possessors,
relative clauses ...; ``structures.py``), and ``render.py`` turns one structure into a
Chinese word sequence, an English word sequence and the links between them. The two
languages differ in word order where it matters for attention:

* time and place come before the verb in Chinese and after the object in English
  (我昨天在公园里看了一本书 -> I read a book in the park yesterday);
* 的-modifiers precede the noun in Chinese and follow it in English
  (去北京的机票 -> a ticket to Beijing; 我昨天买的书 -> the book that I bought yesterday);
* 吗 questions invert in English (他喜欢猫吗？ -> Does he like cats?), wh-words front
  (你买了什么？ -> What did you buy?), 因为 C1，所以 C2 -> C2 because C1;
* Chinese aspect words become English morphology (了 past, 正在 progressive, 会 future,
  不/没 negation with do-support, 3rd-singular -s, plurals, irregular forms).

Every English word comes from the Chinese structure, never from a random choice of
synonyms, so each Chinese sentence has exactly one translation. See docs/corpus.md.

Public API::

    from tinymt.corpus import Pair, generate_splits, SHOWCASE
"""

from tinymt.corpus.generate import SHOWCASE, generate_splits, sample_pairs
from tinymt.corpus.pair import Pair

# bump when the grammar or lexicon changes what a seed generates (data caches key on it)
CORPUS_VERSION = "2"  # 2: typed relations on both sides

__all__ = [
    "CORPUS_VERSION",
    "SHOWCASE",
    "Pair",
    "generate_splits",
    "sample_pairs",
]
