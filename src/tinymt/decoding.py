"""Greedy search and batched beam search.

Both run on the KV cache (``use_cache=True``: one new token per sentence per step) or,
as a baseline, recompute the whole decoder prefix every step (``use_cache=False``).
Sentences that finish leave the batch (their rows are dropped from the decoder state), so
a batch costs as much as its longest translation, not ``batch x longest``; in beam search
finished hypotheses leave too (the beam shrinks).

Conventions:

* A sentence may produce at most ``int(max_len_a * src_len + max_len_b)`` tokens before
  EOS (``src_len`` = its non-pad source tokens), capped so that every decoder position
  fits in ``model.max_positions``. Beam search forces EOS after that many tokens; greedy
  simply stops.
* ``pad`` and ``bos`` are never generated.
* Beam scores: a finished hypothesis of ``n`` tokens (EOS included) scores
  ``sum(log p) / n ** len_penalty``.
* Returned token lists hold neither BOS nor EOS.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor
from tqdm import tqdm

from tinymt.batching import collate, length_batches
from tinymt.errors import TinyMTError
from tinymt.model import HeadGates, Transformer
from tinymt.tokenizer import BOS_ID, EOS_ID


@contextlib.contextmanager
def _inference(model: Transformer) -> Iterator[None]:
    """Eval mode and ``torch.inference_mode`` for the block; restore the mode after."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def max_output_length(src_len: int, max_len_a: float, max_len_b: float,
                      max_positions: int) -> int:
    """The most tokens (EOS not counted) a sentence of ``src_len`` source tokens (its EOS
    included) may produce: ``int(max_len_a * src_len + max_len_b)``, capped so that BOS and
    the tokens before EOS fit in ``max_positions`` decoder positions."""
    return max(0, min(int(max_len_a * src_len + max_len_b), max_positions - 1))


def _max_lengths(
    model: Transformer, src_pad_mask: Tensor, max_len_a: float, max_len_b: float
) -> list[int]:
    """Per-sentence maximum number of output tokens (EOS not counted)."""
    src_lens = (~src_pad_mask).sum(dim=1).tolist()
    return [max_output_length(n, max_len_a, max_len_b, model.max_positions) for n in src_lens]


class _Stepper:
    """Next-token logits for a batch of prefixes, cached or recomputed.

    ``raw_logits(prefix)`` takes the whole prefix ``(R, t)`` (BOS first) either way: the
    cached path feeds only its last token, the uncached path re-runs the decoder on all of
    it. Rows start as one per sentence; ``keep`` drops sentences (greedy), ``set_beams``
    makes the rows hypotheses in beam slots (see ``DecoderCache.set_beams``).
    """

    def __init__(
        self,
        model: Transformer,
        memory: Tensor,
        src_pad_mask: Tensor,
        use_cache: bool,
        head_gates: HeadGates,
        banned: list[int],
    ):
        self.model = model
        self.use_cache = use_cache
        self.head_gates = head_gates
        self.banned = [i for i in banned if 0 <= i < model.tgt_vocab_size]
        if use_cache:
            self.cache = model.init_cache(memory, src_pad_mask)
        else:
            self.memory = memory  # (N, S, d) one row per sentence
            self.src_pad_mask = src_pad_mask  # (N, S)
            self.sentence_of_row: Tensor | None = None  # (R,) beam layout

    def logits(self, prefix: Tensor) -> Tensor:
        """Float logits ``(R, V)`` of the next token; banned tokens get ``-inf``."""
        logits = self.raw_logits(prefix)
        logits[:, self.banned] = float("-inf")
        return logits

    def raw_logits(self, prefix: Tensor) -> Tensor:
        """Float logits ``(R, V)`` of the next token for every row of ``prefix``."""
        if self.use_cache:
            assert self.cache.step == prefix.size(1) - 1, "cache and prefix out of step"
            logits, _ = self.model.decode_step(
                prefix[:, -1:], self.cache, head_gates=self.head_gates
            )  # (R, V)
        else:
            memory, mask = self.memory, self.src_pad_mask
            if self.sentence_of_row is not None:
                memory = memory.index_select(0, self.sentence_of_row)  # (R, S, d)
                mask = mask.index_select(0, self.sentence_of_row)  # (R, S)
            logits, _ = self.model.decode(
                prefix, memory, mask, head_gates=self.head_gates, last_only=True
            )  # (R, V)
        return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits

    def keep(self, index: Tensor) -> None:
        """One row per sentence: keep rows ``index``."""
        if self.use_cache:
            self.cache.reorder(index)
        else:
            self.memory = self.memory.index_select(0, index)
            self.src_pad_mask = self.src_pad_mask.index_select(0, index)

    def set_beams(
        self, rows: Tensor | None, slots: Tensor, beam: int, sentences: Tensor | None = None
    ) -> None:
        """Rows ``rows`` (None: as they are) are now slots ``slots`` of an (N, beam) grid;
        ``sentences`` (None: all) stay."""
        if self.use_cache:
            self.cache.set_beams(rows, slots, beam, sentences)
            return
        if sentences is not None:
            self.memory = self.memory.index_select(0, sentences)
            self.src_pad_mask = self.src_pad_mask.index_select(0, sentences)
        self.sentence_of_row = torch.div(slots, beam, rounding_mode="floor")  # (R,)


