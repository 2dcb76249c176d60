"""The synchronous grammar: seeded sampling of sentence structures.

A sentence is one of

* a clause:      SUBJ [TIME] [NEG/AUX] [在 PLACE] VP [吗]
                 (English: [AUX] SUBJ [AUX] VP [PLACE] [TIME], do-support and inversion)
* 因为 C1，所以 C2   -> C2 because C1        (clause reordering)
* C1，但是 C2       -> C1, but C2
* S 觉得/知道 C     -> S think(s)/know(s) C

with the verb phrase one of: a transitive / stative / intransitive / ditransitive (给, 教)
verb, 去 + place (go to), a place object (参观 visit, 离开 leave, 打扫 clean), an adjective
predicate (很累 very tired), 想 + VP (want to), 去 PLACE VP (go to PLACE to VP) or a pivot
verb 请/叫/教/让 X (帮 Y) VP (ask X to help Y VP).

Noun phrases: pronouns, names, kinship (我妈妈 my mother), and common nouns with a
numeral + measure word (三本书 three books, 两杯茶 two cups of tea), a demonstrative
(这只 this, 那只 the, 这些 these, 那些 the), a possessor (我的 my, 李雷的 Li Lei's), an
adjective (黑猫 black cat, 可爱的猫 cute cat), a relative clause (我昨天买的书 the book that
I bought yesterday; 喜欢猫的女孩 the girl who likes cats), a destination (去北京的机票 a
ticket to Beijing), or nothing: a bare count noun is a generic plural (他喜欢猫 He likes
cats) and only appears in present-tense clauses; a bare mass noun is bare in English.

Tense comes from the Chinese aspect words: V了 past, 正在V progressive, 会V future,
none = present (habitual); 没V / 不V / 不会V negation. Time words are drawn to match.

Everything is decided by the Chinese, so each Chinese sentence has exactly one English
translation. ``sample_sentence(rng)`` returns a structure (``structures.py``);
``render.render`` turns it into words and alignment.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import random

from tinymt.corpus import lexicon as L
from tinymt.corpus.structures import (
    NP,
    Because,
    But,
    Clause,
    Copula,
    GoDo,
    Help,
    Pivot,
    RelClause,
    Report,
    Sentence,
    VerbPhrase,
    Want,
)

# --------------------------------------------------------------------------- indexes


def _matches(cats: frozenset, spec: frozenset) -> bool:
    """Does a noun with ``cats`` satisfy a verb's spec ({"thing", "animal:pet", ...})?"""
    return any(all(p in cats for p in tok.split(":")) for tok in spec)


_COUNT_NOUNS = [n for n in L.NOUNS if not n.kin]
_PERSONS = [n for n in L.NOUNS if "person" in n.cats and not n.kin]
_KIN = [n for n in L.NOUNS if n.kin]
_ANIMALS = [n for n in L.NOUNS if "animal" in n.cats]
_GOAL_PLACES = [p for p in L.PLACES if p.goal is not None]
_DESTINATIONS = [p for p in _GOAL_PLACES if "city" in p.tags]  # 去北京的机票: cities, countries
_TIMES_BY_TENSE = {t: [x for x in L.TIMES if t in x.tenses] for t in ("present", "past", "future")}
_TIMES_BY_TENSE["progressive"] = [L.time("现在")]
# times that fix the tense on their own (a copula has no aspect marker: 他昨天很累)
_ONLY = {t: [x for x in L.TIMES if x.tenses == {t}] for t in ("present", "past", "future")}
_PRED_ADJ = [a for a in L.ADJECTIVES if a.pred]
_COPULA_NOUNS = {
    a.zh: [n for n in _COUNT_NOUNS if not n.bare_only and n.cats & a.cats] for a in _PRED_ADJ
}
_ATTR_ADJ = {
    n.zh: [
        a
        for a in L.ADJECTIVES
        if a.attr and a.cats & n.cats and (a.zh, n.zh) not in L.BLOCKED_ADJ_NOUN
    ]
    for n in L.NOUNS
}


