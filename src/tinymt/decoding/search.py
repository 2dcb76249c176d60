"""The searches :func:`tinymt.decoding.translate_ids` runs: greedy search (the core's
:func:`~tinymt.decoding.greedy.greedy_decode`, fast) and beam search by either rule of
:data:`RULES`, both on the KV cache (:mod:`tinymt.decoding.cache`: one new token per
sentence or hypothesis per step).

Sentences that finish leave the batch (their rows are dropped from the decoder state), so
a batch costs as much as its longest translation, not ``batch x longest``; by the
``shrink`` rule finished hypotheses leave too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tinymt.batching import to_device
from tinymt.decoding.cache import DecoderCache, decode_step
from tinymt.decoding.greedy import max_lengths
from tinymt.errors import TinyMTError
from tinymt.model import Transformer
from tinymt.runtime import eval_mode
from tinymt.tokenizer import BOS_ID, EOS_ID

Hyps = list[list[tuple[list[int], float]]]  # per sentence, (tokens, score) best first


@dataclass(frozen=True)
class BeamRule:
    """What the two beam rules do differently (docs/architecture.md, "Decoding")."""

    width: int  # each step a sentence ranks its best ``width * beam`` candidates
    # finished hypotheses are replaced, in order, by the next of those candidates not
    # ending in EOS (the beam stays full); else they keep their slots (the beam shrinks)
    replaces: bool
    # at the length cap EOS is forced one step later; else at the cap the first ``beam``
    # candidates all finish, and a sentence with no room for a token gets [([], nan)]
    forces_eos: bool
    banned_in_normaliser: bool  # log p normalised over pad and bos too (as in training)
    stops_early: bool  # len_penalty 0: done once some step's best candidate has finished


RULES = {  # beam_rule -> the rule
    "shrink": BeamRule(width=1, replaces=False, forces_eos=True, banned_in_normaliser=True,
                       stops_early=False),  # ours, as Nematus and Marian
    "full": BeamRule(width=2, replaces=True, forces_eos=False, banned_in_normaliser=False,
                     stops_early=True),  # CTranslate2's BeamSearch: translate.py engine=ct2
}


def check_beam(beam: int, nbest: int) -> None:
    """The beam options every search (and the ct2 engine) takes, or one error line."""
    if beam < 1 or not 1 <= nbest <= beam:
        raise TinyMTError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam}, nbest={nbest}")


def start(model: Transformer, src: Tensor, rows: np.ndarray) -> DecoderCache:
    """Encode ``src`` ``(B, S)``; a decoder cache for its sentences ``rows``."""
    src_mask = model.padding_mask(src)  # (B, 1, 1, S)
    memory, _ = model.encode(src, src_mask)  # (B, S, d)
    index = to_device(rows, src.device)
    return DecoderCache(model, memory.index_select(0, index), src_mask.index_select(0, index))


def next_logits(model: Transformer, cache: DecoderCache, last: Tensor) -> Tensor:
    """Float logits ``(R, V)`` of the next token of each row, fed its last token ``last``
    ``(R, 1)`` (``cache`` holds the ones before)."""
    logits = decode_step(model, last, cache)  # (R, V)
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def logsumexp_(x: Tensor) -> Tensor:
    """``x.logsumexp(-1, keepdim=True)``, overwriting ``x`` (no (N, V) temporaries: on CPU
    allocating those costs more than the arithmetic)."""
    top = x.amax(dim=-1, keepdim=True)  # (N, 1)
    return x.sub_(top).exp_().sum(dim=-1, keepdim=True).log_().add_(top)


# ----------------------------------------------------------------------------- greedy
def greedy_search(model: Transformer, src: Tensor, max_len_a: float = 1.5,
                  max_len_b: int = 10) -> list[list[int]]:
    """:func:`~tinymt.decoding.greedy.greedy_decode`'s tokens, on the KV cache, with one
    row per unfinished sentence; the host reads the device once a step (the new tokens)."""
    with eval_mode(model, inference=True):
        device = src.device
        limit = np.array(max_lengths(model, src, max_len_a, max_len_b))  # tokens each may produce
        out = np.zeros((limit.size, limit.max(initial=0)), dtype=np.int64)  # (B, longest)
        n_out = np.zeros(limit.size, dtype=np.int64)  # tokens each produced (EOS not counted)
        sent = np.flatnonzero(limit > 0)  # the sentence of each row
        if not sent.size:
            return [[] for _ in limit]
        cache = start(model, src, sent)
        banned = to_device(np.array([model.pad_id, BOS_ID]), device)  # never generated
        tok = torch.full((sent.size, 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)

        step = 0
        while sent.size:
            step += 1
            logits = next_logits(model, cache, tok).index_fill_(1, banned, float("-inf"))
            tok = logits.argmax(dim=-1, keepdim=True)  # (N, 1) the most likely token
            toks = tok.view(-1).numpy(force=True)  # (N,) the step's one read of the device
            out[sent, step - 1] = toks
            ended = toks == EOS_ID
            done = ended | (limit[sent] <= step)  # (N,)
            n_out[sent[done]] = step - ended[done]
            if done.any() and (sent := sent[~done]).size:
                index = to_device(np.flatnonzero(~done), device)
                cache.reorder(index)
                tok = tok[index]
        return [row[:n].tolist() for row, n in zip(out, n_out)]


# ----------------------------------------------------------------------------- beam
# long: one search loop (expand, rank, finish, hand the beams over, reorder the caches)
# whose steps share a dozen tensors; split into helpers they would pass all of them around
def beam_search(model: Transformer, src: Tensor, beam: int = 5, len_penalty: float = 1.0,
                max_len_a: float = 1.5, max_len_b: int = 10, nbest: int = 1,
                rule: str = "shrink") -> Hyps:
    """Batched beam search (the beams of all sentences are the rows of one tensor) by
    ``RULES[rule]``; ``beam=1`` is exactly greedy search. Per sentence in input order, up
    to ``nbest`` ``(tokens, score)`` best first, ``score = sum(log p) / n ** len_penalty``
    (``n`` counts EOS)."""
    check_beam(beam, nbest)
    r, k = RULES[rule], beam
    with eval_mode(model, inference=True):
        max_lens = max_lengths(model, src, max_len_a, max_len_b)
        finished: Hyps = [[] if m > 0 or r.forces_eos else [([], float("nan"))]
                          for m in max_lens]  # full rule, no room for a token: as the ct2 engine
        searched = [b for b, hyps in enumerate(finished) if not hyps]
        if not searched:
            return finished
        cache, device = start(model, src, np.array(searched)), src.device
        V, banned = model.tgt_vocab_size, to_device(np.array([model.pad_id, BOS_ID]), device)
        c = min(r.width * k, V)  # a hypothesis can only contribute its own c best tokens
        not_eos = torch.arange(V, device=device).ne(EOS_ID)  # (V,)
        rank = torch.arange(k, device=device)  # (k,)

        # Slots are (sentence, beam) pairs, N x k of them; a slot is live when its summed
        # log-probability is finite. The decoder state holds one row per live slot, in slot
        # order (sentence-major); ``live`` names each row's slot. At the start only beam 0
        # is live. The host reads the device once a step: what finished, what goes on, from
        # which row, with which token; it keeps those two (``history``) to trace the tokens
        # of a hypothesis back when it finishes.
        sent_ids, N = searched, len(searched)  # original sentence of each live sentence
        ends = np.array([max_lens[b] + r.forces_eos for b in searched])  # + 1: a forced EOS
        last = to_device(ends, device)  # (N,) each sentence's last step
        n_done = torch.zeros(N, dtype=torch.long, device=device)  # (N,) finished hyps
        top_done = torch.zeros(N, dtype=torch.bool, device=device)  # a best candidate did
        sums = torch.zeros((N, k), device=device)  # (N, k) summed log p (of live slots only)
        live = torch.arange(N, device=device) * k  # (R,) slot n*k+j of each row
        tok = torch.full((N, 1), BOS_ID, dtype=torch.long, device=device)  # (R, 1) last tokens
        history: list[tuple[np.ndarray, np.ndarray]] = []  # per step: parent rows, tokens
        cache.set_beams(None, live, k)

        step = 0
        while sent_ids:
            step += 1
            N, R = len(sent_ids), live.numel()
            at_last = last.eq(step)  # (N,)
            logits = next_logits(model, cache, tok)  # (R, V)
            kept = logits.index_select(1, banned)  # (R, 2) the banned tokens' logits
            logits.index_fill_(1, banned, float("-inf"))  # never generated
            choosable = logits  # (R, V)
            if r.forces_eos and step in ends:  # hypotheses of max_len tokens may only end
                forced = at_last[live // k][:, None] & not_eos  # (R, V)
                choosable = logits.masked_fill(forced, float("-inf"))
            row_top, row_tok = choosable.topk(c, dim=1)  # (R, c) each hypothesis' best tokens
            if r.banned_in_normaliser:
                logits.index_copy_(1, banned, kept)
            lse = logsumexp_(logits)  # (R, 1): log p = logits - lse

            # 1. every sentence's width * k best candidates over its live hypotheses x tokens
            cand = row_top.new_full((N * k, c), float("-inf"))  # dead slots stay -inf
            cand[live] = sums.view(-1)[live][:, None].to(cand.dtype) + (row_top - lse)
            cand_tok = row_tok.new_zeros(N * k, c)
            cand_tok[live] = row_tok
            top_scores, idx = cand.view(N, k * c).topk(r.width * k, dim=1)  # sorted
            row_of = torch.full((N * k,), -1, dtype=torch.long, device=device)
            row_of[live] = torch.arange(R, device=device)  # slot -> row
            top_row = row_of[torch.arange(N, device=device)[:, None] * k + idx // c]  # (N, width*k)
            top_tok = cand_tok.view(N, k * c).gather(1, idx)  # (N, width*k)

            # 2. of the first k candidates (shrink: as many as finished ones left room for)
            # those ending in EOS finish, and at the last step all of them (shrink: EOS only)
            taken = top_scores[:, :k].isfinite()  # (N, k)
            if not r.replaces:
                taken &= rank < (k - n_done)[:, None]
            fin = taken & (top_tok[:, :k].eq(EOS_ID) | at_last[:, None])  # (N, k)
            n_done += fin.sum(dim=1)
            top_done |= fin[:, 0]

            # 3. the hypotheses that go on; sentences done leave
            if r.replaces:
                scores, from_row, new_tok = replace_finished(fin, top_scores, top_row, top_tok)
            else:
                scores, from_row, new_tok = top_scores.masked_fill(~taken | fin, float("-inf")), \
                    top_row, top_tok
            alive = scores.isfinite()  # (N, k)
            stop_early = r.stops_early and len_penalty == 0
            enough = top_done & n_done.ge(nbest) if stop_early else n_done.ge(k)
            done = at_last | enough | ~alive.any(dim=1)  # (N,)
            grid = torch.cat([fin, top_tok[:, :k], top_row[:, :k], top_scores[:, :k], alive,
                              from_row, new_tok, done[:, None]], dim=1)  # (N, 7k + 1)
            grid = grid.numpy(force=True)  # the step's one read (floats: ids < 2**24, exact)
            fin_h, tok_h, row_h, score_h, alive_h, from_row_h, new_tok_h = \
                np.split(grid[:, :-1], 7, axis=1)  # (N, k) each
            fin_h = fin_h > 0
            for n, toks, t, s in zip(np.nonzero(fin_h)[0], trace(history, row_h[fin_h]),
                                     tok_h[fin_h].astype(np.int64).tolist(),
                                     score_h[fin_h].tolist()):
                # each holds `step` tokens, EOS included
                finished[sent_ids[n]].append((toks + [t] * (t != EOS_ID), s / step**len_penalty))
            stay = np.flatnonzero(grid[:, -1] == 0)  # (N',) the sentences still searching
            sent_ids = [sent_ids[n] for n in stay]
            if sent_ids:  # the hand-over: the hypotheses that go on become the rows
                go = np.flatnonzero(alive_h[stay] > 0)  # (R',) their slots, in row order
                parents = from_row_h[stay].ravel()[go].astype(np.int64)  # (R',) old rows
                history.append((parents, new_tok_h[stay].ravel()[go].astype(np.int64)))
                up = to_device(np.concatenate([go, parents, history[-1][1], stay]), device)
                R = go.size
                live, rows, tok = up[:R], up[R : 2 * R], up[2 * R : 3 * R, None]
                keep = up[3 * R :] if stay.size < N else None
                if keep is not None:
                    last, n_done, top_done, scores = (
                        x[keep] for x in (last, n_done, top_done, scores))
                cache.set_beams(rows, live, k, sentences=keep)
                sums = scores  # read at the live slots only

        return [sorted(hyps, key=lambda h: -h[1])[:nbest] for hyps in finished]


def trace(history: list[tuple[np.ndarray, np.ndarray]], rows: np.ndarray) -> list[list[int]]:
    """The tokens (BOS left out) of the rows ``rows`` of the last step of ``history`` (per
    step, each row's parent row in the step before, and its token)."""
    rows, columns = rows.astype(np.int64), []
    for parents, tokens in reversed(history if rows.size else []):  # none: no walk back
        columns.append(tokens[rows])
        rows = parents[rows]
    return np.stack(columns[::-1], axis=1).tolist() if columns else [[] for _ in rows]


def replace_finished(fin: Tensor, scores: Tensor, rows: Tensor, toks: Tensor
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """The full rule's ``k`` candidates that go on, from the ``2k`` best (``scores``,
    ``rows``, ``toks``, each ``(N, 2k)``) and ``fin`` ``(N, k)``, the first ``k`` that
    finished: each slot keeps its own candidate, or, for the ``m``-th finished one, takes the
    ``m``-th of the candidates ``k .. 2k-1`` not ending in EOS; one with none left is dead
    (``-inf``)."""
    k = fin.size(1)
    spare_ok = toks[:, k:].ne(EOS_ID)  # (N, k)
    spares = torch.sort((~spare_ok).to(torch.int8), dim=1, stable=True).indices  # ok first
    rank = (fin.cumsum(dim=1) - 1).clamp(min=0)  # (N, k) m of the m-th finished slot
    own = torch.arange(k, device=fin.device).expand_as(fin)
    chosen = torch.where(fin, k + spares.gather(1, rank), own)  # (N, k) index into the 2k
    found = ~fin | rank.lt(spare_ok.sum(dim=1, keepdim=True))
    return (scores.gather(1, chosen).masked_fill(~found, float("-inf")),
            rows.gather(1, chosen), toks.gather(1, chosen))