def _logsumexp_(x: Tensor) -> Tensor:
    """``x.logsumexp(-1, keepdim=True)``, overwriting ``x`` (no (N, V) temporaries: on CPU
    allocating those costs more than the arithmetic)."""
    top = x.amax(dim=-1, keepdim=True)  # (N, 1)
    return x.sub_(top).exp_().sum(dim=-1, keepdim=True).log_().add_(top)


def _encode(model, src, src_pad_mask, head_gates):
    if src_pad_mask is None:
        src_pad_mask = src.eq(model.pad_id)  # (B, S)
    memory, _ = model.encode(src, src_pad_mask, head_gates=head_gates)  # (B, S, d)
    return memory, src_pad_mask


def greedy_decode(
    model: Transformer,
    src: Tensor,
    src_pad_mask: Tensor | None = None,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    use_cache: bool = True,
    head_gates: HeadGates = None,
) -> list[list[int]]:
    """Translate ``src`` ``(B, S)`` by picking the most likely token at every step.

    Returns one token list per sentence (no BOS/EOS), in input order.
    """
    with _inference(model):
        memory, src_pad_mask = _encode(model, src, src_pad_mask, head_gates)
        B = src.size(0)
        max_lens = _max_lengths(model, src_pad_mask, max_len_a, max_len_b)
        results: list[list[int]] = [[] for _ in range(B)]

        alive = [b for b in range(B) if max_lens[b] > 0]  # sentence ids of the rows
        if not alive:
            return results
        rows = torch.tensor(alive, device=src.device)
        stepper = _Stepper(
            model, memory.index_select(0, rows), src_pad_mask.index_select(0, rows),
            use_cache, head_gates, banned=[model.pad_id, bos_id],
        )
        row_max = torch.tensor([max_lens[b] for b in alive], device=src.device)  # (N,)
        prefix = torch.full((len(alive), 1), bos_id, dtype=torch.long, device=src.device)

        step = 0
        while alive:
            step += 1
            next_tok = stepper.logits(prefix).argmax(dim=-1)  # (N,)
            prefix = torch.cat([prefix, next_tok[:, None]], dim=1)  # (N, step + 1)
            hit_eos = next_tok.eq(eos_id)
            done = hit_eos | row_max.le(step)  # (N,)
            if not done.any():
                continue
            done_rows = done.nonzero().flatten().tolist()
            tokens = prefix[done_rows, 1:].tolist()
            eos_flags = hit_eos[done_rows].tolist()
            for r, toks, ended in zip(done_rows, tokens, eos_flags):
                results[alive[r]] = toks[:-1] if ended else toks
            keep = (~done).nonzero().flatten()  # (N',)
            alive = [alive[r] for r in keep.tolist()]
            if alive:
                prefix = prefix.index_select(0, keep)
                row_max = row_max.index_select(0, keep)
                stepper.keep(keep)
        return results


