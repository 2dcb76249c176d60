"""Gold typed relations of the built-in corpus (tinymt.corpus.relations).

The expected relations are written by hand for hand-built structures (the way a linguist
would annotate the sentence), and checked on samples from the structure objects (which
word is the subject, the verb, the object ...), not from the renderer's link ids.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from conftest import sample_pairs
from tinymt.corpus import SHOWCASE
from tinymt.corpus import lexicon as L
from tinymt.corpus.relations import RELATION_DOCS, RELATIONS
from tinymt.corpus.render import render
from tinymt.corpus.structures import NP, Clause, Copula, RelClause, VerbPhrase


def named(pair, side: str) -> set[tuple[str, str, str]]:
    """The relations of one side as (relation, dependent word, head word)."""
    words = pair.zh_words if side == "zh" else pair.en_words
    return {(RELATIONS[r], words[d], words[h])
            for r, d, h in getattr(pair, f"{side}_relations")}


def np_(kind, zh, **kw) -> NP:
    get = {"pronoun": L.pronoun, "name": L.name, "noun": L.noun}[kind]
    return NP(kind, get(zh), **kw)


# ---------------------------------------------------------------- hand-annotated sentences
# (structure, Chinese, English, Chinese relations, English relations), annotated by hand
HAND = {
    "future": (
        Clause(np_("pronoun", "我"), VerbPhrase(L.verb("去"), NP("place", L.place("上海"))),
               tense="future", time=L.time("明天")),
        "我明天会去上海。", "I will go to Shanghai tomorrow.",
        {("subject", "我", "去"), ("time", "明天", "去"), ("aux", "会", "去"),
         ("object", "上海", "去")},
        {("subject", "I", "go"), ("time", "tomorrow", "go"), ("aux", "will", "go"),
         ("object", "Shanghai", "go")},
    ),
    "negated past": (
        Clause(np_("name", "汤姆"), VerbPhrase(L.verb("去"), NP("place", L.place("学校"))),
               tense="past", negated=True, time=L.time("昨天")),
        "汤姆昨天没去学校。", "Tom did not go to school yesterday.",
        {("subject", "汤姆", "去"), ("time", "昨天", "去"), ("negation", "没", "去"),
         ("object", "学校", "去")},
        {("subject", "Tom", "go"), ("time", "yesterday", "go"), ("negation", "not", "go"),
         ("aux", "did", "go"), ("object", "school", "go")},
    ),
    "progressive, adjectives, demonstratives": (
        Clause(np_("noun", "狗", det="that", adj=L.adjective("黑")),
               VerbPhrase(L.verb("追"), np_("noun", "猫", det="this", adj=L.adjective("可爱"))),
               tense="progressive"),
        "那只黑狗正在追这只可爱的猫。", "The black dog is chasing this cute cat.",
        {("subject", "狗", "追"), ("object", "猫", "追"), ("aux", "正在", "追"),
         ("determiner", "那", "狗"), ("determiner", "只", "狗"), ("adjective", "黑", "狗"),
         ("determiner", "这", "猫"), ("determiner", "只", "猫"), ("adjective", "可爱", "猫")},
        {("subject", "dog", "chasing"), ("object", "cat", "chasing"),
         ("aux", "is", "chasing"), ("determiner", "The", "dog"), ("adjective", "black", "dog"),
         ("determiner", "this", "cat"), ("adjective", "cute", "cat")},
    ),
    "possessive name": (
        Clause(np_("pronoun", "我"),
               VerbPhrase(L.verb("借"), np_("noun", "书", possessor=np_("name", "李雷"))),
               tense="past"),
        "我借了李雷的书。", "I borrowed Li Lei's book.",
        {("subject", "我", "借"), ("object", "书", "借"), ("aux", "了", "借"),
         ("possessive", "李雷", "书")},
        {("subject", "I", "borrowed"), ("object", "book", "borrowed"),
         ("possessive", "Li", "book"), ("possessive", "Lei's", "book")},
    ),
    "relative clause, adjective predicate": (
        Clause(np_("noun", "书", rel=RelClause("object", L.verb("买"), subj=np_("pronoun", "我"),
                                               time=L.time("昨天"))),
               Copula(L.adjective("有趣"))),
        "我昨天买的书很有趣。", "The book that I bought yesterday is very interesting.",
        {("subject", "书", "有趣"), ("relative", "买", "书"), ("subject", "我", "买"),
         ("time", "昨天", "买")},
        {("subject", "book", "interesting"), ("relative", "bought", "book"),
         ("subject", "I", "bought"), ("time", "yesterday", "bought"),
         ("determiner", "The", "book")},
    ),
    "yes-no question": (
        Clause(np_("pronoun", "他"), VerbPhrase(L.verb("喜欢"), np_("noun", "猫")),
               mood="yn_question"),
        "他喜欢猫吗？", "Does he like cats?",
        {("subject", "他", "喜欢"), ("object", "猫", "喜欢"), ("question", "吗", "喜欢")},
        {("subject", "he", "like"), ("object", "cats", "like"), ("question", "Does", "like"),
         ("aux", "Does", "like")},
    ),
}
SHOWCASE_GOLD = {
    "ask": (
        {("subject", "我", "请"), ("pivot", "李雷", "请"), ("pivot", "我", "帮"),
         ("object", "机票", "订"), ("aux", "了", "订"), ("relative", "去", "机票")},
        {("subject", "I", "asked"), ("pivot", "Li", "asked"), ("pivot", "Lei", "asked"),
         ("pivot", "me", "help"), ("object", "ticket", "book"), ("determiner", "a", "ticket"),
         ("relative", "to", "ticket")},
    ),
    "kitten": (
        {("subject", "小猫", "追"), ("object", "蝴蝶", "追"), ("aux", "了", "追"),
         ("determiner", "那", "小猫"), ("determiner", "只", "小猫"),
         ("determiner", "一", "蝴蝶"), ("determiner", "只", "蝴蝶"), ("time", "昨天", "追"),
         ("place", "公园", "追")},
        {("subject", "kitten", "chased"), ("object", "butterfly", "chased"),
         ("determiner", "The", "kitten"), ("determiner", "a", "butterfly"),
         ("time", "yesterday", "chased"), ("place", "the", "chased"),
         ("place", "park", "chased")},
    ),
}


@pytest.mark.parametrize("name", list(HAND))
def test_hand_annotated_relations(name):
    structure, zh, en, gold_zh, gold_en = HAND[name]
    pair = render(structure)
    assert (pair.zh, pair.en) == (zh, en)
    assert named(pair, "zh") == gold_zh
    assert named(pair, "en") == gold_en


@pytest.mark.parametrize("index,name", [(0, "ask"), (1, "kitten")])
def test_showcase_relations(index, name):
    gold_zh, gold_en = SHOWCASE_GOLD[name]
    assert named(SHOWCASE[index], "zh") == gold_zh
    assert named(SHOWCASE[index], "en") == gold_en


def test_documented_examples_are_real():
    """Every relation's example in RELATION_DOCS (and docs/corpus.md) is a gold relation
    of a hand-annotated sentence, on both sides."""
    pairs = [render(h[0]) for h in HAND.values()] + list(SHOWCASE)
    have = {side: set().union(*(named(p, side) for p in pairs)) for side in ("zh", "en")}
    for rel, (_what, zh_ex, en_ex) in RELATION_DOCS.items():
        for side, ex in (("zh", zh_ex), ("en", en_ex)):
            dep, head = ex.split(" -> ")
            assert (rel, dep, head) in have[side], (rel, side, ex)


@pytest.fixture(scope="module")
def samples():
    return sample_pairs(7, 4000)


def test_relations_are_well_formed(samples):
    counts = {"zh": collections.Counter(), "en": collections.Counter()}
    for _s, p in samples:
        for side, words in (("zh", p.zh_words), ("en", p.en_words)):
            rels = getattr(p, f"{side}_relations")
            assert list(rels) == sorted(set(rels))
            for r, d, h in rels:
                assert 0 <= r < len(RELATIONS)
                assert 0 <= d < len(words) and 0 <= h < len(words) and d != h
                counts[side][RELATIONS[r]] += 1
    for side in counts:  # every relation occurs on both sides
        assert set(counts[side]) == set(RELATIONS), (side, counts[side])


def test_subject_and_object_from_the_structure(samples):
    """For single clauses with a plain verb and unique words, the subject's and object's
    head words depend on the verb, on both sides (words found from the structure)."""
    n = 0
    for s, p in samples:
        if not (isinstance(s, Clause) and isinstance(s.vp, VerbPhrase) and s.mood ==
                "declarative" and s.subj.kind in ("pronoun", "noun") and s.vp.obj is not None
                and s.vp.obj.kind == "noun" and s.vp.verb.frame == "trans"
                and s.subj.rel is None and s.vp.obj.rel is None):
            continue
        v, subj, obj = s.vp.verb, s.subj, s.vp.obj
        zh, en = named(p, "zh"), named(p, "en")
        if p.zh_words.count(v.zh) != 1 or p.zh_words.count(obj.head.zh) != 1:
            continue
        assert ("subject", subj.head.zh, v.zh) in zh
        assert ("object", obj.head.zh, v.zh) in zh
        obj_en = obj.head.plural if obj.plural else obj.head.en
        verb_words = set(v.base + v.s3 + v.past + v.ing)
        assert any(r == "object" and d == obj_en[-1] and h in verb_words for r, d, h in en), \
            (p.en, en)
        n += 1
    assert n > 100


def test_docs_name_every_relation_with_its_example():
    """docs/corpus.md's relation table lists exactly RELATIONS, each with the examples
    checked above."""
    doc = (Path(__file__).parents[1] / "docs" / "corpus.md").read_text(encoding="utf-8")
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(RELATIONS)
    for row, (_what, zh, en) in zip(rows, RELATION_DOCS.values()):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2:] == [zh.replace("->", "→"), en.replace("->", "→")], row
