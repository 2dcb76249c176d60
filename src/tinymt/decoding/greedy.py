"""Greedy search: the most likely token at every step."""

from __future__ import annotations

import torch
from torch import Tensor

from tinymt.decoding.stepper import Stepper, encode, inference, max_lengths
from tinymt.model import Transformer
from tinymt.tokenizer import BOS_ID, EOS_ID


def greedy_decode(
    model: Transformer,
    src: Tensor,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    use_cache: bool = True,
) -> list[list[int]]:
    """Translate ``src`` ``(B, S)`` by picking the most likely token at every step.

    The source is encoded once; then, starting from BOS, the decoder predicts the next
    token of every unfinished sentence, which is appended to its prefix, until each has
    produced EOS or its length cap. ``use_cache``: feed only the newest token and keep the
    earlier positions' keys and values (:mod:`tinymt.decoding.cache`), or re-run the decoder
    on the whole prefix (the same tokens, slower). Returns one token list per sentence (no
    BOS/EOS), in input order.
    """
    with inference(model):  # eval mode, no autograd
        memory, src_mask = encode(model, src)  # (B, S, d), (B, 1, 1, S)
        B = src.size(0)
        max_lens = max_lengths(model, src, max_len_a, max_len_b)  # tokens each may produce
        results: list[list[int]] = [[] for _ in range(B)]

        alive = [b for b in range(B) if max_lens[b] > 0]  # the sentence of each row
        if not alive:
            return results
        rows = torch.tensor(alive, device=src.device)
        stepper = Stepper(model, memory.index_select(0, rows), src_mask.index_select(0, rows),
                          use_cache, banned=[model.pad_id, bos_id])
        row_max = torch.tensor([max_lens[b] for b in alive], device=src.device)  # (N,)
        prefix = torch.full((len(alive), 1), bos_id, dtype=torch.long, device=src.device)

        step = 0
        while alive:
            step += 1
            next_tok = stepper.logits(prefix).argmax(dim=-1)  # (N,) the most likely token
            prefix = torch.cat([prefix, next_tok[:, None]], dim=1)  # (N, step + 1)
            hit_eos = next_tok.eq(eos_id)
            done = hit_eos | row_max.le(step)  # (N,)
            if not done.any():
                continue
            # finished sentences leave the batch: a batch costs its longest translation
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