class _VerbInfo:
    """What a verb can combine with, computed once from the lexicon."""

    __slots__ = ("loc_places", "obj_nouns", "obj_places", "subj_animals")

    def __init__(self, v: L.Verb):
        spec = v.obj
        # (kin nouns are persons too: never objects here)
        self.obj_nouns = [n for n in L.NOUNS if "person" not in n.cats and _matches(n.cats, spec)]
        if v.frame == "goal":
            self.obj_places = list(_GOAL_PLACES)
        elif v.frame == "placeobj":
            self.obj_places = [p for p in L.PLACES if p.tags & spec]
        else:
            self.obj_places = [p for p in L.PLACES if "city" in p.tags and "city" in spec]
        self.loc_places = [p for p in L.PLACES if p.tags & v.loc]
        self.subj_animals = [n for n in _ANIMALS if _matches(n.cats, v.subj)]


info = functools.cache(_VerbInfo)  # a verb -> what it can combine with, built once


def _frame(*frames):
    return [v for v in L.VERBS if v.frame in frames]


_TRANS = _frame("trans", "stative")
_EVENT_TRANS = _frame("trans")
_INTRANS = _frame("intrans")
_DITRANS = _frame("ditrans")
_PLACEOBJ = _frame("goal", "placeobj")
_PIVOTS = _frame("pivot")
_REPORT = _frame("report")
# verbs inside 想/请/帮 …: no ditransitives, no 帮 (帮 … 帮 …)
_INNER = [v for v in _frame("trans", "intrans", "goal", "placeobj") if v.zh != "帮"]
# verbs that can follow 去 PLACE (go there to do it): the place must suit the verb
_GODO = [
    (v, [p for p in info(v).loc_places if p.goal is not None])
    for v in _frame("trans", "intrans")
    if any(p.goal is not None for p in info(v).loc_places) and "human" in v.subj
]
# relative clauses: which verbs can have each noun as object (object gap)
_REL_VERBS = {
    n.zh: [v for v in _EVENT_TRANS if n in info(v).obj_nouns and "human" in v.subj]
    for n in _COUNT_NOUNS
}
_SUBJ_REL_VERBS_HUMAN = [v for v in _frame("trans", "stative", "intrans") if "human" in v.subj]
_SUBJ_REL_VERBS_ANIMAL = {
    n.zh: [v for v in _frame("trans", "stative", "intrans") if _matches(n.cats, v.subj)]
    for n in _ANIMALS
}


def _pick(r: random.Random, seq):
    return seq[int(r.random() * len(seq))]


class _Choice:
    """A weighted choice: ``_Choice([(w, value), ...])(rng)`` (weights need not sum to 1)."""

    __slots__ = ("cum", "total", "values")

    def __init__(self, table):
        self.values = [v for _, v in table]
        self.cum = list(itertools.accumulate(w for w, _ in table))
        self.total = self.cum[-1]

    def __call__(self, r: random.Random):
        return self.values[bisect.bisect_right(self.cum, r.random() * self.total)]


# --------------------------------------------------------------------------- noun phrases


def _pronoun(r, avoid=()):
    while True:
        p = _pick(r, L.PRONOUNS)
        if p.zh not in avoid:
            return NP("pronoun", p)


def _simple_human(r, avoid=(), allow_kin=True):
    """Pronoun, name, kin (我妈妈) or 那个/这个 person: no clauses inside."""
    x = r.random()
    if x < 0.4:
        return _pronoun(r, avoid)
    if x < 0.75:
        while True:
            n = _pick(r, L.NAMES)
            if n.zh not in avoid:
                return NP("name", n)
    if x < 0.88 and allow_kin:
        return _kin(r, avoid)
    return NP("noun", _pick(r, _PERSONS), det=_pick(r, ("this", "that")))


def _person_np(r, avoid=()):
    """Whom a pivot verb asks or 帮 helps: a pronoun, a name, kin, or a person with a
    demonstrative, an adjective or a possessor (那个聪明的女孩), so the person's noun
    sits at varying distances from the verb."""
    x = r.random()
    if x < 0.5:
        return _simple_human(r, avoid, allow_kin=False)
    if x < 0.65:
        return _kin(r, avoid)
    n = _pick(r, _PERSONS)
    if x < 0.75 and n.cats & _POSSESSABLE:
        return NP("noun", n, possessor=_pronoun(r, avoid))
    np = NP("noun", n, det=_pick(r, ("this", "that")))
    if r.random() < 0.6:
        _adjectives(r, np)
    return np


