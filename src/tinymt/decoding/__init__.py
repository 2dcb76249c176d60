"""Greedy search and batched beam search, by two rules (``beam_rule``).

* ``shrink`` (ours, the default: :func:`beam_search`, beam.py): finished hypotheses take
  beam slots, so the beam shrinks as they finish; EOS is forced at the length cap.
* ``full`` (CTranslate2's: :func:`full_beam_search`, full_beam.py): finished hypotheses
  are replaced, so the beam stays full; no EOS is forced at the cap. ``translate.py
  engine=ct2`` runs this rule, so this is the one to compare an export with.

All searches run on the KV cache (``use_cache=True``: one new token per sentence per step) or,
as a baseline, recompute the whole decoder prefix every step (``use_cache=False``).
Sentences that finish leave the batch (their rows are dropped from the decoder state), so
a batch costs as much as its longest translation, not ``batch x longest``; by the
``shrink`` rule finished hypotheses leave too.

Conventions:

* A sentence may produce at most ``int(max_len_a * src_len + max_len_b)`` tokens before
  EOS (``src_len`` = its non-pad source tokens), capped so that every decoder position
  fits in ``model.max_positions``. Beam search by the ``shrink`` rule forces EOS after
  that many tokens; greedy search and the ``full`` rule simply stop.
* ``pad`` and ``bos`` are never generated.
* Beam scores: a finished hypothesis of ``n`` tokens (its EOS, if it has one, included) scores
  ``sum(log p) / n ** len_penalty``.
* Returned token lists hold neither BOS nor EOS.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence

from tqdm import tqdm

from tinymt.batching import collate, length_batches
from tinymt.decoding.beam import beam_search
from tinymt.decoding.full_beam import full_beam_search
from tinymt.decoding.greedy import greedy_decode
from tinymt.decoding.stepper import check_beam, max_output_length
from tinymt.errors import TinyMTError
from tinymt.model import Transformer

__all__ = ["BEAM_RULES", "beam_search", "check_beam", "full_beam_search", "greedy_decode",
           "max_output_length", "translate_ids"]

BEAM_RULES = {"shrink": beam_search, "full": full_beam_search}  # beam_rule -> search


# ----------------------------------------------------------------------------- id lists
def translate_ids(model: Transformer, src_ids: Sequence[Sequence[int]], *, beam: int = 1,
                  len_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
                  nbest: int = 1, batch_tokens: int = 4096, device="cpu", use_cache: bool = True,
                  progress: bool = False, beam_rule: str = "shrink"
                  ) -> list[list[tuple[list[int], float]]]:
    """Id lists (no eos) -> per sentence, in input order, ``nbest`` (ids, score) best
    first; length-sorted batches of at most ``batch_tokens`` padded source tokens. Greedy
    (``beam=1``) scores ``nan``: it does not rank hypotheses."""
    if beam_rule not in BEAM_RULES:
        raise TinyMTError(f"beam_rule={beam_rule!r}: choose one of {', '.join(BEAM_RULES)}")
    results: list = [None] * len(src_ids)
    batches = length_batches([len(s) for s in src_ids], batch_tokens)
    it: Iterable = batches
    if progress:
        it = tqdm(batches, desc="translate", unit="batch", file=sys.stderr, mininterval=1.0)
    for idx in it:
        batch = collate([list(src_ids[i]) for i in idx], [[] for _ in idx]).to(device)
        if beam == 1:
            outs = greedy_decode(model, batch.src, max_len_a=max_len_a,
                                 max_len_b=max_len_b, use_cache=use_cache)
            hyps = [[(o, float("nan"))] for o in outs]
        else:
            hyps = BEAM_RULES[beam_rule](model, batch.src, beam=beam,
                                         len_penalty=len_penalty, max_len_a=max_len_a,
                                         max_len_b=max_len_b, nbest=nbest,
                                         use_cache=use_cache)
        for i, h in zip(idx, hyps):
            results[i] = [(list(t), float(s)) for t, s in h]
    return results