# long: one search loop (expand, rank, finish, shrink the beam, reorder the caches) whose
# steps share a dozen tensors; split into helpers they would pass all of them around
def beam_search(
    model: Transformer,
    src: Tensor,
    src_pad_mask: Tensor | None = None,
    beam: int = 5,
    len_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    nbest: int = 1,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    use_cache: bool = True,
    head_gates: HeadGates = None,
) -> list[list[tuple[list[int], float]]]:
    """Batched beam search; the beams of all sentences are the rows of one tensor.

    A sentence keeps ``beam`` slots. Every step each live hypothesis is extended by every
    token, and the sentence's ``room`` best candidates (by summed log-probability; ``room``
    = ``beam`` minus the hypotheses it has finished so far) take the slots: those ending in
    EOS are finished, the others stay alive. So the beam shrinks as hypotheses finish (as
    in Nematus and Marian), and a sentence is done once it has finished ``beam``
    hypotheses, has none alive, or reached its maximum length (EOS forced). Only live
    hypotheses are run through the decoder. ``beam=1`` is exactly greedy search.

    Returns, per sentence in input order, up to ``nbest`` ``(tokens, score)`` pairs, best
    first, with ``score = sum(log p) / n ** len_penalty`` (``n`` counts EOS).
    """
    if beam < 1 or not 1 <= nbest <= beam:
        raise TinyMTError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam}, nbest={nbest}")
    k = beam
    with _inference(model):
        memory, src_pad_mask = _encode(model, src, src_pad_mask, head_gates)
        device = src.device
        B = src.size(0)
        V = model.tgt_vocab_size
        c = min(k, V)  # a hypothesis can only contribute its own c best tokens
        max_lens = _max_lengths(model, src_pad_mask, max_len_a, max_len_b)
        finished: list[list[tuple[list[int], float]]] = [[] for _ in range(B)]

        # Slots are (sentence, beam) pairs, N x k of them; a slot is live when its summed
        # log-probability is finite. The decoder state and ``tokens`` hold one row per
        # live slot, in slot order (sentence-major). At the start only beam 0 is live.
        stepper = _Stepper(
            model, memory, src_pad_mask, use_cache, head_gates, banned=[model.pad_id, bos_id]
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
            lse = _logsumexp_(logits)  # (R, 1): log p = logits - lse (banned ones included)

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
            keep = None
            if done.any():
                keep = (~done).nonzero().flatten()  # (N',)
                sent_ids = [sent_ids[n] for n in keep.tolist()]
                sent_max, room = sent_max[keep], room[keep]
                alive, top_scores, top_slot, top_tok = (
                    alive[keep], top_scores[keep], top_slot[keep], top_tok[keep])
            if sent_ids:
                rows = row_of[top_slot[alive]]  # (R',) old rows of the new live slots
                tokens = torch.cat([tokens.index_select(0, rows), top_tok[alive][:, None]], 1)
                sums = top_scores.masked_fill(~alive, float("-inf"))  # (N', k)
                slots = alive.view(-1).nonzero().flatten()  # (R',) in row order
                stepper.set_beams(rows, slots, k, sentences=keep)

        return [sorted(hyps, key=lambda h: -h[1])[:nbest] for hyps in finished]


# ----------------------------------------------------------------------------- id lists
def translate_ids(model: Transformer, src_ids: Sequence[Sequence[int]], *, beam: int = 1,
                  len_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
                  nbest: int = 1, batch_tokens: int = 4096, device="cpu", use_cache: bool = True,
                  progress: bool = False, head_gates: HeadGates = None
                  ) -> list[list[tuple[list[int], float]]]:
    """Translate id lists (no eos) -> per sentence, ``nbest`` (ids, score) best first.

    Sentences go through the model in length-sorted batches of at most ``batch_tokens``
    padded source tokens; results come back in input order. Greedy (``beam=1``) reports
    a score of ``nan``: it does not rank hypotheses. ``head_gates``
    (``{kind: (n_layers, n_heads)}``) scales heads, e.g. to prune them.
    """
    results: list = [None] * len(src_ids)
    batches = length_batches([len(s) for s in src_ids], batch_tokens)
    it: Iterable = batches
    if progress:
        it = tqdm(batches, desc="translate", unit="batch", file=sys.stderr, mininterval=1.0)
    for idx in it:
        batch = collate([list(src_ids[i]) for i in idx], [[] for _ in idx]).to(device)
        if beam == 1:
            outs = greedy_decode(model, batch.src, batch.src_pad_mask, max_len_a=max_len_a,
                                 max_len_b=max_len_b, use_cache=use_cache,
                                 head_gates=head_gates)
            hyps = [[(o, float("nan"))] for o in outs]
        else:
            hyps = beam_search(model, batch.src, batch.src_pad_mask, beam=beam,
                               len_penalty=len_penalty, max_len_a=max_len_a,
                               max_len_b=max_len_b, nbest=nbest, use_cache=use_cache,
                               head_gates=head_gates)
        for i, h in zip(idx, hyps):
            results[i] = [(list(t), float(s)) for t, s in h]
    return results
