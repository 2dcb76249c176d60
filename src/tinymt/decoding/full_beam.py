"""Beam search, CTranslate2's rule (``decode.beam_rule=full``): the beam stays full.

The search ``translate.py engine=ct2`` runs, here on our decoder, so that an export can be
checked token for token against the model it came from (tests/test_export.py). Each step
ranks a sentence's ``2 * beam`` best candidates; of the first ``beam``, those ending in EOS
finish and are replaced by the next ones not ending in EOS; at the cap all of them finish
(no forced EOS); ``log p`` is normalised without ``pad`` and ``bos``. docs/architecture.md
("Decoding") sets it beside ours (:func:`tinymt.decoding.beam_search`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinymt.decoding.stepper import (
    Stepper,
    advance_beams,
    check_beam,
    drop_done,
    encode,
    inference,
    logsumexp_,
    max_lengths,
)
from tinymt.model import Transformer
from tinymt.tokenizer import BOS_ID, EOS_ID


def _best_candidates(sums: Tensor, live_slots: Tensor, row_logp: Tensor, row_tok: Tensor
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Each sentence's ``2k`` best (hypothesis, token) candidates by summed log p, best
    first: ``(scores, slot ids n*k+j, tokens)``, each ``(N, 2k)``. ``sums`` ``(N, k)``;
    ``row_logp``/``row_tok`` ``(R, c)``: each live slot's ``c`` best tokens."""
    N, k = sums.shape
    c = row_logp.size(1)
    cand = row_logp.new_full((N * k, c), float("-inf"))
    cand[live_slots] = sums.view(-1)[live_slots][:, None].to(row_logp.dtype) + row_logp
    cand_tok = row_tok.new_zeros(N * k, c)
    cand_tok[live_slots] = row_tok
    scores, idx = cand.view(N, k * c).topk(2 * k, dim=1)  # (N, 2k), sorted
    slots = torch.arange(N, device=sums.device)[:, None] * k + idx // c  # (N, 2k)
    return scores, slots, cand_tok.view(N, k * c).gather(1, idx)


def _next_beams(fin: Tensor, scores: Tensor, slots: Tensor, toks: Tensor, eos_id: int
                ) -> tuple[Tensor, Tensor, Tensor]:
    """The ``k`` candidates that go on, from the ``2k`` best (``scores``, ``slots``, ``toks``,
    each ``(N, 2k)``) and ``fin`` ``(N, k)``, the first ``k`` that finished: each slot
    keeps its own candidate, or, for the ``m``-th finished one, takes the ``m``-th of the
    candidates ``k .. 2k-1`` not ending in EOS; one with none left is dead (``-inf``)."""
    k = fin.size(1)
    spare_ok = toks[:, k:].ne(eos_id)  # (N, k)
    spares = torch.sort((~spare_ok).to(torch.int8), dim=1, stable=True).indices  # ok first
    rank = (fin.cumsum(dim=1) - 1).clamp(min=0)  # (N, k) m of the m-th finished slot
    own = torch.arange(k, device=fin.device).expand_as(fin)
    chosen = torch.where(fin, k + spares.gather(1, rank), own)  # (N, k) index into the 2k
    found = ~fin | rank.lt(spare_ok.sum(dim=1, keepdim=True))
    return (scores.gather(1, chosen).masked_fill(~found, float("-inf")),
            slots.gather(1, chosen), toks.gather(1, chosen))


