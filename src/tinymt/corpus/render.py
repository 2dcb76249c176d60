"""Structure -> Chinese words, English words and their gold alignment.

Both languages are rendered from the same structure by the same function, one
constituent at a time. Each rendered word carries a tuple of *link ids*; a Chinese word
and an English word are aligned when they share an id. A constituent that means one
thing (a noun, a verb, 在…里 / "in") gets a fresh id for all its words on both sides, so
one-to-many links (李雷 -> "Li Lei") and reordering come for free: the English pieces are
simply put in a different order.

Alignment policy (every word on both sides ends up aligned):

* content words align with their translation; multi-word translations align as a block
  (李雷 <-> Li, Lei; 照顾 <-> take, care, of);
* 了 aligns with the English word that carries the past tense (the inflected verb, or
  "did"/"Did"); 正在 with am/is/are; 会 with "will"; 不/没 with "not" and do-support
  "do/does/did" in negations; 吗 with the fronted auxiliary of a yes/no question;
  in wh-questions a present-tense "do/does" aligns with the Chinese verb;
* numeral and measure word align with the English article/number (一只 <-> "a",
  那只 <-> "the"); a mass noun's measure word aligns with the container ("cup", "of");
* 的 aligns with what it marks: the possessive word ("my", "Lei's"), the relative
  pronoun ("that"/"who"), an adjective, or "to" in 去北京的机票 "a ticket to Beijing";
* English words with no Chinese source align with the Chinese word they depend on:
  an article the Chinese lacks ("the" park, "a" ticket to ...) with the head noun, the
  infinitive "to" with the verb it introduces, the copula "is" with the adjective;
* 在 … 里 align with the preposition; 很 with "very"; punctuation with punctuation,
  the comma of 因为…，所以… with "because".
"""

from __future__ import annotations

import itertools

from tinymt.corpus.lexicon import NUMERALS, Verb, verb
from tinymt.corpus.pair import Pair
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

_NUM_ZH = tuple(z for z, _ in NUMERALS)
_NUM_EN = tuple(e for _, e in NUMERALS)
_VOWELS = frozenset("aeiouAEIOU")


def article(next_word: str) -> str:
    """a / an before ``next_word`` (the lexicon has no 'university'/'hour' words)."""
    return "an" if next_word[0] in _VOWELS else "a"


def _regular_plural(sg: str, pl: str) -> bool:
    return pl in (sg + "s", sg + "es", sg[:-1] + "ies")


def _be(agreement: str, past: bool) -> str:
    if past:
        return "were" if agreement == "pl" else "was"
    return {"1sg": "am", "3sg": "is", "pl": "are"}[agreement]


class _Ctx:
    """Fresh link ids (``ctx.new()``) and the construction tags of one sentence."""

    __slots__ = ("new", "tags")

    def __init__(self) -> None:
        self.new = itertools.count(1).__next__
        self.tags: set[str] = set()


# --------------------------------------------------------------------------- noun phrases


def render_np(np: NP, case: str, ctx: _Ctx):
    """-> (zh tokens, en tokens); ``case`` is subj | obj | poss. Tokens: (word, ids)."""
    kind = np.kind
    tags = ctx.tags
    if kind == "pronoun":
        g = (ctx.new(),)
        p = np.head
        tags.add("pronoun")
        en = p.subj if case == "subj" else p.obj if case == "obj" else p.poss
        return [(p.zh, g)], [(en, g)]
    if kind == "name":
        g = (ctx.new(),)
        tags.add("name")
        words = np.head.en
        en = [(w, g) for w in words]
        if case == "poss":
            en[-1] = (words[-1] + "'s", g)
        return [(np.head.zh, g)], en
    if kind == "place":
        g = (ctx.new(),)
        return [(np.head.zh, g)], [(w, g) for w in np.head.obj]
    if kind == "wh":
        g = (ctx.new(),)
        return [(np.head, g)], [("who" if np.head == "谁" else "what", g)]
    return _render_noun(np, case, ctx)


def _possessor(np: NP, ctx: _Ctx):
    """Possessor NP rendered possessive; its last English word also gets a 的 link."""
    zh, en = render_np(np, "poss", ctx)
    d = ctx.new()
    w, ids = en[-1]
    en[-1] = (w, ids + (d,))
    return zh, en, d


