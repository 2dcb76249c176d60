"""Greedy and beam search (both rules): the cached greedy search against the core's plain
loop, consistency between variants, exactness against enumeration, and each beam rule
against a plain one-sentence loop of it (the ``full`` rule's: CTranslate2's)."""

import itertools
import math
import sys

import pytest
import torch

from tinymt.config import ModelConfig
from tinymt.decoding import beam_search, greedy_decode, greedy_search, translate_ids
from tinymt.decoding.cache import KVCache
from tinymt.errors import TinyMTError
from tinymt.model import Transformer

DT = torch.float64
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def tiny_model(seed, vocab=23, sharpen=4.0, **kw):
    """A random float64 model whose output distributions are peaked (non-trivial search)."""
    torch.manual_seed(seed)
    sizes = {"d_model": 16, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 2}
    cfg = ModelConfig(
        **{"d_ff": 32, "dropout": 0.0, "max_positions": 64, "tie_embeddings": False, **sizes, **kw}
    )
    model = Transformer(cfg, vocab, vocab, shared_vocab=True).to(DT).eval()
    with torch.no_grad():
        model.output_proj.weight.mul_(sharpen)
    return model


def sources(lengths, vocab=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    x = torch.randint(4, vocab, (len(lengths), T), generator=g)
    return x.masked_fill(torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None], PAD)


def teacher_forced_logprob(model, src_row, hyps):
    """sum(log p) of each hypothesis + EOS, by one full forward pass (no cache, no search)."""
    T = max(len(h) for h in hyps) + 1
    tgt_in = torch.full((len(hyps), T), PAD)
    tgt_out = torch.full((len(hyps), T), PAD)
    for i, h in enumerate(hyps):
        tgt_in[i, : len(h) + 1] = torch.tensor([BOS] + list(h))
        tgt_out[i, : len(h) + 1] = torch.tensor(list(h) + [EOS])
    src = src_row[None].expand(len(hyps), -1)
    with torch.no_grad():
        hidden, _ = model(src, tgt_in)
        logits = model.logits(hidden)
    logp = logits.log_softmax(-1).gather(-1, tgt_out[..., None])[..., 0]  # (N, T)
    return logp.masked_fill(tgt_out.eq(PAD), 0.0).sum(-1).tolist()


def exhaustive(model, src_row, max_len, len_penalty, allowed):
    """Score of every output of up to max_len tokens (+EOS): {tokens: score}."""
    hyps = [h for m in range(max_len + 1) for h in itertools.product(allowed, repeat=m)]
    sums = teacher_forced_logprob(model, src_row, hyps)
    return {h: s / (len(h) + 1) ** len_penalty for h, s in zip(hyps, sums)}


# --------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("len_penalty", [0.0, 0.6, 1.0])
def test_beam_search_finds_exhaustive_optimum(seed, len_penalty):
    V, L = 6, 4  # pad unk bos eos + two words; at most 4 tokens before EOS
    model = tiny_model(seed, vocab=V, sharpen=3.0)
    src = sources([5, 3], vocab=V, seed=seed)
    non_eos = [UNK, 4, 5]  # pad and bos are never generated
    # every step has at most 4 * 3**(L-1) = 108 finite candidates; a beam above that keeps
    # them all, so the search is exhaustive
    big = beam_search(
        model, src, beam=4**L, len_penalty=len_penalty, max_len_a=0, max_len_b=L, nbest=5
    )
    small = beam_search(model, src, beam=2, len_penalty=len_penalty, max_len_a=0, max_len_b=L)
    for b in range(src.size(0)):
        table = exhaustive(model, src[b], L, len_penalty, non_eos)
        ranked = sorted(table.items(), key=lambda kv: -kv[1])
        # the exact search returns the true top 5, in order, with the true scores
        got_scores = [s for _, s in big[b]]
        assert got_scores == pytest.approx([s for _, s in ranked[:5]], abs=1e-9)
        for toks, s in big[b]:
            assert table[tuple(toks)] == pytest.approx(s, abs=1e-9)
        if ranked[0][1] - ranked[1][1] > 1e-9:  # unique optimum: same tokens
            assert tuple(big[b][0][0]) == ranked[0][0]
        # a narrow beam never beats the optimum, and reports its hypothesis' true score
        (toks, score), = small[b]
        assert score <= ranked[0][1] + 1e-12
        assert table[tuple(toks)] == pytest.approx(score, abs=1e-9)


