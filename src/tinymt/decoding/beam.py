"""Beam search, ours: finished hypotheses take beam slots, so the beam shrinks."""

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


# long: one search loop (expand, rank, finish, shrink the beam, reorder the caches) whose
# steps share a dozen tensors; split into helpers they would pass all of them around
def beam_search(
    model: Transformer,
    src: Tensor,
    beam: int = 5,
    len_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    nbest: int = 1,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    use_cache: bool = True,
) -> list[list[tuple[list[int], float]]]:
    """Batched beam search (the beams of all sentences are the rows of one tensor) whose
    beam shrinks as hypotheses finish (docs/architecture.md, "Decoding"); ``beam=1`` is
    exactly greedy search. Per sentence in input order, up to ``nbest`` ``(tokens,
    score)`` best first, ``score = sum(log p) / n ** len_penalty`` (``n`` counts EOS)."""
    check_beam(beam, nbest)
    k = beam
    with inference(model):
        memory, src_mask = encode(model, src)
        device = src.device
        B = src.size(0)
        V = model.tgt_vocab_size
        c = min(k, V)  # a hypothesis can only contribute its own c best tokens
        max_lens = max_lengths(model, src, max_len_a, max_len_b)
        finished: list[list[tuple[list[int], float]]] = [[] for _ in range(B)]

        # Slots are (sentence, beam) pairs, N x k of them; a slot is live when its summed
        # log-probability is finite. The decoder state and ``tokens`` hold one row per
        # live slot, in slot order (sentence-major). At the start only beam 0 is live.
        stepper = Stepper(
            model, memory, src_mask, use_cache, banned=[model.pad_id, bos_id]
        )
        sent_ids = list(range(B))  # original sentence of each of the N live sentences
        sent_max = torch.tensor(max_lens, device=device)  # (N,)
        room = torch.full((B,), k, device=device)  # (N,) slots not taken by finished hyps
        sums = torch.full((B, k), float("-inf"), device=device)  # (N, k) summed log p
        sums[:, 0] = 0.0
        tokens = torch.full((B, 1), bos_id, dtype=torch.long, device=device)  # (R, t)
        stepper.set_beams(None, torch.arange(B, device=device) * k, k)
        not_eos = torch.arange(V, device=device).ne(eos_id)  # (V,)
        slot_rank = torch.arange(k, device=device)  # (k,)

        step = 0
        while sent_ids:
            step += 1
            N = len(sent_ids)
            live = sums.isfinite()  # (N, k)
            live_slots = live.view(-1).nonzero().flatten()  # (R,) slot ids n*k+j
            logits = stepper.raw_logits(tokens)  # (R, V)
            kept = logits[:, stepper.banned]  # (R, n_banned), put back for the normaliser
            logits[:, stepper.banned] = float("-inf")
            choosable = logits  # (R, V)
            force_eos = sent_max.lt(step)  # (N,) hypotheses already hold max_len tokens
            if force_eos.any():  # ... and may only end
                forced = force_eos[live_slots // k][:, None] & not_eos  # (R, V)
                choosable = choosable.masked_fill(forced, float("-inf"))
            row_top, row_tok = choosable.topk(c, dim=1)  # (R, c) each hypothesis' best tokens
            logits[:, stepper.banned] = kept
            lse = logsumexp_(logits)  # (R, 1): log p = logits - lse (banned ones included)

            # 1. every sentence's best candidates over its live hypotheses x tokens
            slot_logp = row_top.new_zeros(N * k, c)  # dead slots: sums = -inf masks them
            slot_logp[live_slots] = row_top - lse
            slot_tok = row_tok.new_zeros(N * k, c)
            slot_tok[live_slots] = row_tok
            cand = sums.to(slot_logp.dtype)[:, :, None] + slot_logp.view(N, k, c)  # (N, k, c)
            top_scores, top_idx = cand.view(N, k * c).topk(k, dim=1)  # (N, k), sorted
            top_slot = torch.arange(N, device=device)[:, None] * k + top_idx // c  # (N, k)
            top_tok = slot_tok.view(N, k * c).gather(1, top_idx)  # (N, k)
            taken = slot_rank < room[:, None]  # (N, k) the room best candidates ...
            taken &= top_scores.isfinite()  # ... that exist
            is_eos = top_tok.eq(eos_id)
            row_of = torch.full((N * k,), -1, dtype=torch.long, device=device)
            row_of[live_slots] = torch.arange(live_slots.numel(), device=device)  # slot -> row

            # 2. candidates ending in EOS are finished
            fin = taken & is_eos  # (N, k)
            if fin.any():
                n_idx, j_idx = fin.nonzero(as_tuple=True)
                hyps = tokens[row_of[top_slot[n_idx, j_idx]], 1:].tolist()
                for n, toks, s in zip(n_idx.tolist(), hyps, top_scores[n_idx, j_idx].tolist()):
                    finished[sent_ids[n]].append((toks, s / (len(toks) + 1) ** len_penalty))
                room = room - fin.sum(dim=1)

            # 3. the others stay alive; sentences with no room or no live hypothesis leave
            alive = taken & ~is_eos  # (N, k)
            done = room.le(0) | force_eos | ~alive.any(dim=1)  # (N,)
            keep, sent_ids, (sent_max, room, alive, top_scores, top_slot, top_tok) = drop_done(
                done, sent_ids, sent_max, room, alive, top_scores, top_slot, top_tok)
            if sent_ids:
                tokens, sums = advance_beams(stepper, tokens, row_of, top_slot, top_tok, top_scores,
                                             alive, keep)

        return [sorted(hyps, key=lambda h: -h[1])[:nbest] for hyps in finished]