def _render_noun(np: NP, case: str, ctx: _Ctx):
    n = np.head
    tags = ctx.tags
    g = (ctx.new(),)
    zh: list = []
    en: list = []
    if n.kin:  # 我妈妈 my mother / 李雷的妈妈 Li Lei's mother
        tags.add("kinship")
        tags.add("possessive")
        pzh, pen, d = _possessor(np.possessor, ctx)
        zh += pzh
        if np.possessor.kind != "pronoun":
            zh.append(("的", (d,)))
        zh.append((n.zh, g))
        en += pen
        en += [(w, g) for w in n.en]
        if case == "poss":
            en[-1] = (en[-1][0] + "'s", en[-1][1])
        return zh, en

    plural = np.plural
    words = n.plural if plural else n.en
    det = np.det
    # ---- Chinese, left to right: possessor / relative clause, det + MW, goal, adj, noun
    # ---- English: determiner, adjective, noun, goal, relative clause
    en_det: list = []
    if np.possessor is not None:
        tags.add("possessive")
        pzh, pen, d = _possessor(np.possessor, ctx)
        zh += pzh
        zh.append(("的", (d,)))
        en_det = pen
    rel_en: list = []
    if np.rel is not None:
        tags.add("relative_clause")
        r = (ctx.new(),)
        rzh, ren = _render_rel(np.rel, np, ctx)
        zh += rzh
        zh.append(("的", r))
        rel_en = [("who" if "person" in n.cats else "that", r)] + ren
        en_det = [("the", g)]
    adj = np.adj
    first = adj.en if adj is not None else words[0]
    if det == "bare":
        if np.goal is not None and np.possessor is None and np.rel is None:
            en_det = [(article(first), g)]
        elif plural:
            tags.add("generic_plural")
    else:
        d = (ctx.new(),)
        if det == "num":
            tags.add("numeral")
            zh.append((_NUM_ZH[np.count - 1], d))
            en_det = [(_NUM_EN[np.count - 1] if np.count > 1 else article(first), d)]
        elif det == "this":
            zh.append(("这", d))
            en_det = [("this", d)]
        elif det == "that":
            zh.append(("那", d))
            en_det = [("the", d)]
        elif det == "these":
            zh.append(("这些", d))
            en_det = [("these", d)]
        else:  # those
            zh.append(("那些", d))
            en_det = [("the", d)]
        if det in ("this", "that", "these", "those"):
            tags.add("demonstrative")
        if det not in ("these", "those"):
            tags.add("measure_word")
            if n.mass:
                tags.add("mass_measure")
                m = (ctx.new(),)
                zh.append((n.mw, m))
                c_sg, c_pl = n.container
                cont = c_pl if det == "num" and np.count > 1 else c_sg
                if det == "num" and np.count == 1:
                    en_det = [(article(cont), d)]
                en_det += [(cont, m), ("of", m)]
            else:
                zh.append((n.mw, d))
    goal_en: list = []
    if np.goal is not None:
        tags.add("relative_clause")
        tags.add("goal_modifier")
        gg = (ctx.new(),)
        x = (ctx.new(),)
        zh += [("去", gg), (np.goal.zh, x), ("的", gg)]
        goal_en = [("to", gg)] + [(w, x) for w in np.goal.goal]
    if adj is not None:
        tags.add("adjective")
        a = (ctx.new(),)
        zh.append((adj.zh, a))
        if adj.attr == "de":
            zh.append(("的", a))
        adj_en = [(adj.en, a)]
    else:
        adj_en = []
    zh.append((n.zh, g))
    if plural:
        tags.add("plural")
        if not _regular_plural(n.en[-1], n.plural[-1]):
            tags.add("irregular_plural")
    noun_en = [(w, g) for w in words]
    if case == "poss":
        noun_en[-1] = (noun_en[-1][0] + "'s", g)
    en = en_det + adj_en + noun_en + goal_en + rel_en
    return zh, en


def _render_rel(rel: RelClause, head: NP, ctx: _Ctx):
    """Relative clause body (without 的 / that): -> (zh, en)."""
    v = rel.verb
    vg = (ctx.new(),)
    if rel.gap == "object":  # 我昨天买的 -> (that) I bought yesterday
        szh, sen = render_np(rel.subj, "subj", ctx)
        zh = list(szh)
        ten = []
        if rel.time is not None:
            t = (ctx.new(),)
            zh.append((rel.time.zh, t))
            ten = [(w, t) for w in rel.time.en]
        zh.append((v.zh, vg))
        return zh, sen + [(w, vg) for w in v.past] + ten
    # subject gap: 喜欢猫的 -> (who) likes cats
    forms = v.base if head.plural else v.s3
    zh = [(v.zh, vg)]
    en = [(w, vg) for w in forms]
    if rel.obj is not None:
        ozh, oen = render_np(rel.obj, "obj", ctx)
        zh += ozh
        en += oen
    return zh, en


