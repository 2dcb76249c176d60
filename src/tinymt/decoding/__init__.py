"""Greedy search and batched beam search, by two rules (``beam_rule``): ``greedy.py`` (the
core's plain loop, the length cap every search shares), ``search.py`` (what
:func:`translate_ids` runs, on ``cache.py``'s KV cache); both rules: docs/architecture.md.

Conventions:

* A sentence may produce at most ``int(max_len_a * src_len + max_len_b)`` tokens before
  EOS (``src_len`` = its non-pad source tokens), capped so that every decoder position
  fits in ``model.max_positions``.
* ``pad`` and ``bos`` are never generated.
* Beam scores: a finished hypothesis of ``n`` tokens (its EOS, if it has one, included) scores
  ``sum(log p) / n ** len_penalty``.
* Returned token lists hold neither BOS nor EOS.
"""

from __future__ import annotations

from collections.abc import Sequence

from tinymt.batching import collate, length_batches
from tinymt.decoding.greedy import greedy_decode, max_output_length
from tinymt.decoding.search import RULES, beam_search, check_beam, greedy_search
from tinymt.model import Transformer
from tinymt.runtime import progress_bar

__all__ = ["RULES", "beam_search", "check_beam", "greedy_decode", "greedy_search",
           "max_output_length", "translate_ids"]


# ----------------------------------------------------------------------------- id lists
def translate_ids(model: Transformer, src_ids: Sequence[Sequence[int]], *, beam: int = 1,
                  len_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
                  nbest: int = 1, batch_tokens: int = 4096, device="cpu", progress: bool = False,
                  beam_rule: str = "shrink"
                  ) -> list[list[tuple[list[int], float]]]:
    """Id lists (no eos) -> per sentence, in input order, ``nbest`` (ids, score) best
    first; length-sorted batches of at most ``batch_tokens`` padded source tokens. Greedy
    (``beam=1``) scores ``nan``: it does not rank hypotheses."""
    results: dict[int, list[tuple[list[int], float]]] = {}  # input index -> its hypotheses
    batches = length_batches([len(s) for s in src_ids], batch_tokens)
    for idx in progress_bar(batches, desc="translate", unit="batch", disable=not progress):
        batch = collate([list(src_ids[i]) for i in idx], [[] for _ in idx]).to(device)
        if beam == 1:
            outs = greedy_search(model, batch.src, max_len_a=max_len_a, max_len_b=max_len_b)
            hyps = [[(o, float("nan"))] for o in outs]
        else:
            hyps = beam_search(model, batch.src, beam=beam, len_penalty=len_penalty,
                               max_len_a=max_len_a, max_len_b=max_len_b, nbest=nbest,
                               rule=beam_rule)
        results.update(zip(idx, hyps))
    return [results[i] for i in range(len(src_ids))]
