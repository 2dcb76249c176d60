"""Language-neutral sentence structures: what the sampler builds and the renderer reads.

A structure names lexicon entries and grammatical features (tense, negation, mood,
determiner, number) but no word order and no inflected form; ``render.py`` turns one
into a Chinese and an English word sequence with alignment. Tests inspect these objects
to know what the English *must* look like (e.g. "3rd singular subject, present,
affirmative" -> the verb's lexicon ``s3`` form) without trusting the renderer.
"""

from __future__ import annotations

from dataclasses import dataclass

from tinymt.corpus.lexicon import Adjective, Adverb, Name, Noun, Place, Pronoun, Time, Verb

# determiners of a common-noun phrase (NounPhrase.det, Chinese -> English):
#   bare   猫 cats (generic plural) / 茶 tea (mass)      num  一只猫 a cat, 三只猫 three cats
#   this   这只猫 this cat     that  那只猫 the cat     these  这些猫 these cats
#   those  那些猫 the cats


@dataclass(slots=True)
class RelClause:
    """A prenominal 的-relative clause.

    gap="object":  [subj (time) verb] 的 N  -> the N that subj verb-ed (time)
    gap="subject": [verb (obj)] 的 N        -> the N who/that verb-s (obj)
    """

    gap: str
    verb: Verb
    subj: NP | None = None  # object gap
    obj: NP | None = None  # subject gap, transitive verb
    time: Time | None = None  # object gap; past time or none (the clause is past tense)


@dataclass(slots=True)
class NP:
    """A noun phrase. ``kind`` says which lexicon entry ``head`` is."""

    kind: str  # pronoun | name | noun | place | wh
    head: Pronoun | Name | Noun | Place | str  # wh: "什么" or "谁"
    det: str = "bare"
    count: int = 1  # numeral for det == "num" (1..10)
    adj: Adjective | None = None
    adj2: Adjective | None = None  # a one-syllable second: 漂亮的红裙子 beautiful red skirt
    possessor: NP | None = None  # 我的猫 my cat; kin nouns: 我妈妈 my mother
    rel: RelClause | None = None  # 我昨天买的书 the book that I bought yesterday
    goal: Place | None = None  # 去北京的机票 a ticket to Beijing

    @property
    def plural(self) -> bool:
        """Is the English phrase plural (for agreement and the noun's form)?"""
        if self.kind != "noun":  # (agreement reads a pronoun's number itself)
            return False
        n = self.head
        if n.mass or n.kin or n.bare_only:
            return False
        if self.det == "num":
            return self.count > 1
        if self.det in ("these", "those"):
            return True
        if self.det == "bare":
            # a bare count noun is a generic plural, unless a modifier makes it a/the N
            return self.rel is None and self.goal is None and self.possessor is None
        return False

    @property
    def agreement(self) -> str:
        """ "1sg" (I am), "3sg" (he is / likes), "pl" (you/we/they/cats are / like)."""
        if self.kind == "pronoun":
            if self.head.plural or self.head.person == 2:
                return "pl"
            return "1sg" if self.head.person == 1 else "3sg"
        return "pl" if self.plural else "3sg"

    @property
    def human(self) -> bool:
        if self.kind in ("pronoun", "name"):
            return True
        return self.kind == "noun" and "person" in self.head.cats  # (never asked of a wh word)


@dataclass(slots=True)
class VerbPhrase:
    """One verb with its objects: trans / stative / intrans / ditrans / goal / placeobj."""

    verb: Verb
    obj: NP | None = None  # direct object (a place NP for goal / placeobj verbs)
    iobj: NP | None = None  # ditransitive recipient: 给我一本书 give me a book


@dataclass(slots=True)
class Copula:
    """Adjective predicate: 他很累 He is very tired."""

    adj: Adjective


@dataclass(slots=True)
class Help:
    """帮 Y VP -> help Y VP (bare infinitive)."""

    helpee: NP
    inner: VerbPhrase


@dataclass(slots=True)
class Pivot:
    """请/叫/教/让 X VP -> ask/tell/teach X to VP, let X VP."""

    verb: Verb
    pivot: NP
    inner: VerbPhrase | Help


@dataclass(slots=True)
class Want:
    """想 VP -> want to VP."""

    inner: VerbPhrase


@dataclass(slots=True)
class GoDo:
    """Serial verbs: 去 PLACE VP -> go to PLACE to VP."""

    place: Place
    inner: VerbPhrase


VP = VerbPhrase | Copula | Pivot | Want | GoDo


@dataclass(slots=True)
class Clause:
    subj: NP
    vp: VP
    tense: str = "present"
    negated: bool = False
    mood: str = "declarative"
    time: Time | None = None
    place: Place | None = None  # locative: 在公园里 in the park
    time_first: bool = False  # 昨天我… instead of 我昨天…
    adverb: Adverb | None = None  # 也 also, 经常 often (declarative and yes-no clauses)
    partner: NP | None = None  # 在公园里和李雷… … with Li Lei in the park (with a place)


@dataclass(slots=True)
class Because:
    """因为 C1，所以 C2。 -> C2 because C1."""

    cause: Clause
    effect: Clause


@dataclass(slots=True)
class But:
    """C1，但是 C2。 -> C1, but C2."""

    first: Clause
    second: Clause


@dataclass(slots=True)
class Report:
    """S 觉得/知道 C -> S think(s)/know(s) C."""

    subj: NP
    verb: Verb
    comp: Clause


Sentence = Clause | Because | But | Report