# --------------------------------------------------------------------------- verb phrases


def _render_simple(vp: VerbPhrase, ctx: _Ctx, le):
    """-> zh, head id, en tokens after the head verb, fronted wh tokens (or None)."""
    v = vp.verb
    h = (ctx.new(),)
    zh = [(v.zh, h)]
    if le is not None:
        zh.append(le)
    en: list = []
    wh = None
    frame = v.frame
    ctx.tags.add(frame)
    if frame == "ditrans":
        izh, ien = render_np(vp.iobj, "obj", ctx)
        ozh, oen = render_np(vp.obj, "obj", ctx)
        zh += izh + ozh
        en = ien + oen
    elif frame == "goal":
        x = (ctx.new(),)
        zh.append((vp.obj.head.zh, x))
        en = [("to", h)] + [(w, x) for w in vp.obj.head.goal]
    elif vp.obj is not None:
        ozh, oen = render_np(vp.obj, "obj", ctx)
        zh += ozh
        if vp.obj.kind == "wh":
            wh = oen
        else:
            en = oen
    return zh, h, en, wh


def _render_inner(vp, ctx: _Ctx, le):
    """Infinitive VP (bare form): -> zh, id of its first verb, en (base form)."""
    if isinstance(vp, Help):
        ctx.tags.add("help")
        b = (ctx.new(),)
        hzh, hen = render_np(vp.helpee, "obj", ctx)
        izh, _ih, ien = _render_inner(vp.inner, ctx, le)
        return [("帮", b)] + hzh + izh, b, [("help", b)] + hen + ien
    zh, h, en, _ = _render_simple(vp, ctx, le)
    return zh, h, [(w, h) for w in vp.verb.base] + en


def _render_vp(vp, ctx: _Ctx, le):
    """-> zh, head Verb, head id, en after the head verb, wh tokens."""
    if isinstance(vp, VerbPhrase):
        zh, h, en, wh = _render_simple(vp, ctx, le)
        return zh, vp.verb, h, en, wh
    tags = ctx.tags
    if isinstance(vp, Pivot):  # 请李雷帮我订机票 ask Li Lei to help me book a ticket
        tags.add("pivot")
        tags.add("serial_verb")
        h = (ctx.new(),)
        pzh, pen = render_np(vp.pivot, "obj", ctx)
        izh, ih, ien = _render_inner(vp.inner, ctx, le)
        to = [("to", ih)] if vp.verb.to else []
        return [(vp.verb.zh, h)] + pzh + izh, vp.verb, h, pen + to + ien, None
    if isinstance(vp, Want):  # 想去北京 want to go to Beijing
        tags.add("want")
        tags.add("serial_verb")
        h = (ctx.new(),)
        izh, ih, ien = _render_inner(vp.inner, ctx, le)
        return [("想", h)] + izh, _WANT, h, [("to", ih)] + ien, None
    if isinstance(vp, GoDo):  # 去图书馆看书 go to the library to read books
        tags.add("serial_verb")
        tags.add("go_do")
        h = (ctx.new(),)
        x = (ctx.new(),)
        izh, ih, ien = _render_inner(vp.inner, ctx, le)
        en = [("to", h)] + [(w, x) for w in vp.place.goal] + [("to", ih)] + ien
        return [("去", h), (vp.place.zh, x)] + izh, _GO, h, en, None
    raise TypeError(vp)


_WANT, _GO = verb("想"), verb("去")


# --------------------------------------------------------------------------- clauses


