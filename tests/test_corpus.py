"""The built-in zh-en corpus: determinism, splits, alignments and the grammar's English.

Construction checks read the *structure* the sampler produced (subject agreement,
tense, negation, determiners ...) and the lexicon entries it names, and compare them
with the rendered words through the gold alignment; they never compare the renderer's
output with itself.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from pathlib import Path

import pytest

from conftest import sample_pairs
from tinymt.corpus import SHOWCASE, Pair, generate_splits
from tinymt.corpus import lexicon as L
from tinymt.corpus.dictionary import (
    HELD_OUT,
    PHRASE_SHARE,
    WORD_SHARE,
    WORDS,
    dictionary_pairs,
)
from tinymt.corpus.grammar import showcase_structures
from tinymt.corpus.pair import join_english
from tinymt.corpus.render import render
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
    VerbPhrase,
    Want,
)

SIZES = {"train_size": 5000, "valid_size": 300, "test_size": 300}


@pytest.fixture(scope="module")
def splits():
    return generate_splits(seed=1234, **SIZES)


@pytest.fixture(scope="module")
def samples():
    """Raw (structure, pair) samples: no dedup, no length filter."""
    return sample_pairs(99, 6000)


def _digest(splits) -> str:
    h = hashlib.sha256()
    for name in ("train", "validation", "test"):
        for p in splits[name]:
            h.update(repr((name, p.zh_words, p.en_words, p.alignment)).encode())
    return h.hexdigest()


def en_of(p: Pair, zi: int) -> tuple[str, ...]:
    """English words aligned with Chinese word ``zi``, in English order."""
    return tuple(p.en_words[j] for i, j in p.alignment if i == zi)


def en_idx(p: Pair, zi: int) -> list[int]:
    return [j for i, j in p.alignment if i == zi]


def only_index(words, w) -> int | None:
    """Index of ``w`` if it occurs exactly once."""
    hits = [i for i, x in enumerate(words) if x == w]
    return hits[0] if len(hits) == 1 else None


def with_to(v: L.Verb, forms: tuple[str, ...]) -> tuple[str, ...]:
    """去 aligns with "go" and "to" (去北京 go to Beijing)."""
    return forms + ("to",) if v.frame == "goal" else forms


def clauses(s) -> list[Clause]:
    """The top-level clauses of a sentence (both halves of because/but, the complement)."""
    if isinstance(s, Clause):
        return [s]
    if isinstance(s, Because):
        return [s.cause, s.effect]
    if isinstance(s, But):
        return [s.first, s.second]
    return [s.comp]


def simple_clauses(samples, mood="declarative"):
    """(clause, pair) for single-clause sentences with a plain verb phrase."""
    for s, p in samples:
        if isinstance(s, Clause) and isinstance(s.vp, VerbPhrase) and s.mood == mood:
            yield s, p


# --------------------------------------------------------------------------- showcase


def test_showcase_pairs_exact():
    ask, kitten = SHOWCASE
    assert ask.zh == "我请李雷帮我订了去北京的机票。"
    assert ask.en == "I asked Li Lei to help me book a ticket to Beijing."
    assert kitten.zh == "那只小猫昨天在公园里追了一只蝴蝶。"
    assert kitten.en == "The kitten chased a butterfly in the park yesterday."
    # built from structures and lexicon entries, not strings
    s_ask, s_kitten = showcase_structures()
    assert render(s_ask) == ask and render(s_kitten) == kitten
    assert isinstance(s_ask.vp, Pivot) and isinstance(s_ask.vp.inner, Help)
    assert s_ask.vp.inner.inner.obj.goal is L.place("北京")
    assert {"pivot", "past", "relative_clause", "goal_modifier"} <= constructions(s_ask)
    assert {"time_place_reorder", "measure_word", "past"} <= constructions(s_kitten)
    # a few gold links: 了 -> asked, 小猫 -> kitten, 公园 -> the park, 昨天 -> yesterday
    assert en_of(ask, ask.zh_words.index("了")) == ("asked",)
    assert en_of(ask, ask.zh_words.index("机票")) == ("a", "ticket")
    assert en_of(kitten, kitten.zh_words.index("小猫")) == ("kitten",)
    assert en_of(kitten, kitten.zh_words.index("公园")) == ("the", "park")
    assert en_of(kitten, kitten.zh_words.index("昨天")) == ("yesterday",)


def test_showcase_in_no_split(splits):
    for pairs in splits.values():
        zh = {p.zh for p in pairs}
        en = {p.en for p in pairs}
        for s in SHOWCASE:
            assert s.zh not in zh and s.en not in en


# --------------------------------------------------------------------------- splits


def test_deterministic_per_seed(splits):
    told = []  # what the progress bar is told: the pairs so far, rising to all of them
    again = generate_splits(seed=1234, **SIZES, progress=told.append)
    assert _digest(again) == _digest(splits)
    assert told == sorted(told) and told[-1] == sum(SIZES.values()) and len(told) > 2
    other = generate_splits(seed=4321, **SIZES)
    assert _digest(other) != _digest(splits)


def test_deterministic_across_processes():
    """No dependence on PYTHONHASHSEED (set iteration order) or on earlier calls."""
    import os
    import subprocess
    import sys

    code = (
        "import hashlib; from tinymt.corpus import generate_splits; "
        "s = generate_splits(seed=11, train_size=1500, valid_size=100, test_size=100); "
        "print(hashlib.sha256(repr([(k, [(p.zh_words, p.en_words, p.alignment) "
        "for p in v]) for k, v in sorted(s.items())]).encode()).hexdigest())"
    )
    out = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        res = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        out.add(res.stdout.strip())
    assert len(out) == 1


def sentences(pairs) -> list[Pair]:
    """The sentence pairs (the dictionary's have no final punctuation)."""
    return [p for p in pairs if p.zh[-1] in "。？"]


def test_sizes_unique_and_disjoint(splits):
    assert {k: len(sentences(v)) for k, v in splits.items()} == {
        "train": 5000,
        "validation": 300,
        "test": 300,
    }
    assert len(splits["validation"]) == len(splits["test"]) == 300  # no dictionary pair
    for side in ("zh", "en"):
        seen: dict[str, str] = {}
        for name, pairs in splits.items():
            for p in sentences(pairs):
                text = getattr(p, side)
                assert text not in seen, f"{side} {text!r} in {seen.get(text)} and {name}"
                seen[text] = name


def test_dictionary_pairs_words_alone_and_phrases(splits):
    """Every lexicon word of one translation is a training pair, in its dictionary form,
    except the held-out fifth, which is seen only inside sentences; phrases are short, lower
    case (names aside) and unpunctuated. (The pairs of 20,000 sentences: every word's turn
    comes; the 5,000 of ``splits`` have a word pair per WORD_SHARE sentences.)"""
    assert splits["train"][len(sentences(splits["train"])):] == dictionary_pairs(1234, 5000)
    pairs = dictionary_pairs(1234, 20_000)
    words = {p.zh: p.en for p in pairs if len(p.zh_words) == 1}
    assert {"猫": "cat", "李雷": "Li Lei", "公园": "park", "喜欢": "like", "前天":
            "the day before yesterday", "我": "I", "可爱": "cute", "总是": "always",
            "妈妈": "mother", "茶": "tea"}.items() <= words.items()
    assert not {"看", "开", "坐"} & words.keys()  # two translations: not a word alone
    assert HELD_OUT and not HELD_OUT & words.keys()
    assert set(WORDS) == words.keys() | HELD_OUT
    assert len(HELD_OUT) == round(len(WORDS) / 5)
    assert {"names", "nouns", "verbs", "places"} <= {kind for w in HELD_OUT for kind, table in (
        ("names", L.NAMES), ("nouns", L.NOUNS), ("verbs", L.VERBS), ("places", L.PLACES))
        if w in {e.zh for e in table}}
    train = "".join(p.zh for p in sentences(splits["train"]))
    assert sum(w in train for w in HELD_OUT) >= 0.9 * len(HELD_OUT)  # (5,000 sentences)
    phrases = [p for p in pairs if len(p.zh_words) > 1]
    assert len(phrases) == 20_000 // PHRASE_SHARE and len(pairs) - len(phrases) == 20_000 // WORD_SHARE
    names = tuple(" ".join(n.en) for n in L.NAMES)
    for p in phrases:
        assert 2 <= len(p.zh_words) <= 6, p
        assert p.en_words[0].islower() or p.en.startswith(names), p
        assert p.zh[-1] not in "。？" and p.en[-1] not in ".?", p


@pytest.mark.slow
def test_each_chinese_sentence_has_one_translation(samples):
    more = sample_pairs(5, 14000)
    by_zh = collections.defaultdict(set)
    for _, p in samples + more:
        by_zh[p.zh].add(p.en)
    clashes = {k: v for k, v in by_zh.items() if len(v) > 1}
    assert not clashes


@pytest.mark.parametrize(
    "words, text",
    [
        (("Children", "draw", "butterflies", "."), "Children draw butterflies."),
        (("Does", "he", "like", "cats", "?"), "Does he like cats?"),
        (("She", "left", "on", "Monday", ",", "but", "he", "stayed", "."),
         "She left on Monday, but he stayed."),
        (("Li", "Lei's", "friend", "came", "!"), "Li Lei's friend came!"),
        (("It", "rained", ".", "."), "It rained.."),  # each mark attaches to the word before
        ((".", "Yes"), ". Yes"),  # nothing to attach to: a word of its own
        (("Xi'an",), "Xi'an"),
        ((), ""),
    ],
)
def test_join_english(words, text):
    assert join_english(words) == text
    pair = Pair(("他", "走", "了", "。"), words, ())
    assert pair.en == text
    assert pair.zh == "他走了。"


def test_text_forms(splits):
    for p in splits["train"][:2000] + splits["test"]:
        assert " " not in p.zh and p.zh.endswith(p.zh_words[-1])
        assert p.zh_words[-1] in ("。", "？")
        assert p.en_words[-1] in (".", "?")
        assert (p.zh_words[-1] == "？") == (p.en_words[-1] == "?")
        assert p.en[0].isupper() and p.en[-1] == p.en_words[-1]
        assert "  " not in p.en and not re.search(r" [.,?]", p.en)
        # the text holds the same words in the same order, whatever the spacing
        assert re.findall(r"[^ .,?]+", p.en) == [w for w in p.en_words if w not in ".,?"]


def test_lengths(splits):
    pairs = sentences(splits["train"])
    nz = [len(p.zh_words) for p in pairs]
    ne = [len(p.en_words) for p in pairs]
    assert min(nz) >= 3 and min(ne) >= 3
    assert max(nz) <= 30 and max(ne) <= 30
    assert sum(n >= 20 for n in nz) > 20 and sum(n >= 20 for n in ne) > 20
    mid = sum(5 <= a <= 15 and 5 <= b <= 15 for a, b in zip(nz, ne))
    assert mid / len(pairs) > 0.75  # most sentences are 5-15 words
    assert 6 <= sum(ne) / len(ne) <= 13


# --------------------------------------------------------------------------- alignment


def test_alignment_valid_and_covers_every_word(splits):
    for p in splits["train"] + splits["test"]:
        assert list(p.alignment) == sorted(set(p.alignment))
        for i, j in p.alignment:
            assert 0 <= i < len(p.zh_words) and 0 <= j < len(p.en_words)
        # policy (render.py): every word on both sides is aligned, function words
        # with what they mark (了 -> the past verb, 的 -> my/'s/that, "the" -> its noun)
        assert {i for i, _ in p.alignment} == set(range(len(p.zh_words))), p
        assert {j for _, j in p.alignment} == set(range(len(p.en_words))), p


def test_alignment_of_function_words(samples):
    seen = collections.Counter()
    for _s, p in samples:
        for i, w in enumerate(p.zh_words):
            e = en_of(p, i)
            if w == "吗":
                assert e[0][0].isupper() and e[0].lower() in {
                    "do",
                    "does",
                    "did",
                    "am",
                    "is",
                    "are",
                    "was",
                    "were",
                    "will",
                }
                seen[w] += 1
            elif w == "。":
                assert e == (".",)
            elif w == "了":
                assert len(e) >= 1
                seen[w] += 1
    assert seen["吗"] > 50 and seen["了"] > 500


# --------------------------------------------------------------------------- constructions


STRUCTURES = (Clause, Because, But, Report, NP, RelClause, VerbPhrase, Copula, Help, Pivot,
              Want, GoDo)


def structure_nodes(x):
    """``x`` and every structure inside it (clauses, verb phrases, noun phrases), depth first."""
    if isinstance(x, STRUCTURES):
        yield x
        for f in dataclasses.fields(x):
            yield from structure_nodes(getattr(x, f.name))


def constructions(s) -> set[str]:
    """The grammatical constructions a sentence structure exercises, read off the structure
    as a grammar book names them (the renderer keeps no record of them)."""
    out = set()
    for n in structure_nodes(s):
        if isinstance(n, (Because, But, Report, Pivot, Want, Copula)):
            out.add(type(n).__name__.lower())
        elif isinstance(n, GoDo):
            out.add("go_do")
        elif isinstance(n, VerbPhrase) and n.verb.frame == "ditrans":
            out.add("ditrans")
        elif isinstance(n, Clause):
            out |= {n.tense} | ({"negation"} if n.negated else set())
            if n.mood != "declarative":
                out |= {"question", "yn_question" if n.mood == "yn_question" else "wh_question"}
            if n.time is not None or n.place is not None:  # 昨天在公园里追 chased in the park yesterday
                out.add("time_place_reorder")
            if n.time is not None and n.time_first:
                out.add("time_fronted")
            if n.tense in ("present", "past") and (
                    n.negated or n.mood in ("yn_question", "wh_object", "wh_place")):
                out.add("do_support")  # does not like, did he go, what does he read
            elif n.tense == "present" and n.subj.agreement == "3sg":
                out.add("agreement_3sg")
        elif isinstance(n, NP) and n.kind == "noun":
            noun = n.head
            measured = n.det not in ("bare", "these", "those")  # 一只猫, 那杯茶
            for name, present in (
                    ("kinship", noun.kin), ("possessive", n.possessor is not None),
                    ("relative_clause", n.rel is not None or n.goal is not None),
                    ("goal_modifier", n.goal is not None), ("plural", n.plural),
                    ("generic_plural", n.det == "bare" and n.plural),
                    ("irregular_plural", n.plural and noun.plural[-1] not in {
                        noun.en[-1] + "s", noun.en[-1] + "es", noun.en[-1][:-1] + "ies"}),
                    ("measure_word", measured and not noun.kin),
                    ("mass_measure", measured and noun.mass),
                    ("adjective", n.adj is not None or n.adj2 is not None)):
                if present:
                    out.add(name)
    return out


def test_required_constructions_present(samples):
    """Every construction the corpus promises (docs/corpus.md) is in at least 5 of 6,000
    sentences, counted on their structures."""
    tags = collections.Counter(t for s, _ in samples for t in constructions(s))
    required = {"past", "present", "progressive", "future", "negation", "plural",
                "irregular_plural", "relative_clause", "goal_modifier", "possessive", "kinship",
                "question", "yn_question", "wh_question", "pivot", "want", "go_do",
                "time_place_reorder", "measure_word", "mass_measure", "adjective", "copula",
                "ditrans", "because", "but", "report", "agreement_3sg", "do_support",
                "generic_plural", "time_fronted"}
    missing = {t for t in required if tags[t] < 5}
    assert not missing, missing


def test_present_tense_agreement(samples):
    """3sg subject, present, affirmative -> the lexicon's 3sg form; otherwise the base."""
    n3 = nother = 0
    for c, p in simple_clauses(samples):
        if c.tense != "present" or c.negated:
            continue
        v = c.vp.verb
        vi = only_index(p.zh_words, v.zh)
        if vi is None:
            continue
        expected = v.s3 if c.subj.agreement == "3sg" else v.base
        assert en_of(p, vi) == with_to(v, expected), p
        if c.subj.agreement == "3sg":
            n3 += 1
        else:
            nother += 1
    assert n3 > 100 and nother > 100


def test_past_and_negation_forms(samples):
    counts = collections.Counter()
    for c, p in simple_clauses(samples):
        v = c.vp.verb
        vi = only_index(p.zh_words, v.zh)
        if vi is None:
            continue
        if c.tense == "past" and not c.negated:
            assert en_of(p, vi) == with_to(v, v.past), p
            assert en_of(p, p.zh_words.index("了")) == v.past[:1]
            counts["past"] += 1
        elif c.tense == "past" and c.negated:
            assert en_of(p, p.zh_words.index("没")) == ("did", "not"), p
            assert en_of(p, vi) == with_to(v, v.base)
            assert "了" not in p.zh_words
            counts["past_neg"] += 1
        elif c.tense == "present" and c.negated:
            do = "does" if c.subj.agreement == "3sg" else "do"
            assert en_of(p, p.zh_words.index("不")) == (do, "not"), p
            assert en_of(p, vi) == with_to(v, v.base)
            counts["present_neg"] += 1
        elif c.tense == "future":
            assert "will" in en_of(p, p.zh_words.index("会"))
            assert en_of(p, vi) == with_to(v, v.base)
            if c.negated:
                assert en_of(p, p.zh_words.index("不")) == ("not",)
            counts["future"] += 1
        elif c.tense == "progressive":
            marker = "正" if c.place is not None else "正在"
            be = {"1sg": "am", "3sg": "is", "pl": "are"}[c.subj.agreement]
            assert en_of(p, p.zh_words.index(marker)) == (be,), p
            assert en_of(p, vi) == with_to(v, v.ing)
            counts["progressive"] += 1
    assert min(counts.values()) > 30 and len(counts) == 5, counts


def test_copula_forms(samples):
    n = 0
    for s, p in samples:
        if not (isinstance(s, Clause) and isinstance(s.vp, Copula) and s.mood == "declarative"):
            continue
        adj = s.vp.adj
        ai = only_index(p.zh_words, adj.zh)
        if ai is None:
            continue
        en = en_of(p, ai)
        assert en[-1] == adj.en
        if s.tense == "present":
            assert en[0] == {"1sg": "am", "3sg": "is", "pl": "are"}[s.subj.agreement]
        elif s.tense == "past":
            assert en[0] == ("were" if s.subj.agreement == "pl" else "was")
            assert s.time is not None and s.time.tenses == {"past"}
        else:
            assert en == ("be", adj.en)
        assert ("很" in p.zh_words) == (not s.negated) == ("very" in p.en_words)
        n += 1
    assert n > 100


def test_yes_no_questions_invert(samples):
    n = 0
    for s, p in samples:
        if not (isinstance(s, Clause) and s.mood == "yn_question"):
            continue
        agr = s.subj.agreement
        if isinstance(s.vp, Copula):
            expected = {
                "present": {"1sg": "Am", "3sg": "Is", "pl": "Are"}[agr],
                "past": "Were" if agr == "pl" else "Was",
                "future": "Will",
            }[s.tense]
        else:
            expected = {
                "present": "Does" if agr == "3sg" else "Do",
                "past": "Did",
                "progressive": {"1sg": "Am", "3sg": "Is", "pl": "Are"}[agr],
                "future": "Will",
            }[s.tense]
        assert p.en_words[0] == expected, p
        assert p.zh_words[-2:] == ("吗", "？") and p.en_words[-1] == "?"
        assert en_of(p, len(p.zh_words) - 2) == (expected,)  # 吗 <-> the fronted aux
        n += 1
    assert n > 200


def test_wh_questions_front_the_wh_word(samples):
    n = 0
    for s, p in samples:
        if isinstance(s, Clause) and s.mood in ("wh_object", "wh_subject", "wh_place"):
            wh = {"wh_place": "Where"}.get(s.mood)
            if wh is None:
                np = s.vp.obj if s.mood == "wh_object" else s.subj
                wh = "Who" if np.head == "谁" else "What"
                zi = p.zh_words.index(np.head)
            else:
                zi = p.zh_words.index("哪里")
            assert p.en_words[0] == wh and en_idx(p, zi) == [0], p
            assert "吗" not in p.zh_words and p.en_words[-1] == "?"
            n += 1
    assert n > 100


def _object_nps(samples):
    """(clause, pair, object NP) for plain verb phrases with a common-noun object."""
    for c, p in simple_clauses(samples):
        o = c.vp.obj
        if o is not None and o.kind == "noun" and not o.head.kin:
            yield c, p, o


def test_plurals_numerals_and_measure_words(samples):
    counts = collections.Counter()
    for _c, p, o in _object_nps(samples):
        n = o.head
        ni = only_index(p.zh_words, n.zh)
        if ni is None or o.det != "num" or n.mass:
            continue
        num_zh, num_en = L.NUMERALS[o.count - 1]
        k = max(i for i in range(ni) if p.zh_words[i] == num_zh)  # closest before the noun
        assert p.zh_words[k + 1] == n.mw  # numeral + measure word + (adj) + noun
        det = en_of(p, k)
        assert det == en_of(p, k + 1)  # measure word aligns with the article / number
        if o.count == 1:
            assert det in (("a",), ("an",))
            assert en_of(p, ni) == n.en
            counts["sg"] += 1
        else:
            assert det == (num_en,)
            # 艾米带的九个苹果 the nine apples that Amy brought: "the" is the noun's
            the = ("the",) if o.rel is not None else ()
            assert en_of(p, ni) == the + n.plural, p
            counts["pl"] += 1
            if n.plural[-1] in (
                "mice",
                "children",
                "men",
                "women",
                "geese",
                "sheep",
                "fish",
                "wolves",
                "policemen",
                "scarves",
                "bookshelves",
            ):
                counts["irregular"] += 1
    assert counts["sg"] > 50 and counts["pl"] > 50 and counts["irregular"] > 0, counts


def test_generic_bare_plurals_only_in_present(samples):
    n = 0
    for c, p, o in _object_nps(samples):
        if o.det == "bare" and o.plural:
            assert c.tense == "present"
            ni = only_index(p.zh_words, o.head.zh)
            if ni is not None:
                assert en_of(p, ni) == o.head.plural
                n += 1
    assert n > 50


def test_demonstratives(samples):
    n = 0
    for _c, p, o in _object_nps(samples):
        if o.det in ("this", "that") and not o.head.mass:
            zh_det = {"this": "这", "that": "那"}[o.det]
            k = only_index(p.zh_words, zh_det)
            if k is None:
                continue
            assert p.zh_words[k + 1] == o.head.mw
            assert en_of(p, k) == ({"this": "this", "that": "the"}[o.det],)
            n += 1
    assert n > 50


def test_possessives(samples):
    n = collections.Counter()
    for _c, p, o in _object_nps(samples):
        if o.possessor is None:
            continue
        poss = o.possessor
        if poss.kind == "pronoun":
            k = only_index(p.zh_words, poss.head.zh)
            if k is None:
                continue
            assert p.zh_words[k + 1] == "的"
            assert en_of(p, k) == (poss.head.poss,)
            assert en_of(p, k + 1) == (poss.head.poss,)  # 的 <-> my
            n["pronoun"] += 1
        elif poss.kind == "name":
            k = only_index(p.zh_words, poss.head.zh)
            if k is None:
                continue
            words = en_of(p, k)
            assert words[:-1] == poss.head.en[:-1] and words[-1] == poss.head.en[-1] + "'s"
            n["name"] += 1
    assert n["pronoun"] > 20 and n["name"] > 20, n


def test_kinship_without_de(samples):
    n = 0
    for s, p in samples:
        for c in clauses(s):
            subj = c.subj
            if subj.kind == "noun" and subj.head.kin and subj.possessor.kind == "pronoun":
                k = only_index(p.zh_words, subj.head.zh)
                if k is None:
                    continue
                assert p.zh_words[k - 1] == subj.possessor.head.zh  # 我妈妈: no 的
                assert en_of(p, k - 1)[0].lower() == subj.possessor.head.poss.lower()
                assert en_of(p, k) == subj.head.en
                n += 1
    assert n > 30


def test_relative_clauses_reorder(samples):
    n = collections.Counter()
    for _c, p, o in _object_nps(samples):
        if o.rel is None and o.goal is None:
            continue
        hi = len(p.zh_words) - 1 - p.zh_words[::-1].index(o.head.zh)  # head: last mention
        head_en = en_idx(p, hi)
        if o.rel is not None:  # Chinese: [clause] 的 (这 / numeral + MW) (adjectives) head
            mods = {"这", o.head.mw, *L.NUMERALS[o.count - 1][:1]}
            mods |= {a.zh for a in (o.adj, o.adj2) if a is not None}
            di = hi - 1
            while p.zh_words[di] in mods or p.zh_words[di - 1] in mods - {"这"}:
                di -= 1
            assert p.zh_words[di] == "的", p
            rel_word = en_of(p, di)
            assert rel_word == (("who",) if "person" in o.head.cats else ("that",))
            that = en_idx(p, di)[0]
            assert max(head_en) < that  # English: head that [clause]
            if o.det == "this":  # 我买的这本书 this book that I bought
                assert en_of(p, p.zh_words.index("这", di)) == ("this",)
            else:  # 我买的(两本)书 the (two) books that I bought
                assert p.en_words[min(head_en)] == "the"
            if o.rel.gap == "object":  # 我昨天买的书 the book that I bought yesterday
                vi = max(i for i in range(hi) if p.zh_words[i] == o.rel.verb.zh)
                assert en_of(p, vi) == o.rel.verb.past
                assert min(en_idx(p, vi)) > that
            n[o.rel.gap] += 1
        else:  # 去北京的机票 a ticket to Beijing
            gi = hi - 2  # Chinese: 去 X 的 head
            assert p.zh_words[gi - 1 : gi + 2] == ("去", o.goal.zh, "的")
            assert en_of(p, gi) == o.goal.goal
            assert min(en_idx(p, gi)) > max(head_en)
            assert en_of(p, gi - 1) == ("to",)
            n["goal"] += 1
    assert n["object"] > 20 and n["goal"] > 20 and n["subject"] > 3, n


def test_time_and_place_reorder(samples):
    n = collections.Counter()
    for c, p, o in _object_nps(samples):
        if c.time is None and c.place is None:
            continue
        vi = only_index(p.zh_words, c.vp.verb.zh)
        oi = only_index(p.zh_words, o.head.zh)
        if vi is None or oi is None:
            continue
        obj_en = max(en_idx(p, oi))
        if c.time is not None:
            ti = p.zh_words.index(c.time.zh)
            assert ti < vi  # Chinese: time before the verb
            assert min(en_idx(p, ti)) > obj_en  # English: after the object
            assert en_of(p, ti) == c.time.en
            n["time"] += 1
        if c.place is not None:
            pi = p.zh_words.index(c.place.zh)
            assert p.zh_words[pi - 1] == "在" and pi < vi
            assert min(en_idx(p, pi)) > obj_en
            prep = en_of(p, pi - 1)
            assert prep == (c.place.loc_prep,)
            assert en_of(p, pi) == c.place.loc
            if c.time is not None:  # English: place, then time
                assert max(en_idx(p, pi)) < min(en_idx(p, p.zh_words.index(c.time.zh)))
            n["place"] += 1
    assert n["time"] > 200 and n["place"] > 50, n


def test_serial_and_pivot_verbs(samples):
    n = collections.Counter()
    for s, p in samples:
        if not (isinstance(s, Clause) and s.mood == "declarative" and not s.negated):
            continue
        vp = s.vp
        if isinstance(vp, Pivot):
            vi = p.zh_words.index(vp.verb.zh)
            head = en_of(p, vi)
            if s.tense == "past":
                assert head == vp.verb.past
                assert en_of(p, p.zh_words.index("了")) == vp.verb.past
            j = max(en_idx(p, vi))
            rest = p.en_words[j + 1 :]
            inner = vp.inner.inner if isinstance(vp.inner, Help) else vp.inner
            if vp.verb.to:  # ask X to V / let X V
                assert "to" in rest
            # the inner verb is in the base form, whatever the tense
            ii = p.zh_words.index(inner.verb.zh, vi + 1)
            to = ("to",) if vp.verb.to and inner is vp.inner else ()  # "to" <-> its verb
            assert en_of(p, ii) == with_to(inner.verb, to + inner.verb.base)
            n["pivot"] += 1
            if isinstance(vp.inner, Help):
                assert en_of(p, p.zh_words.index("帮", vi)) == ("to", "help")
                n["help"] += 1
        elif isinstance(vp, Want):
            wi = p.zh_words.index("想")
            want = ("wants",) if s.subj.agreement == "3sg" else ("want",)
            assert en_of(p, wi) == want
            ii = p.zh_words.index(vp.inner.verb.zh, wi + 1)
            assert en_of(p, ii) == with_to(vp.inner.verb, ("to",) + vp.inner.verb.base)
            n["want"] += 1
        elif isinstance(vp, GoDo):
            gi = p.zh_words.index("去")
            assert p.zh_words[gi + 1] == vp.place.zh
            assert en_of(p, gi + 1) == vp.place.goal
            n["go_do"] += 1
    assert min(n.values()) > 20 and len(n) == 4, n


def test_ditransitive(samples):
    n = 0
    for c, p in simple_clauses(samples):
        if c.vp.verb.frame != "ditrans" or c.vp.iobj.kind != "pronoun":
            continue
        k = only_index(p.zh_words, c.vp.iobj.head.zh)
        if k is None:
            continue
        assert en_of(p, k) == (c.vp.iobj.head.obj,)  # object case: gave me a book
        n += 1
    assert n > 20


def test_because_reorders_clauses(samples):
    from tinymt.corpus.structures import Because

    n = 0
    for s, p in samples:
        if isinstance(s, Because):
            assert p.zh_words[0] == "因为" and "所以" in p.zh_words
            b = p.en_words.index("because")
            assert en_idx(p, 0) == [b]
            # the effect clause (after 所以 in Chinese) comes first in English
            so = p.zh_words.index("所以")
            after = [j for i, j in p.alignment if so < i < len(p.zh_words) - 1]
            assert max(after) < b
            n += 1
    assert n > 50


# --------------------------------------------------------------------------- lexicon


def test_lexicon_size_as_docs_say_and_no_word_twice():
    """docs/corpus.md's counts are the lexicon's. The lexicon's rows themselves are checked
    where they are used: in the sentences the grammar renders from them (numerals, measure
    words, irregular plurals above; a name, a place, a time and 小猫 -> kitten in the
    showcase pairs)."""
    n = L.NOUNS
    counts = {"pronouns": len(L.PRONOUNS), "names": len(L.NAMES),
              "animals": sum("animal" in x.cats for x in n),
              "people": sum("person" in x.cats and not x.kin for x in n),
              "kinship nouns": sum(x.kin for x in n),
              "objects/food/vehicles/tickets/\nplants": sum(
                  not (x.cats & {"animal", "person", "subject"}) and not x.mass for x in n),
              "mass nouns": sum(x.mass for x in n),
              "school subjects": sum("subject" in x.cats for x in n),
              "places": len(L.PLACES), "time words": len(L.TIMES), "verbs": len(L.VERBS),
              "adjectives": len(L.ADJECTIVES), "adverbs": len(L.ADVERBS),
              "measure words": len({x.mw for x in n if x.mw})}
    total = sum(counts.values()) + len(L.NUMERALS)
    doc = (Path(__file__).parents[1] / "docs" / "corpus.md").read_text()
    para = doc[doc.index("**Lexicon ("):]
    para = para[:para.index("\n\n")]
    assert f"**Lexicon ({total} entries):**" in para
    for what, count in counts.items():
        assert re.search(rf"\b{count} {re.escape(what)}", para), (what, count)
    # no Chinese word is two different lexicon entries of the same kind
    for table in (L.NOUNS, L.NAMES, L.PLACES, L.TIMES, L.ADJECTIVES, L.PRONOUNS):
        zh = [e.zh for e in table]
        assert len(zh) == len(set(zh))


def test_np_plural_rules():
    cat = L.noun("猫")
    assert NP("noun", cat).plural  # 猫 (generic) -> cats
    assert not NP("noun", cat, det="num", count=1).plural
    assert NP("noun", cat, det="num", count=3).plural
    assert NP("noun", cat, det="those").plural
    assert not NP("noun", L.noun("茶")).plural  # mass
    assert not NP("noun", L.noun("机票"), goal=L.place("北京")).plural  # a ticket to ...
    assert NP("pronoun", L.pronoun("你")).agreement == "pl"
    assert NP("pronoun", L.pronoun("我")).agreement == "1sg"


# --------------------------------------------------------------------------- datasets
