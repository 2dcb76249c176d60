"""The unit of the built-in corpus: one sentence pair with its gold word alignment."""

from __future__ import annotations

from dataclasses import dataclass

_ATTACHED = frozenset({".", "?", ",", "!"})


@dataclass(frozen=True, slots=True)
class Pair:
    """A Chinese-English sentence pair, as word sequences, with gold alignment.

    ``alignment`` holds ``(zh_index, en_index)`` links between ``zh_words`` and
    ``en_words`` (sorted). ``zh_relations`` /
    ``en_relations`` hold ``(relation, dependent, head)`` triples on each side: an index
    into :data:`tinymt.corpus.relations.RELATIONS` and two word indices (sorted).
    """

    zh_words: tuple[str, ...]
    en_words: tuple[str, ...]
    alignment: tuple[tuple[int, int], ...]
    zh_relations: tuple[tuple[int, int, int], ...] = ()
    en_relations: tuple[tuple[int, int, int], ...] = ()

    @property
    def zh(self) -> str:
        """Chinese text: the words joined with no spaces (ends in 。 or ？)."""
        return "".join(self.zh_words)

    @property
    def en(self) -> str:
        """English text: words joined by single spaces, punctuation attached."""
        return join_english(self.en_words)


def join_english(words) -> str:
    out = []
    for w in words:
        if w in _ATTACHED and out:
            out[-1] += w
        else:
            out.append(w)
    return " ".join(out)