def test_beam_scores_match_teacher_forcing_on_larger_vocab():
    model = tiny_model(11)
    src = sources([6, 2, 4], seed=11)
    out = beam_search(model, src, beam=4, nbest=3, len_penalty=0.7, max_len_a=1.0, max_len_b=3)
    for b, hyps in enumerate(out):
        assert 1 <= len(hyps) <= 3
        assert [s for _, s in hyps] == sorted((s for _, s in hyps), reverse=True)
        sums = teacher_forced_logprob(model, src[b], [h for h, _ in hyps])
        for (toks, score), s in zip(hyps, sums):
            assert EOS not in toks and BOS not in toks and PAD not in toks
            assert len(toks) <= int(1.0 * int((src[b] != PAD).sum()) + 3)
            assert score == pytest.approx(s / (len(toks) + 1) ** 0.7, abs=1e-9)


# --------------------------------------------------------------------------- consistency
def test_beam_one_equals_greedy():
    lengths = [7, 3, 5, 1]
    stopped_early = reached_max = 0
    for seed in range(6):  # random models differ a lot: some stop at once, some never
        model = tiny_model(seed, vocab=8)
        src = sources(lengths, vocab=8, seed=seed)
        greedy = greedy_decode(model, src, max_len_a=1.5, max_len_b=3)
        beam1 = beam_search(model, src, beam=1, max_len_a=1.5, max_len_b=3)
        assert [hyps[0][0] for hyps in beam1] == greedy
        for g, n in zip(greedy, lengths):
            stopped_early += len(g) < int(1.5 * n + 3)
            reached_max += len(g) == int(1.5 * n + 3)
    assert stopped_early and reached_max  # both ways of ending were exercised


@pytest.mark.parametrize("options", [{}, {"norm_first": False},
                                     {"positional": "learned", "activation": "gelu"}])
def test_cached_greedy_search_equals_the_cores_plain_loop(options):
    """greedy_search (KV cache, finished sentences leave the batch) and greedy_decode (the
    whole prefix every step, every sentence to the end): the same tokens, on random models
    and batches of different lengths, under caps that stop some sentences and not others,
    leave some no room at all, or reach max_positions."""
    ended = {"eos": 0, "cap": 0, "empty": 0}
    for seed in range(4):
        model = tiny_model(seed, vocab=[8, 23, 40, 12][seed], sharpen=1.0 + seed, **options)
        with torch.no_grad():  # scrambled: fresh tiny models repeat one token
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.mul_(1 + torch.randn(p.shape, generator=g, dtype=p.dtype))
        lengths = [[7, 3, 5, 1], [9, 2], [4], [6, 6, 1, 8, 3]][seed]
        src = sources(lengths, vocab=model.tgt_vocab_size, seed=seed)
        for a, b in [(1.5, 3), (0.0, 2), (-1.0, 7), (2.0, 60)]:  # the last: max_positions
            plain = greedy_decode(model, src, max_len_a=a, max_len_b=b)
            assert greedy_search(model, src, max_len_a=a, max_len_b=b) == plain, (seed, a, b)
            for out, n in zip(plain, lengths):
                cap = max(0, min(int(a * n + b), 63))
                assert len(out) <= cap
                ended["empty" if cap == 0 else "cap" if len(out) == cap else "eos"] += 1
    assert all(ended.values()), ended  # every way of ending was exercised


def test_batched_equals_one_by_one():
    model = tiny_model(5)
    lengths = [7, 2, 5, 3]
    src = sources(lengths, seed=5)
    kw = {"max_len_a": 1.0, "max_len_b": 3}
    greedy = greedy_search(model, src, **kw)
    beams = beam_search(model, src, beam=3, nbest=2, **kw)
    # ids as Python ints, for sentencepiece and JSON (a float 5.0 would compare equal)
    full = beam_search(model, src, beam=3, nbest=2, rule="full", **kw)  # ends at the cap
    ids = [*greedy, *(t for hyps in beams + full for t, _ in hyps)]
    assert {type(i) for out in ids for i in out} == {int}
    for b, n in enumerate(lengths):
        alone = src[b : b + 1, :n]
        assert greedy_search(model, alone, **kw) == [greedy[b]]
        (hyps,) = beam_search(model, alone, beam=3, nbest=2, **kw)
        assert [t for t, _ in hyps] == [t for t, _ in beams[b]]
        assert [s for _, s in hyps] == pytest.approx([s for _, s in beams[b]], abs=1e-9)


