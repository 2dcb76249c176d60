"""What greedy and beam search share: the decoder run one step (:class:`Stepper`, cached or
recomputed), the length cap, the encoder pass and inference mode."""

from __future__ import annotations

import torch
from torch import Tensor

from tinymt.decoding.cache import DecoderCache, decode_step
from tinymt.errors import TinyMTError
from tinymt.model import Transformer
from tinymt.runtime import eval_mode


def inference(model: Transformer):
    """Eval mode and ``torch.inference_mode`` for the block; restore the mode after."""
    return eval_mode(model, inference=True)


def check_beam(beam: int, nbest: int) -> None:
    """The beam options every search (and the ct2 engine) takes, or one error line."""
    if beam < 1 or not 1 <= nbest <= beam:
        raise TinyMTError(f"need beam >= 1 and 1 <= nbest <= beam, got beam={beam}, nbest={nbest}")


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


class Stepper:
    """Next-token logits for a batch of prefixes, cached or recomputed.

    ``raw_logits(prefix)`` takes the whole prefix ``(R, t)`` (BOS first) either way: the
    cached path feeds only its last token, the uncached path re-runs the decoder on all of
    it. Rows start as one per sentence; ``keep`` drops sentences (greedy), ``set_beams``
    makes the rows hypotheses in beam slots (see ``DecoderCache.set_beams``).
    """

    def __init__(self, model: Transformer, memory: Tensor, src_mask: Tensor, use_cache: bool,
                 banned: list[int]):
        self.model = model
        self.use_cache = use_cache
        self.banned = [i for i in banned if 0 <= i < model.tgt_vocab_size]
        if use_cache:
            self.cache = DecoderCache(model, memory, src_mask)
        else:
            self.memory = memory  # (N, S, d) one row per sentence
            self.src_mask = src_mask  # (N, 1, 1, S)
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
            logits, _ = decode_step(self.model, prefix[:, -1:], self.cache)  # (R, V)
        else:
            memory, mask = self.memory, self.src_mask
            if self.sentence_of_row is not None:
                memory = memory.index_select(0, self.sentence_of_row)  # (R, S, d)
                mask = mask.index_select(0, self.sentence_of_row)  # (R, 1, 1, S)
            hidden, _ = self.model.decode(prefix, memory, mask)  # (R, t, d)
            logits = self.model.logits(hidden[:, -1])  # (R, V)
        return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits

    def keep(self, index: Tensor) -> None:
        """One row per sentence: keep rows ``index``."""
        if self.use_cache:
            self.cache.reorder(index)
        else:
            self.memory = self.memory.index_select(0, index)
            self.src_mask = self.src_mask.index_select(0, index)

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
            self.src_mask = self.src_mask.index_select(0, sentences)
        self.sentence_of_row = torch.div(slots, beam, rounding_mode="floor")  # (R,)


def logsumexp_(x: Tensor) -> Tensor:
    """``x.logsumexp(-1, keepdim=True)``, overwriting ``x`` (no (N, V) temporaries: on CPU
    allocating those costs more than the arithmetic)."""
    top = x.amax(dim=-1, keepdim=True)  # (N, 1)
    return x.sub_(top).exp_().sum(dim=-1, keepdim=True).log_().add_(top)


def encode(model: Transformer, src: Tensor) -> tuple[Tensor, Tensor]:
    """The memory ``(B, S, d)`` of ``src`` ``(B, S)`` and its mask ``(B, 1, 1, S)``."""
    src_mask = model.padding_mask(src)  # (B, 1, 1, S)
    memory, _ = model.encode(src, src_mask)  # (B, S, d)
    return memory, src_mask


def drop_done(done: Tensor, sent_ids: list[int], *per_sentence: Tensor
              ) -> tuple[Tensor | None, list[int], tuple[Tensor, ...]]:
    """Sentences marked ``done`` ``(N,)`` leave the search: returns ``keep`` (the indices of
    the others, None when none is done), their ``sent_ids`` and each ``per_sentence``
    tensor (first dimension ``N``) cut to them."""
    if not done.any():
        return None, sent_ids, per_sentence
    keep = (~done).nonzero().flatten()  # (N',)
    return keep, [sent_ids[n] for n in keep.tolist()], tuple(x[keep] for x in per_sentence)


def advance_beams(stepper: Stepper, tokens: Tensor, row_of: Tensor, slot: Tensor, tok: Tensor,
                  scores: Tensor, alive: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor]:
    """Beam search's hand-over: the hypotheses that go on (``alive`` ``(N', k)``, each the
    one of old slot ``slot`` extended by ``tok``, summing ``scores``) become the decoder
    rows, in slot order; ``row_of`` maps old slots to old rows, ``keep`` the sentences
    still searching (None: all). Returns the new ``tokens`` ``(R', t + 1)`` and ``sums``
    ``(N', k)`` (``-inf`` where no hypothesis lives)."""
    rows = row_of[slot[alive]]  # (R',) old rows of the new live slots
    tokens = torch.cat([tokens.index_select(0, rows), tok[alive][:, None]], 1)
    slots = alive.view(-1).nonzero().flatten()  # (R',) in row order
    stepper.set_beams(rows, slots, alive.size(1), sentences=keep)
    return tokens, scores.masked_fill(~alive, float("-inf"))
