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

import torch
from torch import Tensor

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


def start(model: Transformer, src: Tensor, rows: list[int]) -> DecoderCache:
    """Encode ``src`` ``(B, S)``; a decoder cache for its sentences ``rows``."""
    src_mask = model.padding_mask(src)  # (B, 1, 1, S)
    memory, _ = model.encode(src, src_mask)  # (B, S, d)
    index = torch.tensor(rows, device=src.device)
    return DecoderCache(model, memory.index_select(0, index), src_mask.index_select(0, index))


def next_logits(model: Transformer, cache: DecoderCache, prefix: Tensor) -> Tensor:
    """Float logits ``(R, V)`` of the next token of each row of ``prefix`` ``(R, t)`` (BOS
    first), whose first ``t - 1`` tokens ``cache`` holds: only the last one is fed."""
    logits = decode_step(model, prefix[:, -1:], cache)  # (R, V)
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
    row per unfinished sentence."""
    with eval_mode(model, inference=True):
        max_lens = max_lengths(model, src, max_len_a, max_len_b)  # tokens each may produce
        results: list[list[int]] = [[] for _ in max_lens]
        alive = [b for b, m in enumerate(max_lens) if m > 0]  # the sentence of each row
        if not alive:
            return results
        cache = start(model, src, alive)
        row_max = torch.tensor([max_lens[b] for b in alive], device=src.device)  # (N,)
        prefix = torch.full((len(alive), 1), BOS_ID, dtype=torch.long, device=src.device)

        step = 0
        while alive:
            step += 1
            logits = next_logits(model, cache, prefix)  # (N, V)
            logits[:, [model.pad_id, BOS_ID]] = float("-inf")  # never generated
            next_tok = logits.argmax(dim=-1)  # (N,) the most likely token
            prefix = torch.cat([prefix, next_tok[:, None]], dim=1)  # (N, step + 1)
            hit_eos = next_tok.eq(EOS_ID)
            done = hit_eos | row_max.le(step)  # (N,)
            if not done.any():
                continue
            done_rows = done.nonzero().flatten().tolist()
            tokens = prefix[done_rows, 1:].tolist()
            for r, toks, ended in zip(done_rows, tokens, hit_eos[done_rows].tolist()):
                results[alive[r]] = toks[:-1] if ended else toks
            keep, alive, (prefix, row_max) = drop_done(done, alive, prefix, row_max)
            if alive:
                cache.reorder(keep)
        return results


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
        cache, device = start(model, src, searched), src.device
        V, banned = model.tgt_vocab_size, [model.pad_id, BOS_ID]
        c = min(r.width * k, V)  # a hypothesis can only contribute its own c best tokens
        not_eos = torch.arange(V, device=device).ne(EOS_ID)  # (V,)
        rank = torch.arange(k, device=device)  # (k,)

        # Slots are (sentence, beam) pairs, N x k of them; a slot is live when its summed
        # log-probability is finite. The decoder state and ``tokens`` hold one row per
        # live slot, in slot order (sentence-major). At the start only beam 0 is live.
        sent_ids, N = searched, len(searched)  # original sentence of each live sentence
        last = torch.tensor([max_lens[b] + r.forces_eos for b in searched],
                            device=device)  # (N,) each sentence's last step: + 1, a forced EOS
        n_done = torch.zeros(N, dtype=torch.long, device=device)  # (N,) finished hyps
        top_done = torch.zeros(N, dtype=torch.bool, device=device)  # a best candidate did
        sums = torch.full((N, k), float("-inf"), device=device)  # (N, k) summed log p
        sums[:, 0] = 0.0
        tokens = torch.full((N, 1), BOS_ID, dtype=torch.long, device=device)  # (R, t)
        cache.set_beams(None, torch.arange(N, device=device) * k, k)

        step = 0
        while sent_ids:
            step += 1
            N = len(sent_ids)
            live_slots = sums.isfinite().view(-1).nonzero().flatten()  # (R,) slot ids n*k+j
            at_last = last.eq(step)  # (N,)
            logits = next_logits(model, cache, tokens)  # (R, V)
            kept = logits[:, banned]  # (R, 2) the banned tokens' logits
            logits[:, banned] = float("-inf")  # never generated
            choosable = logits  # (R, V)
            if r.forces_eos and at_last.any():  # hypotheses of max_len tokens may only end
                forced = at_last[live_slots // k][:, None] & not_eos  # (R, V)
                choosable = logits.masked_fill(forced, float("-inf"))
            row_top, row_tok = choosable.topk(c, dim=1)  # (R, c) each hypothesis' best tokens
            if r.banned_in_normaliser:
                logits[:, banned] = kept
            lse = logsumexp_(logits)  # (R, 1): log p = logits - lse

            # 1. every sentence's width * k best candidates over its live hypotheses x tokens
            cand = row_top.new_full((N * k, c), float("-inf"))  # dead slots stay -inf
            cand[live_slots] = sums.view(-1)[live_slots][:, None].to(cand.dtype) + (row_top - lse)
            cand_tok = row_tok.new_zeros(N * k, c)
            cand_tok[live_slots] = row_tok
            top_scores, idx = cand.view(N, k * c).topk(r.width * k, dim=1)  # sorted
            top_slot = torch.arange(N, device=device)[:, None] * k + idx // c  # (N, width*k)
            top_tok = cand_tok.view(N, k * c).gather(1, idx)  # (N, width*k)
            row_of = torch.full((N * k,), -1, dtype=torch.long, device=device)
            row_of[live_slots] = torch.arange(live_slots.numel(), device=device)  # slot -> row

            # 2. of the first k candidates (shrink: as many as finished ones left room for)
            # those ending in EOS finish, and at the last step all of them (shrink: EOS only)
            taken = top_scores[:, :k].isfinite()  # (N, k)
            if not r.replaces:
                taken &= rank < (k - n_done)[:, None]
            fin = taken & (top_tok[:, :k].eq(EOS_ID) | at_last[:, None])  # (N, k)
            if fin.any():
                n_idx, j_idx = fin.nonzero(as_tuple=True)
                hyps = tokens[row_of[top_slot[n_idx, j_idx]], 1:].tolist()
                for n, toks, t, s in zip(n_idx.tolist(), hyps, top_tok[n_idx, j_idx].tolist(),
                                         top_scores[n_idx, j_idx].tolist()):
                    # each holds `step` tokens, EOS included
                    finished[sent_ids[n]].append((toks + [t] * (t != EOS_ID),
                                                  s / step**len_penalty))
                n_done += fin.sum(dim=1)
                top_done |= fin[:, 0]

            # 3. the hypotheses that go on; sentences done leave
            if r.replaces:
                scores, slot, tok = replace_finished(fin, top_scores, top_slot, top_tok)
            else:
                scores, slot, tok = top_scores.masked_fill(~taken | fin, float("-inf")), \
                    top_slot, top_tok
            alive = scores.isfinite()  # (N, k)
            stop_early = r.stops_early and len_penalty == 0
            enough = top_done & n_done.ge(nbest) if stop_early else n_done.ge(k)
            done = at_last | enough | ~alive.any(dim=1)  # (N,)
            keep, sent_ids, (last, n_done, top_done, alive, scores, slot, tok) = drop_done(
                done, sent_ids, last, n_done, top_done, alive, scores, slot, tok)
            if sent_ids:
                tokens, sums = advance_beams(cache, tokens, row_of, slot, tok, scores, alive,
                                             keep)

        return [sorted(hyps, key=lambda h: -h[1])[:nbest] for hyps in finished]


def replace_finished(fin: Tensor, scores: Tensor, slots: Tensor, toks: Tensor
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """The full rule's ``k`` candidates that go on, from the ``2k`` best (``scores``,
    ``slots``, ``toks``, each ``(N, 2k)``) and ``fin`` ``(N, k)``, the first ``k`` that
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
            slots.gather(1, chosen), toks.gather(1, chosen))