# --------------------------------------------------------------------------- edges
def unigram_model(logits, **kw):
    """A model whose next-token distribution is softmax(logits) whatever the context."""
    model = tiny_model(7, vocab=len(logits), **kw)
    with torch.no_grad():
        model.decoder_norm.weight.zero_()  # final pre-LN norm outputs its bias: e_0
        model.decoder_norm.bias.zero_()
        model.decoder_norm.bias[0] = 1.0
        model.output_proj.weight.zero_()
        model.output_proj.weight[:, 0] = torch.tensor(logits, dtype=DT)
    return model


def test_lengths_are_capped_by_max_positions():
    # EOS is the least likely token and the words tie: every search runs until a length
    # limit stops it. int(1.5 * n + 50) is far above the cap, so the cap binds: the decoder
    # holds BOS + the tokens before EOS in max_positions=6 positions, i.e. exactly 5 tokens
    model = unigram_model([0.0, 0.0, 0.0, -5.0, 0.0, 0.0, 0.0, 0.0], max_positions=6)
    src = sources([5, 2], vocab=8, seed=6)
    for greedy in (greedy_decode, greedy_search):
        assert [len(out) for out in greedy(model, src, max_len_b=50)] == [5, 5]
    for hyps in beam_search(model, src, beam=3, nbest=3, max_len_b=50):
        assert [len(toks) for toks, _ in hyps] == [5, 5, 5]


def test_max_length_formula_and_forced_eos():
    # word 4 is the most likely token, EOS the least: every search runs to its maximum
    # length, int(0.5 * src_len + 1) tokens, and beam search then forces EOS
    logits = [0.0, -1.0, 9.0, -3.0, 0.5, -0.5, 0.2]  # pad unk bos eos 4 5 6
    logp = torch.tensor(logits, dtype=DT).log_softmax(0)
    model = unigram_model(logits)
    src = sources([4, 1, 7], vocab=7, seed=7)
    assert greedy_decode(model, src, max_len_a=0.5, max_len_b=1) == [[4] * 3, [4] * 1, [4] * 4]
    for alpha in (0.0, 1.0):
        out = beam_search(model, src, beam=3, nbest=2, max_len_a=0.5, max_len_b=1,
                          len_penalty=alpha)
        for hyps, L in zip(out, [3, 1, 4]):
            assert hyps[0][0] == [4] * L
            expected = (L * logp[4] + logp[EOS]).item() / (L + 1) ** alpha
            assert hyps[0][1] == pytest.approx(expected, abs=1e-9)
            assert len(hyps[1][0]) == L and hyps[1][1] < hyps[0][1]
    # when EOS is the most likely token, both searches stop at once
    model = unigram_model([0.0, -1.0, 9.0, 2.0, 0.5, -0.5, 0.2])
    assert greedy_decode(model, src) == [[], [], []]
    assert [h[0][0] for h in beam_search(model, src, beam=4)] == [[], [], []]


def test_mode_restored_and_all_padding_sentence():
    model = tiny_model(8).train()
    src = sources([4, 3], seed=8)
    src[1] = PAD  # an empty source sentence must not produce NaN
    g = greedy_decode(model, src)
    assert model.training and greedy_search(model, src) == g and model.training
    bm = beam_search(model, src, beam=3)
    assert model.training
    assert len(g) == 2 and len(bm) == 2
    assert all(math.isfinite(h[0][1]) for h in bm)


def test_nbest_larger_than_beam_is_an_error():
    model = tiny_model(9)
    with pytest.raises(TinyMTError, match="nbest"):
        beam_search(model, sources([3]), beam=2, nbest=3)


