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

Relations (``Pair.zh_relations`` / ``en_relations``, see :mod:`tinymt.corpus.relations`)
come from the same structure: where the renderer knows that one constituent depends on
another, it records ``ctx.rel(name, dependent key, head key)``. A key is a link id (or a
relation-only key from ``ctx.key()``, which never aligns), and on each side it stands for
the words that carry it. A function word that borrows a content word's link id for the
alignment ("to" in *go to Beijing*, 的 after an adjective, do-support "do") carries it as
:class:`_Borrowed`: it aligns as before but is not that constituent in a relation.
"""

from __future__ import annotations

import itertools

from tinymt.corpus.lexicon import NUMERALS, verb
from tinymt.corpus.pair import Pair
from tinymt.corpus.relations import RELATIONS
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
    Sentence,
    VerbPhrase,
    Want,
)

# NP.det -> (Chinese, English): 这只猫 this cat, 那只猫 the cat, 这些猫 these cats, 那些猫 the cats
_DEMONSTRATIVES = {"this": ("这", "this"), "that": ("那", "the"), "these": ("这些", "these"),
                   "those": ("那些", "the")}
_VOWELS = frozenset("aeiouAEIOU")


def article(next_word: str) -> str:
    """a / an before ``next_word`` (the lexicon has no 'university'/'hour' words)."""
    return "an" if next_word[0] in _VOWELS else "a"


def _be(agreement: str, past: bool) -> str:
    if past:
        return "were" if agreement == "pl" else "was"
    return {"1sg": "am", "3sg": "is", "pl": "are"}[agreement]


class _Borrowed(int):
    """A link id carried by a function word for the alignment only: it aligns like the
    id, but the word does not stand for that constituent in a relation."""

    __slots__ = ()


def _fn(ids: tuple) -> tuple:
    """``ids`` borrowed (see :class:`_Borrowed`)."""
    return tuple(_Borrowed(k) for k in ids)


_REL_INDEX = {name: i for i, name in enumerate(RELATIONS)}


class _Ctx:
    """Fresh link ids (``ctx.new()``), relation-only keys (``ctx.key()``, negative: they
    never align) and the relations of one sentence."""

    __slots__ = ("key", "new", "rels")

    def __init__(self) -> None:
        self.new = itertools.count(1).__next__
        self.key = itertools.count(-1, -1).__next__
        self.rels: list[tuple[int, int, int]] = []

    def rel(self, name: str, dep, head) -> None:
        """``dep`` depends on ``head`` by relation ``name``; each a key or ids tuple."""
        dep = dep[0] if isinstance(dep, tuple) else dep
        head = head[0] if isinstance(head, tuple) else head
        self.rels.append((_REL_INDEX[name], dep, head))


# --------------------------------------------------------------------------- noun phrases


def render_np(np: NP, case: str, ctx: _Ctx):
    """-> (zh tokens, en tokens, head id); ``case`` is subj | obj | poss. Tokens: (word,
    ids); the head id is the noun's (pronoun's, name's ...) link id."""
    kind = np.kind
    g = (ctx.new(),)
    if kind == "pronoun":
        p = np.head
        en = p.subj if case == "subj" else p.obj if case == "obj" else p.poss
        return [(p.zh, g)], [(en, g)], g
    if kind == "place":
        return [(np.head.zh, g)], [(w, g) for w in np.head.obj], g
    if kind == "wh":
        return [(np.head, g)], [("who" if np.head == "谁" else "what", g)], g
    if kind == "name":
        zh, en = [(np.head.zh, g)], [(w, g) for w in np.head.en]
    else:
        zh, en = _render_noun(np, g, ctx)
    if case == "poss":  # Li Lei's, my mother's, the teacher's
        w, ids = en[-1]
        en[-1] = (w + "'s", ids)
    return zh, en, g


def _possessor(np: NP, owned: tuple, ctx: _Ctx):
    """Possessor NP rendered possessive; its last English word also gets a 的 link."""
    zh, en, pg = render_np(np, "poss", ctx)
    ctx.rel("possessive", pg, owned)
    d = ctx.new()
    w, ids = en[-1]
    en[-1] = (w, ids + (d,))
    return zh, en, d