def _kin(r, avoid=()):
    possessor = _pronoun(r, avoid) if r.random() < 0.5 else NP("name", _pick(r, L.NAMES))
    return NP("noun", _pick(r, _KIN), possessor=possessor)


def _possessor(r):
    x = r.random()
    if x < 0.5:
        return _pronoun(r)
    if x < 0.85:
        return NP("name", _pick(r, L.NAMES))
    if x < 0.93:
        return _kin(r)
    return NP("noun", _pick(r, _PERSONS), det="that")


def _adjectives(r, np: NP) -> None:
    """An attributive adjective for ``np`` (黑猫, 可爱的猫), and sometimes a second: a
    de-adjective before a one-syllable one (漂亮的红裙子 beautiful red skirt)."""
    cands = _ATTR_ADJ[np.head.zh]
    if not cands:
        return
    np.adj = _pick(r, cands)
    de = [a for a in cands if a.attr == "de"]
    mono = [a for a in cands if a.attr == "mono"]
    if de and mono:
        x = r.random()
        if x < 0.452:
            np.adj, np.adj2 = _pick(r, de), _pick(r, mono)
        elif x < 0.565:
            np.adj = _pick(r, mono)
        else:
            np.adj = _pick(r, de)


ADJ_PROB = 0.65  # a common noun's attributive adjective (黑猫, 可爱的猫)
_POSSESSABLE = frozenset(
    {"thing", "clothes", "vehicle", "book", "letter", "ticket", "furniture", "pet", "social"}
    | {"food", "foodm", "drink", "game", "song", "story", "plant"}
)


@functools.cache
def _det_choice(n: L.Noun, present: bool, allow_clause: bool) -> _Choice:
    choices = [(3.0, "num"), (1.2, "this"), (1.5, "that"), (0.5, "these"), (0.6, "those")]
    if present:
        choices.append((2.5, "bare"))
    if n.cats & _POSSESSABLE:  # 我的猫, 我的朋友; not 我的运动员, 我的狼
        choices.append((1.2, "poss"))
    if allow_clause:  # (every count noun has a verb for an object gap or is a person/animal)
        choices.append((0.8, "rel"))
        if "goal" in n.cats:
            choices.append((6.0, "goal"))
    return _Choice(choices)


def noun_np(r, n: L.Noun, tense: str, role: str, allow_clause: bool = True) -> NP:
    """A phrase headed by common noun ``n``; ``role`` is "subj" or "obj".

    Bare count nouns (generic plurals) only in the present tense; subjects never take
    the numeral 一 (Chinese would say 有一只猫…).
    """
    if n.bare_only:
        return NP("noun", n)
    if n.mass:
        x = r.random()
        if x < 0.452:
            return NP("noun", n)
        if x < 0.85:
            return NP("noun", n, det="num", count=_count(r, role))
        return NP("noun", n, det=_pick(r, ("this", "that")))
    kind = _det_choice(n, tense == "present", allow_clause)(r)
    if kind == "poss":
        np = NP("noun", n, possessor=_possessor(r))
    elif kind == "rel":  # 我买的书 the book that I bought; 我买的这两本书: this, the two
        rel = _relative(r, n)
        if rel is None:
            return noun_np(r, n, tense, role, allow_clause=False)
        np = NP("noun", n, rel=rel)
        if r.random() < 0.5:
            np.det = _pick(r, ("this", "num"))
            np.count = 2 + int(r.random() * 9)
    elif kind == "goal":
        det = _Choice([(2, "bare"), (2, "num"), (1, "that")])(r)
        np = NP("noun", n, det=det, goal=_pick(r, _DESTINATIONS))
        if det == "num":
            np.count = _count(r, role)
        return np
    elif kind == "num":
        np = NP("noun", n, det="num", count=_count(r, role))
    else:
        np = NP("noun", n, det=kind)
    if r.random() < ADJ_PROB:
        _adjectives(r, np)
    return np


def _count(r, role: str) -> int:
    return 1 if role == "obj" and r.random() < 0.55 else 2 + int(r.random() * 9)