def full_beam_search(model: Transformer, src: Tensor, beam: int = 5, len_penalty: float = 1.0,
                     max_len_a: float = 1.5, max_len_b: int = 10, nbest: int = 1,
                     bos_id: int = BOS_ID, eos_id: int = EOS_ID, use_cache: bool = True
                     ) -> list[list[tuple[list[int], float]]]:
    """Beam search by CTranslate2's rule (module docstring); returns what ``beam_search``
    does. A sentence with no room for a token gets ``[([], nan)]``, as the ct2 engine."""
    check_beam(beam, nbest)
    k = beam
    with inference(model):
        memory, src_mask = encode(model, src)
        device = src.device
        c = min(2 * k, model.tgt_vocab_size)  # a hypothesis contributes its own c best tokens
        max_lens = max_lengths(model, src, max_len_a, max_len_b)
        finished: list[list[tuple[list[int], float]]] = [
            [] if m > 0 else [([], float("nan"))] for m in max_lens]
        sent_ids = [b for b, m in enumerate(max_lens) if m > 0]  # the N live sentences
        if not sent_ids:
            return finished
        sel, N = torch.tensor(sent_ids, device=device), len(sent_ids)
        stepper = Stepper(model, memory.index_select(0, sel), src_mask.index_select(0, sel),
                          use_cache, banned=[model.pad_id, bos_id])
        sent_max = sel.new_tensor([max_lens[b] for b in sent_ids])  # (N,)
        n_done = torch.zeros(N, dtype=torch.long, device=device)  # finished hyps so far
        top_done = torch.zeros(N, dtype=torch.bool, device=device)  # best candidate finished
        # slots and rows as in beam.py; at the start only beam 0 is live
        sums = torch.full((N, k), float("-inf"), device=device)  # (N, k)
        sums[:, 0] = 0.0
        tokens = torch.full((N, 1), bos_id, dtype=torch.long, device=device)  # (R, t)
        stepper.set_beams(None, torch.arange(N, device=device) * k, k)

        step = 0
        while sent_ids:
            step += 1
            live_slots = sums.isfinite().view(-1).nonzero().flatten()  # (R,) slot ids n*k+j
            logits = stepper.logits(tokens)  # (R, V), pad and bos -inf
            row_top, row_tok = logits.topk(c, dim=1)  # (R, c)
            lse = logsumexp_(logits)  # (R, 1) over the tokens that may be generated

            # 1. every sentence's 2k best candidates over its live hypotheses x tokens
            top_scores, top_slot, top_tok = _best_candidates(sums, live_slots, row_top - lse,
                                                             row_tok)  # (N, 2k) each
            row_of = torch.full((sums.numel(),), -1, dtype=torch.long, device=device)
            row_of[live_slots] = torch.arange(live_slots.numel(), device=device)  # slot -> row

            # 2. of the first k, those ending in EOS (all of them at the cap) finish
            at_cap = sent_max.eq(step)  # (N,)
            fin = (top_tok[:, :k].eq(eos_id) | at_cap[:, None]) & top_scores[:, :k].isfinite()
            if fin.any():
                n_idx, j_idx = fin.nonzero(as_tuple=True)
                hyps = tokens[row_of[top_slot[n_idx, j_idx]], 1:].tolist()
                for n, toks, t, s in zip(n_idx.tolist(), hyps, top_tok[n_idx, j_idx].tolist(),
                                         top_scores[n_idx, j_idx].tolist()):
                    # each holds `step` tokens, EOS included
                    finished[sent_ids[n]].append((toks + [t] * (t != eos_id), s / step**len_penalty))
                n_done += fin.sum(dim=1)
                top_done |= fin[:, 0]

            # 3. each finished one is replaced by the next spare candidate not ending in EOS
            new_scores, new_slot, new_tok = _next_beams(fin, top_scores, top_slot, top_tok,
                                                        eos_id)  # (N, k) each
            alive = new_scores.isfinite()  # (N, k)
            enough = top_done & n_done.ge(nbest) if len_penalty == 0 else n_done.ge(k)
            done = at_cap | enough | ~alive.any(dim=1)  # (N,)
            keep, sent_ids, (sent_max, n_done, top_done, alive, new_scores, new_slot, new_tok) = \
                drop_done(done, sent_ids, sent_max, n_done, top_done, alive, new_scores,
                          new_slot, new_tok)
            if sent_ids:
                tokens, sums = advance_beams(stepper, tokens, row_of, new_slot, new_tok, new_scores,
                                             alive, keep)

        return [sorted(hyps, key=lambda h: -h[1])[:nbest] for hyps in finished]