# --------------------------------------------------------------------------- the shrink rule
@torch.no_grad()
def shrink_rule_reference(model, src_row, beam, nbest, len_penalty, cap):
    """Our beam search (docs/architecture.md, "Decoding") for one sentence, plain loops,
    every prefix re-run through the whole model: each step the best (hypothesis, token)
    candidates by summed log p (pad and bos never chosen but in the normaliser; past the
    cap only EOS), as many as there is room; those ending in EOS finish and keep their
    slot, so the room shrinks; the others stay alive. Done with no room or nothing alive."""
    alive, finished, room = [([], 0.0)], [], beam
    for step in range(1, cap + 2):
        cands = []
        for toks, s in alive:
            hidden, _ = model(src_row[None], torch.tensor([[BOS] + toks]))
            logp = model.logits(hidden[0, -1]).log_softmax(-1)
            cands += [(toks + [t], s + logp[t].item()) for t in range(len(logp))
                      if t not in (PAD, BOS) and (step <= cap or t == EOS)]
        cands = sorted(cands, key=lambda c: -c[1])[:room]
        ended = [(t[:-1], s / len(t) ** len_penalty) for t, s in cands if t[-1] == EOS]
        finished, room = finished + ended, room - len(ended)
        alive = [(t, s) for t, s in cands if t[-1] != EOS]
        if room <= 0 or not alive:
            break
    return sorted(finished, key=lambda h: -h[1])[:nbest]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("len_penalty", [0.0, 1.0])
def test_shrink_rule_equals_the_plain_loop(seed, len_penalty):
    """Batched, on the KV cache, against :func:`shrink_rule_reference`: the n-best lists
    and scores, on sentences that end early and sentences that reach the cap."""
    model = tiny_model(seed, vocab=12, sharpen=2.0)
    lengths = [5, 2, 4, 1]
    src = sources(lengths, vocab=12, seed=seed)
    kw = {"beam": 4, "nbest": 4, "len_penalty": len_penalty, "max_len_a": 1.0, "max_len_b": 2}
    out = beam_search(model, src, **kw)
    for b, n in enumerate(lengths):
        want = shrink_rule_reference(model, src[b, :n], 4, 4, len_penalty, n + 2)
        assert [t for t, _ in out[b]] == [t for t, _ in want]
        assert [s for _, s in out[b]] == pytest.approx([s for _, s in want], abs=1e-9)


# --------------------------------------------------------------------------- the full rule
@torch.no_grad()
def full_rule_reference(model, src_row, beam, nbest, len_penalty, cap):
    """CTranslate2's beam search as documented (its decoding.cc), one sentence, plain loops,
    every prefix re-run through the whole model: each step the 2*beam best (hypothesis,
    token) candidates by summed log p, normalised without pad and bos; of the first beam,
    those ending in EOS -- all of them at the cap -- finish and are replaced, in order, by
    the next candidates not ending in EOS; done at the cap, with beam finished, or, when
    len_penalty is 0, once the best candidate of a step finished and nbest have."""
    alive = [([], 0.0)]  # (tokens, summed log p)
    finished, top_finished = [], False
    for step in range(1, cap + 1):
        cands = []
        for toks, s in alive:
            hidden, _ = model(src_row[None], torch.tensor([[BOS] + toks]))
            logits = model.logits(hidden[0, -1])
            logits[[PAD, BOS]] = float("-inf")
            logp = logits.log_softmax(-1)
            cands += [(toks + [t], s + logp[t].item()) for t in range(len(logp))
                      if math.isfinite(logp[t].item())]
        cands = sorted(cands, key=lambda c: -c[1])[: 2 * beam]
        spares = [c for c in cands[beam:] if c[0][-1] != EOS]
        alive = []
        for j, (toks, s) in enumerate(cands[:beam]):
            if toks[-1] == EOS or step == cap:
                finished.append((toks[:-1] if toks[-1] == EOS else toks, s / step**len_penalty))
                top_finished |= j == 0
                alive += spares[:1]
                spares = spares[1:]
            else:
                alive.append((toks, s))
        if len_penalty == 0 and top_finished and len(finished) >= nbest:
            break
        if len_penalty != 0 and len(finished) >= beam:
            break
    return sorted(finished, key=lambda h: -h[1])[:nbest]


