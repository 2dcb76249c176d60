"""Greedy search: the most likely token at every step, the whole prefix through the decoder.

The plain loop, for reading: :func:`tinymt.decoding.search.greedy_search` finds the same
tokens faster (the KV cache, finished sentences leave the batch), and that is what
:func:`tinymt.decoding.translate_ids` runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tinymt.model import Transformer
from tinymt.runtime import eval_mode
from tinymt.tokenizer import BOS_ID, EOS_ID


def max_output_length(src_len: int, max_len_a: float, max_len_b: float,
                      max_positions: int) -> int:
    """The most tokens (EOS not counted) a sentence of ``src_len`` source tokens (its EOS
    included) may produce: ``int(max_len_a * src_len + max_len_b)``, capped so that BOS and
    the tokens before EOS fit in ``max_positions`` decoder positions."""
    return max(0, min(int(max_len_a * src_len + max_len_b), max_positions - 1))


def max_lengths(model: Transformer, src: Tensor, max_len_a: float, max_len_b: float
                ) -> list[int]:
    """Per-sentence maximum number of output tokens (EOS not counted)."""
    src_lens = src.ne(model.pad_id).sum(dim=1).tolist()
    return [max_output_length(n, max_len_a, max_len_b, model.max_positions) for n in src_lens]


def greedy_decode(model: Transformer, src: Tensor, max_len_a: float = 1.5,
                  max_len_b: int = 10) -> list[list[int]]:
    """Translate ``src`` ``(B, S)`` by picking the most likely token at every step.

    The source is encoded once; then, starting from BOS, the decoder reads every
    sentence's whole prefix and predicts its next token (never ``pad`` or ``bos``), which is
    appended, until each sentence has produced EOS or its :func:`max_output_length`
    tokens. Returns one token list per sentence (no BOS/EOS), in input order.
    """
    with eval_mode(model, inference=True):  # dropout off, no autograd
        src_mask = model.padding_mask(src)  # (B, 1, 1, S)
        memory, _ = model.encode(src, src_mask)  # (B, S, d)
        max_lens = max_lengths(model, src, max_len_a, max_len_b)  # tokens each may produce
        results: list[list[int]] = [[] for _ in max_lens]
        running = [m > 0 for m in max_lens]  # sentences still translating
        prefix = torch.full((src.size(0), 1), BOS_ID, dtype=torch.long, device=src.device)

        while any(running):
            hidden, _ = model.decode(prefix, memory, src_mask)  # (B, t, d)
            logits = model.logits(hidden[:, -1])  # (B, V) scores of the next token
            logits[:, [model.pad_id, BOS_ID]] = float("-inf")  # never generated
            next_tok = logits.argmax(dim=-1)  # (B,) the most likely token
            prefix = torch.cat([prefix, next_tok[:, None]], dim=1)  # (B, t + 1)
            for b, tok in enumerate(next_tok.tolist()):  # finished sentences' tokens unused
                if running[b] and tok == EOS_ID:
                    running[b] = False
                elif running[b]:
                    results[b].append(tok)
                    running[b] = len(results[b]) < max_lens[b]
        return results