def _render_noun(np: NP, g: tuple, ctx: _Ctx):
    """A common noun's phrase: -> (zh tokens, en tokens)."""
    n = np.head
    zh: list = []
    if n.kin:  # 我妈妈 my mother / 李雷的妈妈 Li Lei's mother
        pzh, pen, d = _possessor(np.possessor, g, ctx)
        zh += pzh
        if np.possessor.kind != "pronoun":
            zh.append(("的", (d,)))
        zh.append((n.zh, g))
        return zh, pen + [(w, g) for w in n.en]

    plural = np.plural
    words = n.plural if plural else n.en
    det = np.det
    # ---- Chinese, left to right: possessor / relative clause, det + MW, goal, adj, noun
    # ---- English: determiner, adjective, noun, goal, relative clause
    en_det: list = []
    if np.possessor is not None:
        pzh, pen, d = _possessor(np.possessor, g, ctx)
        zh += pzh
        zh.append(("的", (d,)))
        en_det = pen
    rel_en: list = []
    if np.rel is not None:
        r = (ctx.new(),)
        rzh, ren, vg = _render_rel(np.rel, np, ctx)
        ctx.rel("relative", vg, g)
        zh += rzh
        zh.append(("的", r))
        rel_en = [("who" if "person" in n.cats else "that", r)] + ren
        en_det = [("the", _article_ids(g, ctx))]
    adj = np.adj
    first = adj.en if adj is not None else words[0]
    if det == "bare":
        if np.goal is not None and np.possessor is None and np.rel is None:
            en_det = [(article(first), _article_ids(g, ctx))]
    else:
        d = (ctx.new(),)
        ctx.rel("determiner", d, g)
        if det == "num":
            num_zh, num_en = NUMERALS[np.count - 1]
            zh.append((num_zh, d))
            # 我买的两本书 the two books that I bought: the relative clause's "the" stays
            en_det = (en_det if np.rel is not None else []) + [
                (num_en if np.count > 1 else article(first), d)]
        else:
            dem_zh, dem_en = _DEMONSTRATIVES[det]
            zh.append((dem_zh, d))
            en_det = [(dem_en, d)]
        if det not in ("these", "those"):
            if n.mass:
                m = (ctx.new(),)
                ctx.rel("determiner", m, g)
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
        gg = (ctx.new(),)
        x = (ctx.new(),)
        ctx.rel("relative", gg, g)
        zh += [("去", gg), (np.goal.zh, x), ("的", _fn(gg))]
        goal_en = [("to", gg)] + [(w, x) for w in np.goal.goal]
    adj_en = []
    for adj in (np.adj, np.adj2):
        if adj is not None:
            a = (ctx.new(),)
            ctx.rel("adjective", a, g)
            zh.append((adj.zh, a))
            if adj.attr == "de":
                zh.append(("的", _fn(a)))
            adj_en.append((adj.en, a))
    zh.append((n.zh, g))
    return zh, en_det + adj_en + [(w, g) for w in words] + goal_en + rel_en


def _article_ids(g: tuple, ctx: _Ctx) -> tuple:
    """Ids of an English article with no Chinese word: aligned with the noun (``g``,
    borrowed), and a determiner of it."""
    k = ctx.key()
    ctx.rel("determiner", k, g)
    return _fn(g) + (k,)


def _render_rel(rel: RelClause, head: NP, ctx: _Ctx):
    """Relative clause body (without 的 / that): -> (zh, en, its verb's id)."""
    v = rel.verb
    vg = (ctx.new(),)
    if rel.gap == "object":  # 我昨天买的 -> (that) I bought yesterday
        szh, sen, sg = render_np(rel.subj, "subj", ctx)
        ctx.rel("subject", sg, vg)
        zh = list(szh)
        ten = []
        if rel.time is not None:
            t = (ctx.new(),)
            ctx.rel("time", t, vg)
            zh.append((rel.time.zh, t))
            ten = [(w, t) for w in rel.time.en]
        zh.append((v.zh, vg))
        return zh, sen + [(w, vg) for w in v.past] + ten, vg
    # subject gap: 喜欢猫的 -> (who) likes cats
    forms = v.base if head.plural else v.s3
    zh = [(v.zh, vg)]
    en = [(w, vg) for w in forms]
    if rel.obj is not None:
        ozh, oen, og = render_np(rel.obj, "obj", ctx)
        ctx.rel("object", og, vg)
        zh += ozh
        en += oen
    return zh, en, vg


# --------------------------------------------------------------------------- verb phrases