# seed 7: with len_penalty 0 the best candidate finishes a step before nbest hypotheses
# have, and the stop must remember it (a flag set anew each step searched on)
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("len_penalty", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("beam,nbest", [(4, 3), (3, 3)])
def test_full_rule_equals_the_plain_loop(seed, len_penalty, beam, nbest):
    """Batched, on the KV cache, against :func:`full_rule_reference`, n-best lists and
    scores, on sentences that end early and sentences that reach the cap."""
    model = tiny_model(seed, vocab=12, sharpen=2.0)
    lengths = [5, 2, 4, 1]
    src = sources(lengths, vocab=12, seed=seed)
    kw = {"beam": beam, "nbest": nbest, "len_penalty": len_penalty, "max_len_a": 1.0,
          "max_len_b": 2, "rule": "full"}
    out = beam_search(model, src, **kw)
    for b, n in enumerate(lengths):
        want = full_rule_reference(model, src[b, :n], beam, nbest, len_penalty, n + 2)
        assert [t for t, _ in out[b]] == [t for t, _ in want]
        assert [s for _, s in out[b]] == pytest.approx([s for _, s in want], abs=1e-9)


def test_full_rule_at_the_cap_and_against_shrink():
    """EOS least likely: the full rule ends every hypothesis at the cap without an EOS (its
    score: L log p'(4) / L ** alpha, p' normalised without pad and bos), where shrink forces
    a scored EOS after L tokens."""
    logits = [0.0, -1.0, 9.0, -3.0, 0.5, -0.5, 0.2]  # pad unk bos eos 4 5 6
    allowed = torch.tensor(logits, dtype=DT)
    allowed[[PAD, BOS]] = float("-inf")
    logp_full = allowed.log_softmax(0)
    logp_all = torch.tensor(logits, dtype=DT).log_softmax(0)
    model = unigram_model(logits)
    src = sources([4, 1, 7], vocab=7, seed=7)
    kw = {"beam": 3, "nbest": 2, "max_len_a": 0.5, "max_len_b": 1}
    for alpha in (0.0, 1.0):
        full = beam_search(model, src, len_penalty=alpha, rule="full", **kw)
        shrink = beam_search(model, src, len_penalty=alpha, **kw)
        for f, s, L in zip(full, shrink, [3, 1, 4]):
            assert f[0][0] == [4] * L == s[0][0]
            assert f[0][1] == pytest.approx((L * logp_full[4]).item() / L**alpha, abs=1e-9)
            assert s[0][1] == pytest.approx(
                (L * logp_all[4] + logp_all[EOS]).item() / (L + 1) ** alpha, abs=1e-9)


def test_full_rule_beam_one_is_greedy_and_translate_ids_picks_the_rule():
    model = tiny_model(4, vocab=8)
    src = sources([7, 3, 5, 1], vocab=8, seed=4)
    greedy = greedy_decode(model, src, max_len_a=1.5, max_len_b=3)
    assert [h[0][0] for h in beam_search(model, src, beam=1, max_len_b=3, rule="full")] == greedy
    ids = [row[row != PAD].tolist() for row in src]
    ids = [i[:-1] if i and i[-1] == EOS else i for i in ids]
    for rule in ("shrink", "full"):
        got = translate_ids(model, ids, beam=3, nbest=3, beam_rule=rule)
        want = [beam_search(model, torch.tensor([i + [EOS]]), beam=3, nbest=3, rule=rule)[0]
                for i in ids]
        assert [[t for t, _ in h] for h in got] == [[t for t, _ in h] for h in want]


# --------------------------------------------------------------------------- the KV cache
def causal_attention(mha, x):
    """Masked self-attention over the whole of ``x`` (B, T, d): the reference."""
    T = x.size(1)
    return mha(x, mask=torch.ones(T, T, dtype=torch.bool).tril())[0]


def test_kv_cache_grows_past_its_buffer_with_reorders():
    """One position at a time through CachedSelfAttention (steps 2-4 the core's), for many
    steps (the buffer is reallocated twice), with beam-search-like reorders in between:
    always the same as masked self-attention over the whole prefix."""
    from tinymt.attention import MultiHeadAttention
    from tinymt.decoding.cache import CachedSelfAttention

    torch.manual_seed(9)
    mha = MultiHeadAttention(96, 3).to(DT).eval()  # d_head 32: more than the first buffer
    B, T = 2, 3 * KVCache.MIN_ROOM + 5
    x = torch.randn(B, T, 96, dtype=DT)
    cached = CachedSelfAttention(mha)
    rows = torch.arange(B)  # which sentence of x each cache row holds
    grown = set()
    for t in range(T):
        out, w = cached(x[rows, t : t + 1], need_weights=t % 2 == 0)
        full = causal_attention(mha, x[rows, : t + 1])
        torch.testing.assert_close(out[:, 0], full[:, t], atol=1e-12, rtol=0)
        assert cached.kv.length == t + 1 and (w is None or w.shape == (len(rows), 3, 1, t + 1))
        grown.add(cached.kv.k.size(2))
        if t % 5 == 4:  # duplicate, drop and permute rows
            index = torch.tensor([1, 0, 0]) if len(rows) == 2 else torch.tensor([2, 1])
            cached.kv.reorder(index)
            rows = rows[index]
    assert len(grown) >= 3  # started small and was reallocated at least twice


# --------------------------------------------------------------------------- translate_ids
def greedy_by_hand(model, ids, max_len):
    """Greedy search written plainly: the whole prefix through the model every step, the
    most likely token that is neither pad nor bos, until EOS or max_len tokens."""
    src = torch.tensor([list(ids) + [EOS]])
    out = []
    with torch.no_grad():
        while len(out) < max_len:
            hidden, _ = model(src, torch.tensor([[BOS] + out]))
            logits = model.logits(hidden)[0, -1]
            logits[[PAD, BOS]] = float("-inf")
            tok = int(logits.argmax())
            if tok == EOS:
                break
            out.append(tok)
    return out


def test_translate_ids_defaults_are_greedy_with_the_documented_length_cap(capsys):
    model = tiny_model(5)
    with torch.no_grad():
        model.output_proj.weight[EOS] = 0.0  # EOS scores 0, below the best of 22 others
    ids = [[5, 6, 7], [], [8]]
    got = translate_ids(model, ids)  # beam 1, max_len_a 1.5, max_len_b 10
    for i, hyps in zip(ids, got):
        cap = int(1.5 * (len(i) + 1) + 10)  # src_len counts the EOS collate appends
        assert len(hyps) == 1 and math.isnan(hyps[0][1])
        assert hyps[0][0] == greedy_by_hand(model, i, cap)
        assert len(hyps[0][0]) == cap  # EOS never wins: every sentence runs to its cap
    assert capsys.readouterr().err == ""  # no progress bar unless asked
    again = translate_ids(model, ids, progress=True)
    assert [h[0][0] for h in again] == [h[0][0] for h in got]
    bar = capsys.readouterr().err
    assert bar.startswith("\rtranslate: ") and "?batch/s]" in bar  # tqdm's first frame
    short = translate_ids(model, ids, max_len_a=0.5, max_len_b=2)  # caps 4, 2, 3
    assert [h[0][0] for h in short] == [greedy_by_hand(model, i, int(0.5 * (len(i) + 1) + 2))
                                        for i in ids]


def test_translate_ids_beam_passes_its_options_to_the_search():
    """len_penalty, the length cap and nbest reach the beam search: with a beam wider than
    every candidate it returns the exhaustive top nbest, in input order."""
    V = 6
    model = tiny_model(2, vocab=V, sharpen=3.0)
    with torch.no_grad():
        model.output_proj.weight[EOS] = 0.0  # rarely likely: the best outputs are the longest
    ids = [[4, 5, 4], [5, 5, 4]]  # 4 source tokens with EOS: cap int(0.5 * 4 + 1) = 3
    got = translate_ids(model, ids, beam=64, nbest=3, len_penalty=0.6, max_len_a=0.5,
                        max_len_b=1, batch_tokens=8)
    assert [len(h) for h in translate_ids(model, ids, beam=3)] == [1, 1]  # nbest 1 by default
    for i, hyps in zip(ids, got):
        table = exhaustive(model, torch.tensor(i + [EOS]), 3, 0.6, [UNK, 4, 5])
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:3]
        assert [tuple(t) for t, _ in hyps] == [t for t, _ in ranked]
        assert [s for _, s in hyps] == pytest.approx([s for _, s in ranked], abs=1e-9)