def drop_done(done: Tensor, sent_ids: list[int], *per_sentence: Tensor
              ) -> tuple[Tensor | None, list[int], tuple[Tensor, ...]]:
    """Sentences marked ``done`` ``(N,)`` leave the search: returns ``keep`` (the indices of
    the others, None when none is done), their ``sent_ids`` and each ``per_sentence``
    tensor (first dimension ``N``) cut to them."""
    if not done.any():
        return None, sent_ids, per_sentence
    keep = (~done).nonzero().flatten()  # (N',)
    return keep, [sent_ids[n] for n in keep.tolist()], tuple(x[keep] for x in per_sentence)


def advance_beams(cache: DecoderCache, tokens: Tensor, row_of: Tensor, slot: Tensor,
                  tok: Tensor, scores: Tensor, alive: Tensor, keep: Tensor | None
                  ) -> tuple[Tensor, Tensor]:
    """The hand-over: the hypotheses that go on (``alive`` ``(N', k)``, each the one of old
    slot ``slot`` extended by ``tok``, summing ``scores``) become the decoder rows, in slot
    order; ``row_of`` maps old slots to old rows, ``keep`` the sentences still searching
    (None: all). Returns the new ``tokens`` ``(R', t + 1)`` and ``sums`` ``(N', k)``
    (``-inf`` where no hypothesis lives)."""
    rows = row_of[slot[alive]]  # (R',) old rows of the new live slots
    tokens = torch.cat([tokens.index_select(0, rows), tok[alive][:, None]], 1)
    slots = alive.view(-1).nonzero().flatten()  # (R',) in row order
    cache.set_beams(rows, slots, alive.size(1), sentences=keep)
    return tokens, scores.masked_fill(~alive, float("-inf"))