def _relative(r, n: L.Noun):
    """A relative clause modifying ``n``: object gap (我昨天买的书) or subject gap."""
    verbs = _REL_VERBS.get(n.zh, [])
    subj_gap_ok = bool(n.cats & {"person", "animal"})
    if verbs and (not subj_gap_ok or r.random() < 0.6):
        v = _pick(r, verbs)
        subj = _simple_human(r)
        t = _pick(r, _TIMES_BY_TENSE["past"]) if r.random() < 0.4 else None
        return RelClause("object", v, subj=subj, time=t)
    cands = _SUBJ_REL_VERBS_HUMAN if "person" in n.cats else _SUBJ_REL_VERBS_ANIMAL[n.zh]
    v = _pick(r, cands)
    obj = None
    if v.frame != "intrans":
        obj = _object(r, v, "present", allow_clause=False, avoid_person=True)
        if obj is None:
            return None
    return RelClause("subject", v, obj=obj)


def _object(r, v: L.Verb, tense: str, allow_clause=True, avoid=(), avoid_person=False):
    """An object for ``v`` (None when it has none that fits)."""
    inf = info(v)
    opts = []
    if inf.obj_nouns:
        opts.append((3.0, "noun"))
    if "person" in v.obj and not avoid_person:
        opts.append((2.0, "person"))
    if inf.obj_places:
        opts.append((1.0, "place"))
    if not opts:
        return None
    kind = _Choice(opts)(r)
    if kind == "noun":
        return noun_np(r, _pick(r, inf.obj_nouns), tense, "obj", allow_clause)
    if kind == "place":
        return NP("place", _pick(r, inf.obj_places))
    if r.random() < 0.7 or not allow_clause:
        return _simple_human(r, avoid)
    return noun_np(r, _pick(r, _PERSONS), tense, "obj", allow_clause)


def _subject(r, v: L.Verb | None, tense: str, human: bool | None = None) -> NP:
    """A subject for verb ``v`` (``None``: any human subject)."""
    animals = info(v).subj_animals if v is not None else []
    can_human = v is None or "human" in v.subj
    if human is None:
        human = can_human and (not animals or r.random() < 0.75)
    if not human:
        return noun_np(r, _pick(r, animals), tense, "subj")
    if r.random() < 0.65:
        return _simple_human(r)
    return noun_np(r, _pick(r, _PERSONS), tense, "subj")


# --------------------------------------------------------------------------- clauses

_TENSE_WEIGHTS = [(3, "present"), (3.5, "past"), (1.5, "progressive"), (2.5, "future")]
_TIME_PROB = {"present": 0.35, "past": 0.6, "progressive": 0.4, "future": 0.6}


@functools.cache
def _tense_choice(allowed: tuple[str, ...]) -> _Choice:
    return _Choice([(w, t) for w, t in _TENSE_WEIGHTS if t in allowed])


def _tense(r, allowed=("present", "past", "progressive", "future")) -> str:
    return _tense_choice(allowed)(r)


def _time(r, tense: str):
    return _pick(r, _TIMES_BY_TENSE[tense]) if r.random() < _TIME_PROB[tense] else None


def sample_clause(r: random.Random, question: bool = True, embedded: bool = False) -> Clause:
    """One clause; ``question=False`` keeps it declarative."""
    return _CLAUSE_MAKER(r)(r, question, embedded)


def _finish(r, c: Clause, question: bool, embedded: bool, place_verb=None, add_time=True):
    """Negation, mood, time and place for a clause whose subject and VP are chosen."""
    if c.time is None and add_time:
        c.time = _time(r, c.tense)
    if place_verb is not None and c.place is None and r.random() < 0.3:
        places = info(place_verb).loc_places
        if places:
            c.place = _pick(r, places)
            # 在公园里和李雷踢足球 play football with Li Lei in the park
            if c.subj.human and place_verb.frame != "stative" and r.random() < 0.6:
                c.partner = _simple_human(r, (c.subj.head.zh,) if c.subj.kind == "pronoun" else ())
    x = r.random()
    if question and x < 0.13:
        c.mood = "yn_question"
    elif c.tense != "progressive" and x > (0.9 if c.tense == "past" else 0.8):
        c.negated = True  # 没V: past negations fewer (nothing comes between 没 and V)
    if c.time is not None and not embedded and r.random() < 0.2:
        c.time_first = True
    if r.random() < (0.8 if c.negated else 0.3):
        c.adverb = _adverb(r, c)
    return c


