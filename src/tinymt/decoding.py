"""Greedy search and batched beam search.

Both run on the KV cache (``use_cache=True``: one new token per sentence per step) or,
as a baseline, recompute the whole decoder prefix every step (``use_cache=False``).
Sentences that finish leave the batch (their rows are dropped with ``reorder``), so a
batch costs as much as its longest translation, not ``batch x longest``.

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
from collections.abc import Iterator

import torch
from torch import Tensor

from tinymt.errors import TinyMTError
from tinymt.model import HeadGates, Transformer


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


def _max_lengths(
    model: Transformer, src_pad_mask: Tensor, max_len_a: float, max_len_b: float
) -> list[int]:
    """Per-sentence maximum number of output tokens (EOS not counted)."""
    cap = model.max_positions - 1  # decoder positions: BOS + the tokens before EOS
    src_lens = (~src_pad_mask).sum(dim=1).tolist()
    return [max(0, min(int(max_len_a * n + max_len_b), cap)) for n in src_lens]


class _Stepper:
    """Next-token log-probabilities for a batch of prefixes, cached or recomputed.

    ``log_probs(prefix)`` takes the whole prefix ``(N, t)`` (BOS first) either way: the
    cached path feeds only its last token, the uncached path re-runs the decoder on all of
    it. ``reorder(index)`` keeps batch rows ``index`` of the state.
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
            self.memory = memory  # (N, S, d)
            self.src_pad_mask = src_pad_mask  # (N, S)

    def log_probs(self, prefix: Tensor) -> Tensor:
        if self.use_cache:
            assert self.cache.step == prefix.size(1) - 1, "cache and prefix out of step"
            logits, _ = self.model.decode_step(
                prefix[:, -1:], self.cache, head_gates=self.head_gates
            )  # (N, V)
        else:
            logits, _ = self.model.decode(
                prefix, self.memory, self.src_pad_mask, head_gates=self.head_gates,
                last_only=True,
            )  # (N, V)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        logp = logits.log_softmax(dim=-1)  # (N, V)
        logp[:, self.banned] = float("-inf")
        return logp

    def reorder(self, index: Tensor, same_sentences: bool = False) -> None:
        """Keep rows ``index``; ``same_sentences``: rows only move between one sentence's
        beams, so the (identical) encoder-side state needs no copy."""
        if self.use_cache:
            self.cache.reorder(index, cross=not same_sentences)
        elif not same_sentences:
            self.memory = self.memory.index_select(0, index)
            self.src_pad_mask = self.src_pad_mask.index_select(0, index)


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
    bos_id: int = 2,
    eos_id: int = 3,
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
            next_tok = stepper.log_probs(prefix).argmax(dim=-1)  # (N,)
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
                stepper.reorder(keep)
        return results


def beam_search(
    model: Transformer,
    src: Tensor,
    src_pad_mask: Tensor | None = None,
    beam: int = 5,
    len_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    nbest: int = 1,
    bos_id: int = 2,
    eos_id: int = 3,
    use_cache: bool = True,
    head_gates: HeadGates = None,
) -> list[list[tuple[list[int], float]]]:
    """Batched beam search: all sentences x beams are rows of one tensor.

    Each step every live hypothesis is extended by every token; of the ``2 * beam`` best
    candidates of a sentence (by summed log-probability), those ending in EOS *and ranked
    within the first ``beam``* are finished, and the ``beam`` best others stay alive. A
    sentence is done once it has ``beam`` finished hypotheses, no live one, or reached its
    maximum length (EOS forced). ``beam=1`` is exactly greedy search.

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
        max_lens = _max_lengths(model, src_pad_mask, max_len_a, max_len_b)
        finished: list[list[tuple[list[int], float]]] = [[] for _ in range(B)]

        stepper = _Stepper(
            model, memory, src_pad_mask, use_cache, head_gates, banned=[model.pad_id, bos_id]
        )
        stepper.reorder(torch.arange(B, device=device).repeat_interleave(k))  # B*k rows
        sent_ids = list(range(B))  # original sentence of each of the N live sentences
        sent_max = torch.tensor(max_lens, device=device)  # (N,)
        tokens = torch.full((B * k, 1), bos_id, dtype=torch.long, device=device)  # (N*k, t)
        sums = torch.full((B, k), float("-inf"), device=device)  # (N, k) summed log p
        sums[:, 0] = 0.0  # only the first beam is live at the start
        not_eos = torch.arange(V, device=device).ne(eos_id)  # (V,)

        step = 0
        while sent_ids:
            step += 1
            N = len(sent_ids)
            logp = stepper.log_probs(tokens).view(N, k, V)  # (N, k, V)
            force_eos = sent_max.lt(step)  # (N,) hypotheses already hold max_len tokens
            logp = logp.masked_fill(force_eos[:, None, None] & not_eos, float("-inf"))
            cand = sums.to(logp.dtype)[:, :, None] + logp  # (N, k, V)
            top_scores, top_idx = cand.view(N, k * V).topk(2 * k, dim=1)  # (N, 2k), sorted
            top_beam = top_idx // V  # (N, 2k) which hypothesis is extended
            top_tok = top_idx % V  # (N, 2k) by which token
            is_eos = top_tok.eq(eos_id)

            # 1. EOS candidates within the first k finish
            fin = is_eos[:, :k] & top_scores[:, :k].isfinite()  # (N, k)
            if fin.any():
                n_idx, j_idx = fin.nonzero(as_tuple=True)
                src_rows = n_idx * k + top_beam[n_idx, j_idx]
                hyps = tokens[src_rows, 1:].tolist()
                for n, toks, s in zip(n_idx.tolist(), hyps, top_scores[n_idx, j_idx].tolist()):
                    finished[sent_ids[n]].append((toks, s / (len(toks) + 1) ** len_penalty))

            # 2. the k best non-EOS candidates stay alive
            alive_scores, pos = top_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=1)
            alive_beam = top_beam.gather(1, pos)  # (N, k)
            alive_tok = top_tok.gather(1, pos)  # (N, k)
            rows = torch.arange(N, device=device)[:, None] * k + alive_beam  # (N, k) old rows

            # 3. sentences that are done leave the batch
            n_finished = torch.tensor([len(finished[s]) for s in sent_ids], device=device)
            done = n_finished.ge(k) | force_eos | ~alive_scores[:, 0].isfinite()  # (N,)
            same_sentences = not done.any()
            if not same_sentences:
                keep = (~done).nonzero().flatten()  # (N',)
                sent_ids = [sent_ids[n] for n in keep.tolist()]
                sent_max = sent_max.index_select(0, keep)
                rows, alive_scores, alive_tok = rows[keep], alive_scores[keep], alive_tok[keep]
            if sent_ids:
                flat = rows.reshape(-1)  # (N' * k,)
                tokens = torch.cat([tokens.index_select(0, flat), alive_tok.reshape(-1, 1)], 1)
                sums = alive_scores
                stepper.reorder(flat, same_sentences=same_sentences)

        return [sorted(hyps, key=lambda h: -h[1])[:nbest] for hyps in finished]