@pytest.mark.parametrize("greedy", [greedy_decode, greedy_search])
def test_greedy_batch_equals_greedy_by_hand_as_sentences_leave(greedy):
    """A negative max_len_a gives the shorter (padded) sources the longer caps, so they go
    on alone after the unpadded one has left the batch: still their own greedy outputs."""
    model = tiny_model(7)
    with torch.no_grad():
        model.output_proj.weight[EOS] = 0.0  # every sentence runs to its cap
    ids = [[4, 5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(i + [EOS]) for i in ids],
                                          batch_first=True, padding_value=PAD)
    got = greedy(model, src, max_len_a=-1.0, max_len_b=12)
    for i, out in zip(ids, got):
        assert out == greedy_by_hand(model, i, 12 - (len(i) + 1))  # caps 4, 9, 7


def test_greedy_defaults_are_the_documented_length_cap():
    model = tiny_model(8)
    with torch.no_grad():
        model.output_proj.weight[EOS] = 0.0
    got = greedy_decode(model, torch.tensor([[4, 5, EOS]]))  # 1.5 * 3 + 10: 14 tokens
    assert got == [greedy_by_hand(model, [4, 5], 14)] and len(got[0]) == 14


def test_a_sentence_with_no_room_gets_no_tokens():
    model = tiny_model(9)
    with torch.no_grad():
        model.output_proj.weight[EOS] = 0.0
    src = sources([4, 1], seed=9)  # caps int(-1 * 4 + 4) = 0 and int(-1 * 1 + 4) = 3
    for greedy in (greedy_decode, greedy_search):
        got = greedy(model, src, max_len_a=-1.0, max_len_b=4)
        assert got[0] == [] and len(got[1]) == 3
        assert greedy(model, src, max_len_a=0.0, max_len_b=0) == [[], []]
    # CTranslate2's rule: no room is no hypothesis, nan its score; the other one searched
    (none,), (full,) = beam_search(model, src, beam=3, max_len_a=-1.0, max_len_b=4, rule="full")
    assert none[0] == [] and math.isnan(none[1]) and len(full[0]) == 3