def _render_simple(vp: VerbPhrase, ctx: _Ctx, le):
    """-> zh, head id, en tokens after the head verb, fronted wh tokens (or None)."""
    v = vp.verb
    h = (ctx.new(),)
    zh = [(v.zh, h)]
    if le is not None:
        ctx.rel("aux", le[1][-1], h)
        zh.append(le)
    en: list = []
    wh = None
    frame = v.frame
    if frame == "ditrans":
        izh, ien, ig = render_np(vp.iobj, "obj", ctx)
        ozh, oen, og = render_np(vp.obj, "obj", ctx)
        ctx.rel("object", ig, h)
        ctx.rel("object", og, h)
        zh += izh + ozh
        en = ien + oen
    elif frame == "goal":
        x = (ctx.new(),)
        ctx.rel("object", x, h)
        zh.append((vp.obj.head.zh, x))
        en = [("to", _fn(h))] + [(w, x) for w in vp.obj.head.goal]
    elif vp.obj is not None:
        ozh, oen, og = render_np(vp.obj, "obj", ctx)
        ctx.rel("object", og, h)
        zh += ozh
        if vp.obj.kind == "wh":
            wh = oen
        else:
            en = oen
    return zh, h, en, wh


def _render_inner(vp, ctx: _Ctx, le):
    """Infinitive VP (bare form): -> zh, id of its first verb, en (base form)."""
    if isinstance(vp, Help):
        b = (ctx.new(),)
        hzh, hen, hg = render_np(vp.helpee, "obj", ctx)
        ctx.rel("pivot", hg, b)
        izh, _ih, ien = _render_inner(vp.inner, ctx, le)
        return [("帮", b)] + hzh + izh, b, [("help", b)] + hen + ien
    zh, h, en, _ = _render_simple(vp, ctx, le)
    return zh, h, [(w, h) for w in vp.verb.base] + en


def _render_vp(vp, ctx: _Ctx, le):
    """-> zh, head Verb, head id, en after the head verb, wh tokens."""
    if isinstance(vp, VerbPhrase):
        zh, h, en, wh = _render_simple(vp, ctx, le)
        return zh, vp.verb, h, en, wh
    if isinstance(vp, Pivot):  # 请李雷帮我订机票 ask Li Lei to help me book a ticket
        h = (ctx.new(),)
        pzh, pen, pg = render_np(vp.pivot, "obj", ctx)
        ctx.rel("pivot", pg, h)
        izh, ih, ien = _render_inner(vp.inner, ctx, le)
        to = [("to", _fn(ih))] if vp.verb.to else []
        return [(vp.verb.zh, h)] + pzh + izh, vp.verb, h, pen + to + ien, None
    if isinstance(vp, Want):  # 想去北京 want to go to Beijing
        h = (ctx.new(),)
        izh, ih, ien = _render_inner(vp.inner, ctx, le)
        return [("想", h)] + izh, _WANT, h, [("to", _fn(ih))] + ien, None
    if isinstance(vp, GoDo):  # 去图书馆看书 go to the library to read books
        h = (ctx.new(),)
        x = (ctx.new(),)
        ctx.rel("object", x, h)
        izh, ih, ien = _render_inner(vp.inner, ctx, le)
        en = [("to", _fn(h))] + [(w, x) for w in vp.place.goal] + [("to", _fn(ih))] + ien
        return [("去", h), (vp.place.zh, x)] + izh, _GO, h, en, None
    raise TypeError(vp)


_WANT, _GO = verb("想"), verb("去")


# --------------------------------------------------------------------------- clauses