def render_clause(c: Clause, ctx: _Ctx):
    """-> (zh tokens, en tokens) without final punctuation."""
    tags = ctx.tags
    tense = c.tense
    neg = c.negated
    mood = c.mood
    tags.add(tense)
    if neg:
        tags.add("negation")
    if mood != "declarative":
        tags.add("question")
        tags.add("yn_question" if mood == "yn_question" else "wh_question")
    szh, sen = render_np(c.subj, "subj", ctx)
    agr = c.subj.agreement
    q = (ctx.new(),) if mood == "yn_question" else None

    # time and place (Chinese: before the verb; English: after the verb phrase)
    tzh = ten = pzh = pen = ()
    if c.time is not None:
        t = (ctx.new(),)
        tzh = [(c.time.zh, t)]
        ten = [(w, t) for w in c.time.en]
        tags.add("time")
        tags.add("time_place_reorder")
        if c.time_first:
            tags.add("time_fronted")
    wh_place = None
    if mood == "wh_place":
        w = (ctx.new(),)
        pzh = [("在", w), ("哪里", w)]
        wh_place = [("where", w)]
    elif c.place is not None:
        p = (ctx.new(),)
        x = (ctx.new(),)
        pl = c.place
        pzh = [("在", p), (pl.zh, x)]
        if pl.zh_suffix:
            pzh.append((pl.zh_suffix, p))
        pen = [(pl.loc_prep, p)] + [(w, x) for w in pl.loc]
        tags.add("place")
        tags.add("time_place_reorder")

    if isinstance(c.vp, Copula):
        pre, vzh, aux, main = _copula(c, agr, q, ctx)
        vrest = []
        wh = None
    else:
        pre, vzh, aux, main, vrest, wh = _verb_group(c, agr, q, ctx)

    # Chinese: [time] subj [time] markers [在 place] VP [吗]
    zh = []
    if c.time_first:
        zh += tzh
    zh += szh
    if not c.time_first:
        zh += tzh
    zh += pre
    zh += pzh
    zh += vzh
    if q is not None:
        zh.append(("吗", q))

    # English word order by mood
    tail = vrest + list(pen) + list(ten)
    if mood == "declarative" or mood == "wh_subject":
        en = sen + aux + main + tail
    elif mood == "yn_question":
        en = aux + sen + main + tail
    elif mood == "wh_object":
        en = wh + aux + sen + main + tail
    else:  # wh_place
        en = wh_place + aux + sen + main + tail
    return zh, en


def _copula(c: Clause, agr: str, q, ctx: _Ctx):
    """他很累 He is very tired: -> (pre-verb zh, zh, aux, main)."""
    ctx.tags.add("copula")
    adj = c.vp.adj
    a = (ctx.new(),)
    pre: list = []
    main: list = []
    if c.tense == "future":  # 会很累 will be very tired
        f = q or (ctx.new(),)
        pre.append(("会", f))
        aux = [("will", f)]
        be = [("be", a)]
    else:  # is / was (aligned with the adjective; with 吗 in questions)
        aux = [(_be(agr, c.tense == "past"), q or a)]
        be = []
    if c.negated:
        n = (ctx.new(),)
        pre.insert(0, ("不", n))
        main.append(("not", n))
    main += be
    vzh = []
    if not c.negated and q is None:
        v = (ctx.new(),)
        vzh.append(("很", v))
        main.append(("very", v))
    vzh.append((adj.zh, a))
    main.append((adj.en, a))
    return pre, vzh, aux, main


def _verb_group(c: Clause, agr: str, q, ctx: _Ctx):
    """-> (pre-verb zh markers, VP zh, aux (fronted in questions), main, rest, wh)."""
    tags = ctx.tags
    tense = c.tense
    neg = c.negated
    mood = c.mood
    pre: list = []
    le = None
    tg = None  # id of 了 / the past-tense carrier
    if tense == "past" and not neg:
        tg = q if q is not None else (ctx.new(),)
        le = ("了", tg)
    vzh, verb, h, rest, wh = _render_vp(c.vp, ctx, le)
    if verb.frame == "stative":
        tags.add("stative")
    aux: list = []
    if tense == "present":
        if neg or q is not None or mood in ("wh_object", "wh_place"):
            tags.add("do_support")
            do = "does" if agr == "3sg" else "do"
            if neg:
                n = (ctx.new(),)
                pre.append(("不", n))
                aux = [(do, n)]
                main = [("not", n)]
            else:
                aux = [(do, q if q is not None else h)]
                main = []
            main += [(w, h) for w in verb.base]
        else:
            forms = verb.s3 if agr == "3sg" else verb.base
            if agr == "3sg":
                tags.add("agreement_3sg")
            main = [(w, h) for w in forms]
    elif tense == "past":
        if neg or q is not None or mood in ("wh_object", "wh_place"):
            tags.add("do_support")
            if neg:
                n = (ctx.new(),)
                pre.append(("没", n))
                aux = [("did", n)]
                main = [("not", n)]
            else:
                aux = [("did", tg)]
                main = []
            main += [(w, h) for w in verb.base]
        else:
            past = verb.past
            if not past[0].endswith("ed"):
                tags.add("irregular_past")
            main = [(past[0], h + tg)] + [(w, h) for w in past[1:]]
    elif tense == "progressive":
        p = q if q is not None else (ctx.new(),)
        # 正在 + 在公园里 merge: 他正在公园里跑步 = 正 + 在公园里 + 跑步
        located = c.place is not None or mood == "wh_place"
        pre.append(("正" if located else "正在", p))
        aux = [(_be(agr, False), p)]
        main = [(w, h) for w in verb.ing]
    else:  # future
        f = q if q is not None else (ctx.new(),)
        main = []
        if neg:
            n = (ctx.new(),)
            pre.append(("不", n))
            main = [("not", n)]
        pre.append(("会", f))
        aux = [("will", f)]
        main += [(w, h) for w in verb.base]
    return pre, vzh, aux, main, rest, wh