# --------------------------------------------------------------------------- waits
def test_the_host_waits_for_the_device_once_a_token_step(monkeypatch, host_reads):
    """On a GPU the host waits for the device at every read of a tensor (conftest's
    ``host_reads``), at every op whose output's shape depends on the values (nonzero,
    a boolean-mask index) and at every copy of host data made outside
    :func:`tinymt.batching.to_device` (a list as an index, ``torch.tensor(...)``). Greedy
    and beam search (both rules), sentences leaving at different steps: one read a token
    step (its tokens; what finished and what goes on), one a batch (the length caps), no
    other wait."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import tinymt.decoding.search as search

    aten, steps, waits = torch.ops.aten, [], []
    real = search.next_logits
    monkeypatch.setattr(search, "next_logits", lambda *args: steps.append(1) or real(*args))

    class Waits(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            indices = args[1] if func.overloadpacket in (aten.index, aten.index_put_) else []
            if (func.overloadpacket in (aten.nonzero, aten.masked_select, aten.is_nonzero)
                    or any(i is not None and i.dtype == torch.bool for i in indices)
                    or func is aten.lift_fresh.default
                    and not any("to_device" in name for name in callers())):
                waits.append(func)
            return func(*args, **(kwargs or {}))

    def callers():  # the names of the functions on the stack, innermost first
        frame = sys._getframe()
        while frame:
            yield frame.f_code.co_name
            frame = frame.f_back

    model, src = tiny_model(3), sources([5, 1, 8, 3, 6])
    for rule in (None, "shrink", "full"):
        host_reads.clear(), steps.clear()
        with Waits():
            if rule:
                beam_search(model, src, beam=3, nbest=2, rule=rule, max_len_b=4)
            else:
                greedy_search(model, src, max_len_b=4)
        reads = [read.split(" in ")[0] for read in host_reads]  # where: mutmut renames it
        assert reads == ["tolist"] + ["numpy"] * len(steps), host_reads
        assert len(steps) > 5 and not waits, (rule, waits)