def _adverb(r, c: Clause):
    """An adverb the clause's tense takes (经常, 总是: habitual, present), none after a
    negated adjective (不经常累); when negated, mostly one between 不 and the verb."""
    copula_neg = c.negated and isinstance(c.vp, Copula)
    cands = [(4.0 if a.post and c.negated else 1.0, a) for a in L.ADVERBS
             if c.tense in a.tenses and not (a.post and copula_neg)]
    return _Choice(cands)(r)


def _trans_clause(r, question, embedded):
    v = _pick(r, _TRANS)
    stative = v.frame == "stative"  # 喜欢 like, 认识 know: present, no time word
    tense = "present" if stative else _tense(r)
    subj = _subject(r, v, tense)
    avoid = (subj.head.zh,) if subj.kind == "pronoun" else ()
    obj = _object(r, v, tense, avoid=avoid)
    c = Clause(subj, VerbPhrase(v, obj), tense)
    # wh-questions: 你买了什么？ What did you buy?  谁喜欢猫？ Who likes cats?
    if question and not embedded and r.random() < 0.16:
        y = r.random()
        if y < 0.45 and obj is not None and obj.kind != "place" and v.zh not in L.AMBIGUOUS_VERBS:
            c.vp.obj = NP("wh", "谁" if obj.human else "什么")
            c.mood = "wh_object"
        elif y < 0.75 and "human" in v.subj:
            c.subj = NP("wh", "谁")
            c.mood = "wh_subject"
        elif info(v).loc_places:
            c.mood = "wh_place"
        if c.mood != "declarative":
            c.time = None if stative else _time(r, tense)
            return c
    return _finish(r, c, question, embedded, place_verb=v, add_time=not stative)


def _intrans_clause(r, question, embedded):
    v = _pick(r, _INTRANS)
    tense = _tense(r)
    c = Clause(_subject(r, v, tense), VerbPhrase(v), tense)
    if question and not embedded and r.random() < 0.08 and info(v).loc_places:
        c.mood = "wh_place"
        c.time = _time(r, tense)
        return c
    return _finish(r, c, question, embedded, place_verb=v)


def _goal_clause(r, question, embedded):
    v = _pick(r, _PLACEOBJ)
    tense = _tense(r)
    subj = _subject(r, v, tense)
    return _finish(r, Clause(subj, VerbPhrase(v, _object(r, v, tense)), tense), question, embedded)


def _ditrans_clause(r, question, embedded):
    v = _pick(r, _DITRANS)
    tense = _tense(r, ("present", "past", "future"))
    subj = _subject(r, v, tense, human=True)
    avoid = (subj.head.zh,) if subj.kind == "pronoun" else ()
    iobj = _simple_human(r, avoid)
    obj = noun_np(r, _pick(r, info(v).obj_nouns), tense, "obj", allow_clause=False)
    return _finish(r, Clause(subj, VerbPhrase(v, obj, iobj), tense), question, embedded)


def _copula_clause(r, question, embedded):
    adj = _pick(r, _PRED_ADJ)
    tense = _tense(r, ("present", "past", "future"))
    human_ok = bool(adj.cats & {"human", "person"})
    nouns = _COPULA_NOUNS[adj.zh]
    if human_ok and (not nouns or r.random() < 0.6):
        subj = _subject(r, None, tense, human=True)
    else:
        subj = noun_np(r, _pick(r, nouns), tense, "subj")
    t = None
    if tense == "past":
        t = _pick(r, _ONLY["past"])  # no aspect marker: the time word makes it past
    elif tense == "present" and r.random() < 0.15:
        t = _pick(r, _ONLY["present"])
    c = Clause(subj, Copula(adj), tense, time=t)
    # only future copulas take any time word: 会 marks them; present and past have no
    # aspect word, so their time word alone must fix the tense
    return _finish(r, c, question, embedded, add_time=tense == "future")