# --------------------------------------------------------------------------- sentences


def render(s: Sentence) -> Pair:
    """Render a sentence structure to a :class:`Pair` (words, alignment, constructions)."""
    ctx = _Ctx()
    tags = ctx.tags
    p = (ctx.new(),)
    if isinstance(s, Clause):
        zh, en = render_clause(s, ctx)
        if s.question:
            zh.append(("？", p))
            en.append(("?", p))
        else:
            zh.append(("。", p))
            en.append((".", p))
    elif isinstance(s, Because):  # 因为 C1，所以 C2。 -> C2 because C1.
        tags.add("because")
        b = (ctx.new(),)
        zh1, en1 = render_clause(s.cause, ctx)
        zh2, en2 = render_clause(s.effect, ctx)
        zh = [("因为", b)] + zh1 + [("，", b), ("所以", b)] + zh2 + [("。", p)]
        en = en2 + [("because", b)] + en1 + [(".", p)]
    elif isinstance(s, But):  # C1，但是 C2。 -> C1, but C2.
        tags.add("but")
        b = (ctx.new(),)
        k = (ctx.new(),)
        zh1, en1 = render_clause(s.first, ctx)
        zh2, en2 = render_clause(s.second, ctx)
        zh = zh1 + [("，", k), ("但是", b)] + zh2 + [("。", p)]
        en = en1 + [(",", k), ("but", b)] + en2 + [(".", p)]
    elif isinstance(s, Report):  # 我觉得 C。 -> I think C.
        tags.add("report")
        szh, sen = render_np(s.subj, "subj", ctx)
        h = (ctx.new(),)
        agr = s.subj.agreement
        if agr == "3sg":
            tags.add("agreement_3sg")
        forms = s.verb.s3 if agr == "3sg" else s.verb.base
        czh, cen = render_clause(s.comp, ctx)
        zh = szh + [(s.verb.zh, h)] + czh + [("。", p)]
        en = sen + [(w, h) for w in forms] + cen + [(".", p)]
    else:
        raise TypeError(s)
    return _finish(zh, en, tags)


# (i, j) link tuples are shared between pairs: 200k pairs need no new tuples for them
# (sentences are at most ~40 words before the length filter; 128 leaves room)
_IJ = tuple(tuple((i, j) for j in range(128)) for i in range(128))


def _finish(zh, en, tags) -> Pair:
    # every Chinese token carries exactly one id; English tokens may carry several
    pos: dict[int, list[int]] = {}
    for i, (_, ids) in enumerate(zh):
        k = ids[0]
        if k in pos:
            pos[k].append(i)
        else:
            pos[k] = [i]
    ij = _IJ
    links = [ij[i][j] for j, t in enumerate(en) for k in t[1] if k in pos for i in pos[k]]
    links.sort()
    en_words = [w for w, _ in en]
    first = en_words[0]
    en_words[0] = first[0].upper() + first[1:]
    tags = frozenset(tags)
    tags = _TAGSETS.setdefault(tags, tags)  # a few thousand distinct sets, shared
    p = _new_pair(Pair)  # Pair(...) without the frozen dataclass' setattr checks
    _set(p, "zh_words", tuple([w for w, _ in zh]))
    _set(p, "en_words", tuple(en_words))
    _set(p, "alignment", tuple(links))
    _set(p, "constructions", tags)
    return p


_new_pair = object.__new__
_set = object.__setattr__
_TAGSETS: dict[frozenset, frozenset] = {}


def verb_forms(v: Verb) -> dict[str, tuple[str, ...]]:
    """The English forms of a verb by name (used by tests and docs)."""
    return {"base": v.base, "s3": v.s3, "past": v.past, "pp": v.pp, "ing": v.ing}