def render_clause(c: Clause, ctx: _Ctx):
    """-> (zh tokens, en tokens) without final punctuation."""
    neg = c.negated
    mood = c.mood
    szh, sen, sg = render_np(c.subj, "subj", ctx)
    agr = c.subj.agreement
    q = (ctx.new(),) if mood == "yn_question" else None
    qk = ctx.key() if q is not None else None  # 吗 and the fronted auxiliary

    # time and place (Chinese: before the verb; English: after the verb phrase)
    tzh = ten = pzh = pen = ()
    rels = []  # (relation, dependent) pairs whose head is the predicate, known below
    if c.time is not None:
        t = (ctx.new(),)
        rels.append(("time", t))
        tzh = [(c.time.zh, t)]
        ten = [(w, t) for w in c.time.en]
    wh_place = None
    if mood == "wh_place":
        w = (ctx.new(),)
        rels.append(("place", w))
        pzh = [("在", _fn(w)), ("哪里", w)]
        wh_place = [("where", w)]
    elif c.place is not None:
        p = (ctx.new(),)
        x = (ctx.new(),)
        pl = c.place
        rels.append(("place", x))
        pzh = [("在", p), (pl.zh, x)]
        if pl.zh_suffix:
            pzh.append((pl.zh_suffix, p))
        pen = [(pl.loc_prep, p)] + [(w, x) for w in pl.loc]
        if c.partner is not None:  # 和李雷 with Li Lei: after the place in Chinese only
            w = (ctx.new(),)
            wzh, wen, _ = render_np(c.partner, "obj", ctx)
            pzh += [("和", w)] + wzh
            pen = [("with", w)] + wen + pen

    if isinstance(c.vp, Copula):
        pre, vzh, aux, main, pred = _copula(c, agr, q, ctx)
        vrest = []
        wh = None
    else:
        pre, vzh, aux, main, vrest, wh, pred = _verb_group(c, agr, q, ctx)
    ctx.rel("subject", sg, pred)
    for name, dep in rels:
        ctx.rel(name, dep, pred)
    if qk is not None:  # 吗 and the fronted auxiliary: the question's marks
        ctx.rel("question", qk, pred)
        aux = [(aux[0][0], aux[0][1] + (qk,))] + aux[1:]
    post_zh: list = []
    if c.adverb is not None:  # 也不去 also does not go, 不经常去 does not often go
        v = (ctx.new(),)
        zadv, eadv = (c.adverb.zh, v), (c.adverb.en, v)
        if c.adverb.post:  # after 不 / 会 ("not"); past the place unless negated
            if neg:
                pre, main = pre + [zadv], main[:1] + [eadv] + main[1:]
            elif c.partner is not None:  # 经常在公园里和他… often … with him in the park
                pre, main = pre + [zadv], [eadv] + main
            else:
                post_zh, main = [zadv], [eadv] + main
        else:
            pre = [zadv] + pre
            if neg and mood == "declarative":
                aux = [eadv] + aux
            else:
                main = [eadv] + main

    # Chinese: [time] subj [time] markers [在 place] VP [吗]
    zh = [*tzh, *szh] if c.time_first else [*szh, *tzh]
    zh += [*pre, *pzh, *post_zh, *vzh]
    if q is not None:
        zh.append(("吗", q + (qk,)))

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
    """他很累 He is very tired: -> (pre-verb zh, zh, aux, main, the adjective's id)."""
    adj = c.vp.adj
    a = (ctx.new(),)
    pre: list = []
    main: list = []
    if c.tense == "future":  # 会很累 will be very tired
        f = q or (ctx.new(),)
        ak = ctx.key()
        ctx.rel("aux", ak, a)
        pre.append(("会", f + (ak,)))
        aux = [("will", f + (ak,))]
        be = [("be", _fn(a))]
    else:  # is / was (aligned with the adjective; with 吗 in questions)
        aux = [(_be(agr, c.tense == "past"), q or _fn(a))]
        be = []
    if c.negated:
        n = (ctx.new(),)
        ctx.rel("negation", n, a)
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
    return pre, vzh, aux, main, a


def _verb_group(c: Clause, agr: str, q, ctx: _Ctx):
    """-> (pre-verb zh markers, VP zh, aux (fronted in questions), main, rest, wh, the
    head verb's id)."""
    tense = c.tense
    neg = c.negated
    mood = c.mood
    pre: list = []
    le = None
    tg = None  # id of 了 / the past-tense carrier
    if tense == "past" and not neg:
        tg = q if q is not None else (ctx.new(),)
        le = ("了", tg + (ctx.key(),))  # its relation goes to the verb it follows
    vzh, verb, h, rest, wh = _render_vp(c.vp, ctx, le)
    ak = ctx.key()  # English auxiliaries and the Chinese markers before the verb
    ctx.rel("aux", ak, h)
    aux: list = []
    main: list = []
    if neg:  # 不 / 没 -> "not" (a progressive clause is never negated)
        n = (ctx.new(),)
        ctx.rel("negation", n, h)
        pre.append(("没" if tense == "past" else "不", n))
        main = [("not", n)]
    if tense in ("present", "past") and (neg or q is not None
                                         or mood in ("wh_object", "wh_place")):
        do = "did" if tense == "past" else "does" if agr == "3sg" else "do"
        # aligned with 不 / 没, with 了 (past), with 吗, or with the verb (wh-questions)
        aux = [(do, (_fn(n) if neg else tg or q or _fn(h)) + (ak,))]
        main += [(w, h) for w in verb.base]
    elif tense == "present":
        forms = verb.s3 if agr == "3sg" else verb.base
        main = [(w, h) for w in forms]
    elif tense == "past":
        past = verb.past
        main = [(past[0], h + tg)] + [(w, h) for w in past[1:]]
    elif tense == "progressive":
        p = (q if q is not None else (ctx.new(),)) + (ak,)
        # 正在 + 在公园里 merge: 他正在公园里跑步 = 正 + 在公园里 + 跑步
        located = c.place is not None or mood == "wh_place"
        pre.append(("正" if located else "正在", p))
        aux = [(_be(agr, False), p)]
        main = [(w, h) for w in verb.ing]
    else:  # future
        f = (q if q is not None else (ctx.new(),)) + (ak,)
        pre.append(("会", f))
        aux = [("will", f)]
        main += [(w, h) for w in verb.base]
    return pre, vzh, aux, main, rest, wh, h