def _inner_vp(r, tense: str, verbs=None, avoid=()) -> VerbPhrase:
    v = _pick(r, verbs or _INNER)
    obj = _object(r, v, tense, allow_clause=True, avoid=avoid) if v.frame != "intrans" else None
    return VerbPhrase(v, obj)


def _want_clause(r, question, embedded):
    tense = "present"
    subj = _subject(r, None, tense, human=True)
    avoid = (subj.head.zh,) if subj.kind == "pronoun" else ()
    return _finish(
        r, Clause(subj, Want(_inner_vp(r, tense, avoid=avoid)), tense), question, embedded
    )


def _pivot_clause(r, question, embedded):
    v = _pick(r, _PIVOTS)
    tense = _tense(r, ("past", "future"))
    subj = _subject(r, None, tense, human=True)
    avoid = {subj.head.zh} if subj.kind in ("pronoun", "name") else set()
    pivot = _person_np(r, avoid)
    if pivot.kind in ("pronoun", "name"):
        avoid.add(pivot.head.zh)
    if v.zh == "请" and r.random() < 0.5:  # 请李雷帮我… ask Li Lei to help me …
        not_pivot = (pivot.head.zh,) if pivot.kind in ("pronoun", "name") else ()
        inner = Help(_person_np(r, not_pivot), _inner_vp(r, tense, avoid=tuple(avoid)))
    elif v.zh == "教":
        inner = _inner_vp(r, tense, _INTRANS)
    else:
        inner = _inner_vp(r, tense, avoid=tuple(avoid))
    return _finish(r, Clause(subj, Pivot(v, pivot, inner), tense), question, embedded)


def _godo_clause(r, question, embedded):
    v, places = _pick(r, _GODO)
    tense = _tense(r, ("present", "past", "future"))
    subj = _subject(r, None, tense, human=True)
    obj = _object(r, v, tense) if v.frame != "intrans" else None
    vp = GoDo(_pick(r, places), VerbPhrase(v, obj))
    return _finish(r, Clause(subj, vp, tense), question, embedded)


_CLAUSE_MAKER = _Choice(
    [
        (44, _trans_clause),
        (10, _intrans_clause),
        (8, _goal_clause),
        (5, _ditrans_clause),
        (8, _copula_clause),
        (5, _want_clause),
        (7, _pivot_clause),
        (5, _godo_clause),
    ]
)


# --------------------------------------------------------------------------- sentences


def sample_sentence(r: random.Random) -> Sentence:
    """One random sentence structure (a clause, or two clauses joined)."""
    x = r.random()
    if x < 0.05:
        return Because(sample_clause(r, False, True), sample_clause(r, False, True))
    if x < 0.09:
        return But(sample_clause(r, False, True), sample_clause(r, False, True))
    if x < 0.13:
        subj = _simple_human(r)
        return Report(subj, _pick(r, _REPORT), sample_clause(r, False, True))
    return sample_clause(r)


def sample_phrase(r: random.Random) -> NP | VerbPhrase:
    """A noun phrase or an infinitive verb phrase alone (a dictionary's phrase)."""
    if r.random() < 0.5:  # not a bare plural: a noun alone is its singular (猫 cat)
        while (np := noun_np(r, _pick(r, _COUNT_NOUNS), "present", "obj")).det == "bare" \
                and np.plural:
            pass
        return np
    return _inner_vp(r, "present")


# --------------------------------------------------------------------------- showcase


def showcase_structures() -> tuple[Sentence, Sentence]:
    """The README's two examples, built from grammar structures and lexicon entries."""
    ask = Clause(
        subj=NP("pronoun", L.pronoun("我")),
        vp=Pivot(
            L.verb("请"),
            pivot=NP("name", L.name("李雷")),
            inner=Help(
                NP("pronoun", L.pronoun("我")),
                VerbPhrase(L.verb("订"), NP("noun", L.noun("机票"), goal=L.place("北京"))),
            ),
        ),
        tense="past",
    )
    kitten = Clause(
        subj=NP("noun", L.noun("小猫"), det="that"),
        vp=VerbPhrase(L.verb("追"), NP("noun", L.noun("蝴蝶"), det="num", count=1)),
        tense="past",
        time=L.time("昨天"),
        place=L.place("公园"),
    )
    return ask, kitten
