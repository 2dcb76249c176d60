"""The built-in Chinese<->English corpus: a synchronous grammar with gold alignments.

The grammar (``grammar.py``) samples a language-neutral sentence structure
(``structures.py``), and ``render.py`` turns it into a Chinese word sequence, an English
one and the links between them; every English word comes from the Chinese structure, so
each Chinese sentence has exactly one translation. See docs/corpus.md.

    from tinymt.corpus import Pair, generate_splits, SHOWCASE
"""

from tinymt.corpus.generate import SHOWCASE, generate_splits
from tinymt.corpus.pair import Pair

__all__ = ["SHOWCASE", "Pair", "generate_splits"]