# --------------------------------------------------------------------------- sentences


def render(s: Sentence) -> Pair:
    """Render a sentence structure to a :class:`Pair` (words, alignment, relations)."""
    ctx = _Ctx()
    p = (ctx.new(),)
    if isinstance(s, Clause):
        zh, en = render_clause(s, ctx)
        question = s.mood != "declarative"
        zh.append(("？" if question else "。", p))
        en.append(("?" if question else ".", p))
    elif isinstance(s, Because):  # 因为 C1，所以 C2。 -> C2 because C1.
        b = (ctx.new(),)
        zh1, en1 = render_clause(s.cause, ctx)
        zh2, en2 = render_clause(s.effect, ctx)
        zh = [("因为", b)] + zh1 + [("，", b), ("所以", b)] + zh2 + [("。", p)]
        en = en2 + [("because", b)] + en1 + [(".", p)]
    elif isinstance(s, But):  # C1，但是 C2。 -> C1, but C2.
        b = (ctx.new(),)
        k = (ctx.new(),)
        zh1, en1 = render_clause(s.first, ctx)
        zh2, en2 = render_clause(s.second, ctx)
        zh = zh1 + [("，", k), ("但是", b)] + zh2 + [("。", p)]
        en = en1 + [(",", k), ("but", b)] + en2 + [(".", p)]
    else:  # Report: 我觉得 C。 -> I think C.
        szh, sen, sg = render_np(s.subj, "subj", ctx)
        h = (ctx.new(),)
        ctx.rel("subject", sg, h)
        agr = s.subj.agreement
        forms = s.verb.s3 if agr == "3sg" else s.verb.base
        czh, cen = render_clause(s.comp, ctx)
        zh = szh + [(s.verb.zh, h)] + czh + [("。", p)]
        en = sen + [(w, h) for w in forms] + cen + [(".", p)]
    return _finish(zh, en, ctx.rels)


def render_phrase(s: NP | VerbPhrase) -> Pair:
    """A phrase alone (三只猫 three cats, 看书 read books): no punctuation, lower case."""
    ctx = _Ctx()
    zh, en = render_np(s, "subj", ctx)[:2] if isinstance(s, NP) else _render_inner(s, ctx, None)[::2]
    return _finish(zh, en, ctx.rels, capital=False)


# (i, j) link tuples are shared between pairs: 200k pairs need no new tuples for them
# (sentences are at most ~40 words before the length filter; 128 leaves room)
_IJ = tuple(tuple((i, j) for j in range(128)) for i in range(128))


def _finish(zh, en, rels, capital: bool = True) -> Pair:
    # every Chinese token carries one link id (ids[0]; relation keys may follow), English
    # tokens may carry several
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
    if capital:
        en_words[0] = en_words[0][0].upper() + en_words[0][1:]
    return Pair(tuple([w for w, _ in zh]), tuple(en_words), tuple(links),
                _relations(zh, rels), _relations(en, rels))


def _relations(tokens, rels) -> tuple[tuple[int, int, int], ...]:
    """``(relation, dependent word, head word)`` triples of one side: every word carrying
    the dependent's key, with every word carrying the head's key and not the dependent's
    (borrowed ids do not count)."""
    where: dict[int, list[int]] = {}
    for i, (_, ids) in enumerate(tokens):
        for k in ids:
            if k.__class__ is int:  # not _Borrowed
                if k in where:
                    where[k].append(i)
                else:
                    where[k] = [i]
    out = []
    intern = _TRIPLES.setdefault
    for r, dep, head in rels:
        deps = where.get(dep)
        heads = where.get(head) if deps else None
        if heads:
            for i in deps:
                for j in heads:  # (no word is both ends of one relation)
                    t = (r, i, j)
                    out.append(intern(t, t))  # 200k pairs share a few 10k triples
    if len(out) > 1:
        out = sorted(set(out))
    return tuple(out)


_TRIPLES: dict[tuple[int, int, int], tuple[int, int, int]] = {}

