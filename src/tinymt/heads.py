"""What does each head do? Importance, pruning, alignment, entropy and distance.

``analyze(cfg)`` (``scripts/analyze_heads.py run=<run dir>``) loads a trained run, takes
the first ``max_sentences`` pairs of one of its data splits and measures, for every head
of every kind (``encoder_self``, ``decoder_self``, ``cross``) and layer:

1. **Importance** (Michel et al., 2019, "Are Sixteen Heads Really Better than One?"):
   every head gets a gate ``xi = 1``; importance is the expected absolute gradient of the
   loss with respect to it, ``I_h = E_x |dL(x)/dxi_h|``. ``L(x)`` is the teacher-forced
   NLL of sentence ``x`` summed over its target tokens (no label smoothing, eval mode);
   the gates are per sentence, so one backward pass gives every sentence's own gradient,
   and the sum of their absolute values is divided by the number of target tokens.
   Scores are then normalised per layer (L2 over the heads of a layer), as in the paper.
2. **Pruning curve**: heads are masked (gate 0) in order of increasing normalised
   importance, ``prune_step`` of them at a time, globally across kinds ("all") and within
   each kind separately; after every step the split is translated greedily (no
   retraining) and scored with sacreBLEU. "Prunable" = the most heads masked such that no
   step up to there lost more than 1 BLEU point.
3. **Alignment error rate** of every cross-attention head against the built-in corpus's
   gold word alignments (teacher forcing on the reference). Decoder row ``t`` is the row
   that *predicts* target piece ``t`` (the rows of the attention figures). Pieces are
   mapped to words by character offsets (see :func:`piece_word_weights`; a piece spanning
   two words counts for both, in proportion to its characters); for each target word the
   attention of its pieces is summed, then summed over the pieces of each source word,
   and the source word with the most mass is linked (several on an exact tie). The
   source EOS acts as NULL: when it gets more mass than any word, the target word stays
   unaligned. ``AER = 1 - 2|A & G| / (|A| + |G|)`` (sure = possible = gold), counted over
   the whole split. One link per target word cannot reproduce many-to-one gold links
   (这 个 -> "This"): the report gives that floor as "oracle AER".
4. **Entropy** (nats) of each attention row and **distance**: ``sum_j w_ij |j - j*_i| /
   T_k`` with ``j*_i = (i + 1/2) T_k / T_q - 1/2`` (the diagonal; ``j* = i`` for
   self-attention), i.e. how far from the diagonal a head looks, as a fraction of the
   sentence. For self-attention the mass on offsets -1 / 0 / +1 and the mean signed
   offset show positional heads (previous token, same token, next token). All are means
   over the non-padding query rows of the split (the offsets and the entropy relative to
   the uniform's: over the rows with more than one key, i.e. not the decoder's BOS row).

Results: figures and scalars under ``heads/...`` in the run's TensorBoard (an events
file of its own, ``*.heads``, replaced by the next analysis), a markdown
report ``<run>/heads.md`` with the PNGs in ``<run>/heads/``, and with ``prune=<fraction>``
a checkpoint whose persistent head masks (:class:`tinymt.model.Transformer`) switch the
least important heads off; ``scripts/translate.py checkpoint=<it>`` loads it unchanged.
"""

from __future__ import annotations

import difflib
import math
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import torch
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from tinymt.batching import eval_batches
from tinymt.checkpoint import save_checkpoint
from tinymt.config import DataConfig
from tinymt.data import prepare, target_language
from tinymt.decoding import translate_ids
from tinymt.errors import TinyMTError
from tinymt.metrics import attention_entropy, score, token_nll
from tinymt.model import KINDS, Transformer
from tinymt.plotting import heatmap, save_figure
from tinymt.rundir import checkpoint_path, load_run
from tinymt.runtime import pick_device

SELF_KINDS = ("encoder_self", "decoder_self")
CURVES = ("all", *KINDS)
BLEU_DROP = 1.0  # "prunable" = BLEU within this many points of the unpruned model
POSITIONAL_MASS = 0.5  # a self-attention head is "positional" with this much mass on one offset
BROAD_ENTROPY = 0.8  # ... "broad" when its entropy is this fraction of the uniform's
_SPECIAL = frozenset({"<unk>", "<s>", "</s>", "<pad>"})
_TIE = 1e-6  # word masses this close (relatively) to the maximum count as a tie
# statistics averaged over the query rows with more than one key to choose from
_CHOICE_ROW_STATS = frozenset({"norm_entropy", "offset", "prev", "same", "next"})


def _bar(it, **kw):
    return tqdm(it, file=sys.stderr, dynamic_ncols=True, mininterval=1.0, **kw)


# ----------------------------------------------------------------------------- shapes
def head_shapes(model: Transformer) -> dict[str, tuple[int, int]]:
    """``{kind: (n_layers, n_heads)}``."""
    return {k: tuple(model.head_mask(k).shape) for k in KINDS}


def all_heads(model: Transformer) -> list[tuple[str, int, int]]:
    """Every head as ``(kind, layer, head)``."""
    return [(k, layer, h) for k, (n_layers, n_heads) in head_shapes(model).items()
            for layer in range(n_layers) for h in range(n_heads)]


def gates_without(model: Transformer, heads: Sequence[tuple[str, int, int]],
                  device=None) -> dict[str, torch.Tensor]:
    """Gates of ones with a 0 at each of ``heads``: ``{kind: (n_layers, n_heads)}``."""
    device = device or model.head_mask("cross").device
    gates = {k: torch.ones(shape, device=device) for k, shape in head_shapes(model).items()}
    for kind, layer, h in heads:
        gates[kind][layer, h] = 0.0
    return gates


# ----------------------------------------------------------------------------- importance
def head_importance(model: Transformer, src_ids: Sequence[Sequence[int]],
                    tgt_ids: Sequence[Sequence[int]], batch_tokens: int = 4096, device="cpu",
                    progress: bool = False) -> dict[str, np.ndarray]:
    """Raw importance ``E_x |dL(x)/dxi_h|`` per head: ``{kind: (n_layers, n_heads)}``.

    ``L(x)`` is sentence ``x``'s summed NLL; the result is divided by the number of target
    tokens (EOS included). The model's persistent masks still apply (a masked head's
    effective gate is ``0 * xi``, so its importance is exactly 0).
    """
    was_training = model.training
    model.eval()
    shapes = head_shapes(model)
    total = {k: torch.zeros(shape, dtype=torch.float64) for k, shape in shapes.items()}
    n_tokens = 0
    batches = eval_batches(src_ids, tgt_ids, batch_tokens)
    it = _bar(batches, desc="importance", unit="batch") if progress else batches
    try:
        for idx, batch in it:
            batch = batch.to(device)
            B = len(idx)
            gates = {k: torch.ones(n_layers, B, n_heads, device=device, requires_grad=True)
                     for k, (n_layers, n_heads) in shapes.items()}  # one gate per sentence
            with torch.enable_grad():
                logits, _ = model(batch.src, batch.tgt_in, head_gates=gates)
                loss = token_nll(logits, batch.tgt_out, model.pad_id)
                grads = torch.autograd.grad(loss, [gates[k] for k in KINDS], allow_unused=True)
            for k, g in zip(KINDS, grads):
                if g is not None:
                    total[k] += g.abs().sum(dim=1).cpu().double()  # sum over sentences
            n_tokens += batch.n_tgt_tokens
    finally:
        model.train(was_training)
    return {k: (v / max(n_tokens, 1)).numpy() for k, v in total.items()}


def normalize_importance(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Divide each layer's scores by their L2 norm (Michel et al.); all-zero layers stay 0."""
    out = {}
    for k, v in raw.items():
        norm = np.linalg.norm(v, axis=1, keepdims=True)
        out[k] = np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)
    return out


def prune_order(importance: dict[str, np.ndarray],
                kinds: Sequence[str] = KINDS) -> list[tuple[str, int, int]]:
    """Heads of ``kinds``, least important first (ties: kind, layer, head order)."""
    heads = [(float(importance[k][layer, h]), KINDS.index(k), layer, h)
             for k in kinds for layer in range(importance[k].shape[0])
             for h in range(importance[k].shape[1])]
    return [(KINDS[ki], layer, h) for _, ki, layer, h in sorted(heads)]


# ----------------------------------------------------------------------------- pruning
def translate_gated(model: Transformer, src_ids: Sequence[Sequence[int]],
                    gates: dict[str, torch.Tensor] | None, batch_tokens: int = 4096,
                    device="cpu", max_len_a: float = 1.5, max_len_b: int = 10
                    ) -> list[list[int]]:
    """Greedy translations of ``src_ids`` (input order) with ``head_gates=gates``."""
    outs = translate_ids(model, src_ids, max_len_a=max_len_a, max_len_b=max_len_b,
                         batch_tokens=batch_tokens, device=device, head_gates=gates)
    return [o[0][0] for o in outs]


def prune_counts(n_heads: int, step: float) -> list[int]:
    """Numbers of heads masked at the steps ``0, step, 2 step, ..., 1`` (deduplicated)."""
    n_steps = max(1, math.ceil(1.0 / step - 1e-9))
    counts = [round(min(1.0, i * step) * n_heads) for i in range(n_steps + 1)]
    return sorted(set(counts) | {0, n_heads})


def prunable(points: Sequence[tuple[int, float]], base: float,
             drop: float = BLEU_DROP) -> int:
    """Most heads masked (of ``(n_masked, bleu)`` points, in order) before BLEU first falls
    more than ``drop`` below ``base``."""
    best = 0
    for n, bleu in sorted(points):
        if bleu < base - drop:
            break
        best = n
    return best


def pruning_curves(model: Transformer, src_ids, refs: Sequence[str], tgt_tokenizer, tgt_lang,
                   importance: dict[str, np.ndarray], step: float = 0.1,
                   batch_tokens: int = 4096, device="cpu", progress: bool = False) -> dict:
    """BLEU after masking the least important heads, ``step`` of them at a time.

    Returns ``{"base": bleu, "curves": {curve: [(n_masked, n_total, bleu), ...]},
    "prunable": {curve: n_heads}}`` for the curves ``all`` and each kind.
    """
    cache: dict[frozenset, float] = {}

    def bleu_without(heads) -> float:
        key = frozenset(heads)
        if key not in cache:
            outs = translate_gated(model, src_ids, gates_without(model, heads, device),
                                   batch_tokens, device)
            cache[key] = score([tgt_tokenizer.decode(o) for o in outs], list(refs),
                               tgt_lang)[0]
        return cache[key]

    plan = []
    for curve in CURVES:
        order = prune_order(importance, KINDS if curve == "all" else (curve,))
        plan += [(curve, n, order) for n in prune_counts(len(order), step)]
    curves: dict[str, list[tuple[int, int, float]]] = {c: [] for c in CURVES}
    it = _bar(plan, desc="pruning", unit="step") if progress else plan
    for curve, n, order in it:
        curves[curve].append((n, len(order), bleu_without(order[:n])))
    base = cache[frozenset()]
    return {"base": base, "curves": curves,
            "prunable": {c: prunable([(n, b) for n, _, b in pts], base)
                         for c, pts in curves.items()}}


# ----------------------------------------------------------------------------- alignment
def _chars(text: str) -> str:
    """NFKC, sentencepiece's word marker and all whitespace removed."""
    return "".join(unicodedata.normalize("NFKC", text).replace("\u2581", " ").split())


def piece_word_weights(pieces: Sequence[str], words: Sequence[str]) -> np.ndarray:
    """How much of each piece belongs to each word: ``(n_pieces, n_words)``, by characters.

    Pieces and words are compared as character strings with whitespace and ``▁``
    removed (after NFKC, as the data pipeline normalises text), so this works for English
    (pieces start with ``▁`` at word starts, punctuation attached to a word) and for
    Chinese (no spaces; words given by the corpus) alike. Row ``p`` holds the fraction of
    piece ``p``'s characters in each word: one 1 for a piece inside a word, fractions for
    a piece spanning words (Chinese BPE merges frequent pairs such as 一个). A bare ``▁``
    copies the next piece's row. When the two strings differ (``<unk>`` pieces,
    normalisation differences) the characters are matched with difflib; pieces with no
    matched character, and special pieces (``<unk>``, ``</s>``, ...), get a row of zeros.
    """
    owner: list[int] = []  # word of each character of the joined words
    for w, word in enumerate(words):
        owner += [w] * len(_chars(word))
    target_text = "".join(_chars(w) for w in words)
    texts = ["" if p in _SPECIAL else _chars(p) for p in pieces]
    joined = "".join(texts)
    # character i of `joined` -> character of target_text, or -1
    if joined == target_text:
        to_target = list(range(len(joined)))
    else:
        to_target = [-1] * len(joined)
        matcher = difflib.SequenceMatcher(None, joined, target_text, autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            to_target[a:a + size] = range(b, b + size)
    weights = np.zeros((len(pieces), len(words)))
    pos = 0
    for p, text in enumerate(texts):
        hits = [owner[to_target[c]] for c in range(pos, pos + len(text)) if to_target[c] >= 0]
        pos += len(text)
        for w in hits:
            weights[p, w] += 1.0 / len(hits)
    for p in range(len(pieces) - 2, -1, -1):  # bare "▁" pieces join the following word
        if pieces[p] not in _SPECIAL and not texts[p]:
            weights[p] = weights[p + 1]
    return weights


def pieces_to_words(pieces: Sequence[str], words: Sequence[str]) -> list[int]:
    """The word holding most of each piece (the first on a tie; -1: none); see
    :func:`piece_word_weights`."""
    weights = piece_word_weights(pieces, words)
    return [int(row.argmax()) if row.sum() > 0 else -1 for row in weights]


def one_hot(mapping: Sequence[int], n_words: int) -> np.ndarray:
    """``(len(mapping), n_words)`` weights of a hard position -> word map (-1: none)."""
    out = np.zeros((len(mapping), n_words))
    for i, w in enumerate(mapping):
        if w >= 0:
            out[i, w] = 1.0
    return out


def attention_links(attn: np.ndarray, src_weights: np.ndarray,
                    tgt_weights: np.ndarray) -> np.ndarray:
    """Word links of cross-attention ``attn`` ``(..., T_q, S)`` as a bool array
    ``(..., n_src_words, n_tgt_words)``.

    ``src_weights`` ``(S, n_src_words)`` / ``tgt_weights`` ``(T_q, n_tgt_words)``: how much
    of each source position (key) / of the target piece each decoder row predicts belongs
    to each word (:func:`piece_word_weights`; zero rows for EOS). For each target word the
    attention of its pieces is summed, then summed over each source word's pieces; the
    source word with the most mass is linked (several on an exact tie), unless the
    source positions of no word (EOS = NULL) together get more.
    """
    attn = np.asarray(attn, dtype=np.float64)
    src_weights = np.asarray(src_weights, dtype=np.float64)
    n_src = src_weights.shape[1]
    null = 1.0 - src_weights.sum(axis=1, keepdims=True)  # (S, 1): EOS, unmapped pieces
    to_src = np.concatenate([src_weights, null.clip(0.0, 1.0)], axis=1)  # (S, W_s + 1)
    to_tgt = np.asarray(tgt_weights, dtype=np.float64).T  # (W_t, T_q)
    mass = to_tgt @ attn @ to_src  # (..., W_t, W_s + 1)
    best = mass.max(axis=-1, keepdims=True)
    links = (mass >= best * (1 - _TIE)) & (best > 0)
    links[..., :n_src] &= ~links[..., n_src:]  # NULL wins: no link
    covered = to_tgt.sum(axis=1) > 0  # target words that have pieces at all
    links &= covered[:, None]
    return np.swapaxes(links[..., :n_src], -1, -2)  # (..., W_s, W_t)


def gold_matrix(alignment: Sequence[Sequence[int]], n_src_words: int,
                n_tgt_words: int) -> np.ndarray:
    """Gold links ``[(src_i, tgt_i), ...]`` -> bool ``(n_src_words, n_tgt_words)``."""
    gold = np.zeros((n_src_words, n_tgt_words), dtype=bool)
    for i, j in alignment:
        gold[i, j] = True
    return gold


def aer(hits: float, n_pred: float, n_gold: float) -> float:
    """Alignment error rate with sure = possible = gold: ``1 - 2|A&G| / (|A| + |G|)``."""
    return 1.0 - 2.0 * hits / (n_pred + n_gold) if n_pred + n_gold else float("nan")


@dataclass
class AlignmentCounts:
    """``|A & G|`` and ``|A|`` per cross head, per layer average, overall average; ``|G|``."""

    heads: np.ndarray  # (n_layers, n_heads, 2): hits, predicted
    layers: np.ndarray  # (n_layers, 2): the head-average of each layer
    overall: np.ndarray  # (2,): the average of every cross head
    gold: int = 0
    oracle_pred: int = 0  # target words with a gold link (one link each: the best possible)

    @classmethod
    def zeros(cls, n_layers: int, n_heads: int) -> AlignmentCounts:
        return cls(np.zeros((n_layers, n_heads, 2)), np.zeros((n_layers, 2)), np.zeros(2))

    def add(self, cross: np.ndarray, src_weights: np.ndarray, tgt_weights: np.ndarray,
            gold_links) -> None:
        """One sentence: ``cross`` ``(n_layers, n_heads, T_q, S)``; weights as
        :func:`attention_links` takes them."""
        gold = gold_matrix(gold_links, src_weights.shape[1], tgt_weights.shape[1])
        for attn, target in ((cross, self.heads), (cross.mean(axis=1), self.layers),
                             (cross.mean(axis=(0, 1)), self.overall)):
            links = attention_links(attn, src_weights, tgt_weights)
            target[..., 0] += (links & gold).sum(axis=(-2, -1))
            target[..., 1] += links.sum(axis=(-2, -1))
        self.gold += int(gold.sum())
        self.oracle_pred += int(gold.any(axis=0).sum())

    def aer(self, counts: np.ndarray) -> np.ndarray:
        c = np.asarray(counts, dtype=np.float64)
        return np.vectorize(lambda h, p: aer(h, p, self.gold))(c[..., 0], c[..., 1])

    @property
    def oracle_aer(self) -> float:
        return aer(self.oracle_pred, self.oracle_pred, self.gold)


# ----------------------------------------------------------------------------- statistics
@dataclass
class AttentionStats:
    """Sums over query rows, per kind ``(n_layers, n_heads)``; :meth:`means` divides."""

    sums: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    rows: dict[str, float] = field(default_factory=dict)
    norm_rows: dict[str, float] = field(default_factory=dict)

    def add(self, kind: str, name: str, value: torch.Tensor) -> None:
        v = value.cpu().double().numpy()
        d = self.sums.setdefault(kind, {})
        d[name] = d.get(name, 0.0) + v

    def means(self) -> dict[str, dict[str, np.ndarray]]:
        out = {}
        for kind, d in self.sums.items():
            out[kind] = {name: v / max(self.norm_rows[kind] if name in _CHOICE_ROW_STATS
                                       else self.rows[kind], 1)
                         for name, v in d.items()}
        return out


def _row_stats(kind: str, w: torch.Tensor, q_len: torch.Tensor, k_len: torch.Tensor,
               causal: bool, layer_sums: dict) -> tuple[int, int]:
    """Accumulate one layer's ``w`` ``(B, h, T_q, T_k)`` (real lengths ``q_len``/``k_len``)."""
    B, _H, T_q, T_k = w.shape
    w = w.float()  # float32 on the device (MPS has no float64); batches add up in float64
    dev = w.device
    i = torch.arange(T_q, device=dev, dtype=torch.float32)[:, None]  # (T_q, 1)
    j = torch.arange(T_k, device=dev, dtype=torch.float32)[None, :]  # (1, T_k)
    q_real = i[None, :, 0] < q_len[:, None]  # (B, T_q)
    rows = q_real[:, None, :].float()  # (B, 1, T_q)
    ql, kl = q_len.float()[:, None, None], k_len.float()[:, None, None]  # (B, 1, 1)
    centre = (i[None] + 0.5) * kl / ql - 0.5  # (B, T_q, 1): the diagonal
    dist = (j[None] - centre).abs() / kl  # (B, T_q, T_k)
    ent = attention_entropy(w)  # (B, h, T_q)
    n_keys = (i[None, :, 0] + 1).expand(B, T_q) if causal else k_len[:, None].expand(B, T_q)
    n_keys = n_keys.float()
    multi = q_real & (n_keys > 1)  # rows where the uniform distribution has entropy > 0
    norm_ent = ent / n_keys.clamp_min(2).log()[:, None, :]
    sums = {
        "entropy": (ent * rows).sum((0, 2)),
        "norm_entropy": (norm_ent * multi[:, None, :].float()).sum((0, 2)),
        "distance": ((w * dist[:, None]).sum(-1) * rows).sum((0, 2)),
    }
    if kind in SELF_KINDS:  # over rows with a choice (not the decoder's BOS row)
        rel = j - i  # (T_q, T_k) key offset from the query
        choice = multi[:, None, :].float()  # (B, 1, T_q)
        sums["offset"] = ((w * rel).sum(-1) * choice).sum((0, 2))
        for off, name in ((-1, "prev"), (0, "same"), (1, "next")):
            sums[name] = ((w * (rel == off)).sum(-1) * choice).sum((0, 2))
    for name, v in sums.items():
        layer_sums.setdefault(name, []).append(v)
    return int(q_real.sum()), int(multi.sum())


@torch.inference_mode()
def attention_pass(model: Transformer, src_ids, tgt_ids, batch_tokens: int = 4096,
                   device="cpu", words: dict | None = None, progress: bool = False
                   ) -> tuple[AttentionStats, AlignmentCounts | None]:
    """One teacher-forced pass with attention weights: entropy / distance statistics of
    every head, and (with ``words``) the cross heads' alignment counts.

    ``words``: ``{"src_weights": [...], "tgt_weights": [...], "alignment": [...]}``, one
    entry per sentence (``None`` entries skip a sentence); weights as
    :func:`attention_links` takes them.
    """
    was_training = model.training
    model.eval()
    stats = AttentionStats()
    shapes = head_shapes(model)
    counts = AlignmentCounts.zeros(*shapes["cross"]) if words is not None else None
    batches = eval_batches(src_ids, tgt_ids, batch_tokens)
    it = _bar(batches, desc="attention", unit="batch") if progress else batches
    try:
        for idx, batch in it:
            batch = batch.to(device)
            _, attn = model(batch.src, batch.tgt_in, need_weights=True)
            src_len = (~batch.src_pad_mask).sum(1)  # (B,) eos included
            tgt_len = (~batch.tgt_pad_mask).sum(1)  # (B,) bos included
            lens = {"encoder_self": (src_len, src_len, False),
                    "decoder_self": (tgt_len, tgt_len, True), "cross": (tgt_len, src_len, False)}
            for kind in KINDS:
                q_len, k_len, causal = lens[kind]
                layer_sums: dict[str, list] = {}
                for w in attn[kind]:
                    n_rows, n_multi = _row_stats(kind, w, q_len, k_len, causal, layer_sums)
                for name, vs in layer_sums.items():
                    stats.add(kind, name, torch.stack(vs))  # (n_layers, h)
                stats.rows[kind] = stats.rows.get(kind, 0) + n_rows
                stats.norm_rows[kind] = stats.norm_rows.get(kind, 0) + n_multi
            if counts is not None:
                cross = torch.stack(attn["cross"], 1).float().cpu().numpy()  # (B, L, h, T, S)
                for b, i in enumerate(idx):
                    if words["src_weights"][i] is None:
                        continue
                    n_t, n_s = int(tgt_len[b]), int(src_len[b])
                    counts.add(cross[b, :, :, :n_t, :n_s], words["src_weights"][i],
                               words["tgt_weights"][i], words["alignment"][i])
    finally:
        model.train(was_training)
    return stats, counts


def head_labels(means: dict[str, np.ndarray], kind: str) -> list[list[str]]:
    """A word per head: previous/same/next token (self-attention with >= 50% of its mass
    on that offset), broad (entropy >= 80% of the uniform's) or content."""
    n_layers, n_heads = means["entropy"].shape
    out = []
    for layer in range(n_layers):
        row = []
        for h in range(n_heads):
            label = "content"
            if kind in SELF_KINDS:
                mass = {"previous token": means["prev"][layer, h],
                        "same token": means["same"][layer, h],
                        "next token": means["next"][layer, h]}
                name, m = max(mass.items(), key=lambda kv: kv[1])
                if m >= POSITIONAL_MASS:
                    label = name
            if label == "content" and means["norm_entropy"][layer, h] >= BROAD_ENTROPY:
                label = "broad"
            row.append(label)
        out.append(row)
    return out


# ----------------------------------------------------------------------------- data
@dataclass
class Sentences:
    """The analysed pairs: ids for the model, texts for BLEU, words for alignment."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    refs: list[str]
    words: dict | None  # see attention_pass; None without gold alignments
    truncated: int = 0


def load_sentences(run, split: str, max_sentences: int, log) -> tuple[Sentences, str, str]:
    """The first ``max_sentences`` (0 = all) pairs of ``split`` of a loaded run's data.

    The data is rebuilt from the run's ``config["data"]`` (a cache hit normally) and
    tokenized with the run's own tokenizers; sentences longer than the model accepts are
    truncated (and left out of the alignment). Returns ``(sentences, target language,
    data source)``.
    """
    data_cfg = run.config.get("data") if isinstance(run.config, dict) else None
    if not data_cfg:
        raise TinyMTError(f"{run.checkpoint} holds no data config: cannot rebuild its "
                          "data split (was it written by tinymt's trainer?)")
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(DataConfig), data_cfg)
    except Exception as e:  # noqa: BLE001  (omegaconf validation errors)
        raise TinyMTError(f"{run.checkpoint}: bad data config ({e})".splitlines()[0]) from None
    data = prepare(cfg, log=log)
    ds = data.splits[split]
    n = len(ds) if not max_sentences else min(max_sentences, len(ds))
    ds = ds.select(range(n))
    cols = set(ds.column_names)
    src_text, refs = ds["src"][:], ds["tgt"][:]
    max_len = run.model.max_positions - 1  # room for eos / bos
    src_ids = run.src_tokenizer.encode_batch(src_text)
    tgt_ids = run.tgt_tokenizer.encode_batch(refs)
    long = [len(s) > max_len or len(t) > max_len for s, t in zip(src_ids, tgt_ids)]
    src_ids = [s[:max_len] for s in src_ids]
    tgt_ids = [t[:max_len] for t in tgt_ids]
    words = None
    if {"src_words", "tgt_words", "alignment"} <= cols:
        words = {"src_weights": [], "tgt_weights": [], "alignment": []}
        for s, t, sw, tw, al, too_long in zip(src_ids, tgt_ids, ds["src_words"][:],
                                              ds["tgt_words"][:], ds["alignment"][:], long):
            if too_long:  # positions cut off: its alignment is incomplete
                for v in words.values():
                    v.append(None)
                continue
            eos_src, eos_tgt = np.zeros((1, len(sw))), np.zeros((1, len(tw)))  # EOS: no word
            words["src_weights"].append(
                np.concatenate([piece_word_weights(run.src_tokenizer.pieces(s), sw), eos_src]))
            words["tgt_weights"].append(
                np.concatenate([piece_word_weights(run.tgt_tokenizer.pieces(t), tw), eos_tgt]))
            words["alignment"].append([tuple(a) for a in al])
    d = run.config["data"]
    tgt_lang = target_language(d)
    source = d.get("source", "?")
    return Sentences(src_ids, tgt_ids, refs, words, sum(long)), tgt_lang, source


# ----------------------------------------------------------------------------- output
def _save_png(fig, path: Path) -> np.ndarray:
    """Save ``fig`` to ``path`` and return the image as ``(H, W, 3)`` uint8 (TensorBoard)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)
    img = matplotlib.image.imread(path)
    if img.dtype != np.uint8:
        img = (img * 255).round().astype(np.uint8)
    return img[..., :3]


def _heatmap(values: np.ndarray, title: str):
    """:func:`tinymt.plotting.heatmap` with its colour scale starting at 0 (so the cell
    text, dark on light cells, stays readable whatever the smallest value is)."""
    fig = heatmap(np.nan_to_num(values, nan=0.0), title)
    top = float(np.nanmax(values)) if np.isfinite(values).any() else 0.0
    fig.axes[0].images[0].set_clim(0.0, top if top > 0 else 1.0)
    return fig


def _pruning_figure(curves: dict, base: float):
    fig, ax = plt.subplots(figsize=(6, 4))
    for curve, pts in curves.items():
        x = [100.0 * n / total if total else 0.0 for n, total, _ in pts]
        ax.plot(x, [b for _, _, b in pts], marker="o", markersize=3,
                label=curve, linewidth=2.2 if curve == "all" else 1.2)
    ax.axhline(base - BLEU_DROP, color="grey", linestyle=":", linewidth=1,
               label=f"unpruned − {BLEU_DROP:g} BLEU")
    ax.set_xlabel("% of heads masked (least important first)")
    ax.set_ylabel("BLEU (greedy)")
    ax.set_title("Pruning heads without retraining")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _scatter_figure(means: dict):
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for kind, marker in zip(KINDS, "osD"):
        m = means[kind]
        ax.scatter(m["distance"].ravel(), m["entropy"].ravel(), marker=marker, label=kind,
                   alpha=0.8)
        for (layer, h), x in np.ndenumerate(m["distance"]):
            ax.annotate(f"{layer}.{h}", (x, m["entropy"][layer, h]), fontsize=6,
                        xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("distance from the diagonal (fraction of the sentence)")
    ax.set_ylabel("entropy (nats)")
    ax.set_title("Heads: positional (left, low) vs content / broad")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _grid_table(values: np.ndarray, fmt: str = "{:.3f}", labels=None) -> list[str]:
    n_layers, n_heads = values.shape
    lines = ["| layer | " + " | ".join(f"head {h}" for h in range(n_heads)) + " |",
             "| --- |" + " --- |" * n_heads]
    for layer in range(n_layers):
        cells = [fmt.format(values[layer, h]) + (f" ({labels[layer][h]})" if labels else "")
                 for h in range(n_heads)]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return lines


def _fmt_aer(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.3f}"


# ----------------------------------------------------------------------------- main
def _check(cfg) -> None:
    if cfg.split not in ("valid", "test"):
        raise TinyMTError(f"split={cfg.split!r}: choose valid or test")
    if not 0 < cfg.prune_step <= 1:
        raise TinyMTError(f"prune_step={cfg.prune_step}: must be in (0, 1], e.g. 0.1")
    if cfg.prune is not None and not 0 <= cfg.prune <= 1:
        raise TinyMTError(f"prune={cfg.prune}: a fraction of the heads, in [0, 1]")
    if cfg.max_sentences < 0:
        raise TinyMTError(f"max_sentences={cfg.max_sentences}: must be >= 0 (0 = all)")
    if cfg.batch_tokens < 1:
        raise TinyMTError(f"batch_tokens={cfg.batch_tokens}: must be positive")


def analyze(cfg, progress: bool = True, log=None) -> dict:
    """Analyse every head of a trained run (see the module docstring); returns the numbers.

    ``cfg`` is a :class:`tinymt.config.AnalyzeConfig`. Writes ``<run>/heads.md``,
    ``<run>/heads/*.png``, TensorBoard events in ``<run>`` and, with ``cfg.prune``, a
    pruned checkpoint.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    _check(cfg)
    device = pick_device(cfg.device)
    run = load_run(cfg.run, cfg.checkpoint, device, cfg.outputs_root)
    model = run.model
    saved = run.state
    if not model._masks_all_ones():
        log(f"note: {run.checkpoint} already has masked heads; they stay masked "
            "(importance 0, masked first)")
    data, tgt_lang, source = load_sentences(run, cfg.split, cfg.max_sentences, log)
    n_sent = len(data.src_ids)
    if n_sent == 0:
        raise TinyMTError(f"split={cfg.split} of {run.run_dir} has no sentences")
    log(f"heads: {run.run_dir} ({run.checkpoint.name}), {n_sent} {cfg.split} sentences, "
        f"device {device}")
    shapes = head_shapes(model)
    n_total = sum(a * b for a, b in shapes.values())

    # 1. importance
    raw = head_importance(model, data.src_ids, data.tgt_ids, cfg.batch_tokens, device,
                          progress)
    importance = normalize_importance(raw)

    # 2. attention statistics and alignment
    stats, counts = attention_pass(model, data.src_ids, data.tgt_ids, cfg.batch_tokens,
                                   device, data.words, progress)
    means = stats.means()
    labels = {k: head_labels(means[k], k) for k in KINDS}

    # 3. pruning curves
    pruning = pruning_curves(model, data.src_ids, data.refs, run.tgt_tokenizer, tgt_lang,
                             importance, cfg.prune_step, cfg.batch_tokens, device, progress)

    # 4. pruned checkpoint
    pruned = None
    if cfg.prune is not None:
        order = prune_order(importance)
        k = round(cfg.prune * n_total)
        masks = gates_without(model, order[:k], device="cpu")
        state = {key: v for key, v in saved.items()
                 if key not in ("optimizer", "scheduler", "rng", "sampler")}
        state["model"] = dict(state["model"])
        for kind in KINDS:
            old = state["model"].get(f"head_mask_{kind}")
            mask = masks[kind] if old is None else masks[kind] * old.float().cpu()
            state["model"][f"head_mask_{kind}"] = mask
        state["pruned"] = {"fraction": cfg.prune, "heads": [list(h) for h in order[:k]],
                           "from": str(run.checkpoint)}
        out_path = Path(cfg.prune_output or checkpoint_path(run.run_dir, "pruned"))
        save_checkpoint(state, out_path)
        outs = translate_gated(model, data.src_ids, gates_without(model, order[:k], device),
                               cfg.batch_tokens, device)
        bleu = score([run.tgt_tokenizer.decode(o) for o in outs], data.refs, tgt_lang)[0]
        pruned = {"path": str(out_path), "fraction": cfg.prune, "n_masked": k,
                  "heads": order[:k], "bleu": bleu}
        log(f"pruned checkpoint ({k}/{n_total} heads masked, BLEU {bleu:.2f}): {out_path}")

    # 5. figures, TensorBoard, report
    run_dir = run.run_dir
    fig_dir = run_dir / "heads"
    ckpt_step = int(saved.get("step") or 0)
    images: dict[str, tuple[Path, object]] = {}  # tag -> (png path, matplotlib figure)
    for kind in KINDS:
        images[f"importance/{kind}"] = (fig_dir / f"importance_{kind}.png", _heatmap(
            importance[kind], f"importance (normalised per layer): {kind}"))
        images[f"entropy/{kind}"] = (fig_dir / f"entropy_{kind}.png", _heatmap(
            means[kind]["entropy"], f"attention entropy (nats): {kind}"))
        images[f"distance/{kind}"] = (fig_dir / f"distance_{kind}.png", _heatmap(
            means[kind]["distance"], f"distance from the diagonal: {kind}"))
    images["pruning"] = (fig_dir / "pruning.png", _pruning_figure(pruning["curves"],
                                                                   pruning["base"]))
    images["entropy_vs_distance"] = (fig_dir / "entropy_vs_distance.png", _scatter_figure(means))
    alignment = None
    if counts is not None:
        head_aer = counts.aer(counts.heads)  # (L, h)
        layer_aer = counts.aer(counts.layers)  # (L,)
        best = np.unravel_index(np.nanargmin(head_aer), head_aer.shape) \
            if np.isfinite(head_aer).any() else (0, 0)
        alignment = {"aer": head_aer, "layer_average_aer": layer_aer,
                     "average_aer": float(counts.aer(counts.overall)),
                     "best_head": (int(best[0]), int(best[1])),
                     "best_aer": float(head_aer[best]), "oracle_aer": counts.oracle_aer,
                     "gold_links": counts.gold}
        images["aer"] = (fig_dir / "aer_cross.png",
                         _heatmap(head_aer, "alignment error rate (lower = better): cross"))
    pngs = {tag: (path, _save_png(fig, path)) for tag, (path, fig) in images.items()}

    # our events file carries the suffix .heads: a new analysis replaces the previous one
    # (the pruning curves' steps are % masked, so appending would draw them twice)
    for old in run_dir.glob("events.out.tfevents.*.heads"):
        old.unlink()
    writer = SummaryWriter(str(run_dir), filename_suffix=".heads")
    try:
        for tag, (_, img) in pngs.items():
            writer.add_image(f"heads/{tag}", img, ckpt_step, dataformats="HWC")
        for kind in KINDS:
            for (layer, h), v in np.ndenumerate(importance[kind]):
                pre = f"{kind}/layer_{layer}/head_{h}"
                writer.add_scalar(f"heads/importance/{pre}", float(v), ckpt_step)
                writer.add_scalar(f"heads/entropy/{pre}", float(means[kind]["entropy"][layer, h]),
                                  ckpt_step)
                writer.add_scalar(f"heads/distance/{pre}",
                                  float(means[kind]["distance"][layer, h]), ckpt_step)
        for curve, pts in pruning["curves"].items():
            for n, total, b in pts:  # x axis = % of the curve's heads masked
                writer.add_scalar(f"heads/pruning_bleu/{curve}", b,
                                  round(100 * n / total) if total else 0)
            writer.add_scalar(f"heads/prunable/{curve}", pruning["prunable"][curve], ckpt_step)
        if alignment:
            for (layer, h), v in np.ndenumerate(alignment["aer"]):
                writer.add_scalar(f"heads/aer/layer_{layer}/head_{h}", float(v), ckpt_step)
            writer.add_scalar("heads/aer/best", alignment["best_aer"], ckpt_step)
            writer.add_scalar("heads/aer/average", alignment["average_aer"], ckpt_step)
        writer.add_text("heads/report", f"see {run_dir / 'heads.md'}", ckpt_step)
    finally:
        writer.close()

    result = {
        "run_dir": str(run_dir), "checkpoint": str(run.checkpoint), "split": cfg.split,
        "sentences": n_sent, "truncated": data.truncated, "shapes": shapes, "n_heads": n_total,
        "importance_raw": raw, "importance": importance,
        "stats": means, "labels": labels, "pruning": pruning, "alignment": alignment,
        "alignment_note": None if alignment else (
            f"no gold word alignments in data.source={source}: alignment error rates need "
            "the built-in corpus"),
        "pruned": pruned, "report": str(run_dir / "heads.md"),
        "figures": {tag: str(p) for tag, (p, _) in pngs.items()},
    }
    (run_dir / "heads.md").write_text(_report(result, run_dir), encoding="utf-8")
    log(f"unpruned BLEU {pruning['base']:.2f}; heads prunable within {BLEU_DROP:g} BLEU: "
        + ", ".join(f"{c} {pruning['prunable'][c]}/{pts[-1][1]}"
                    for c, pts in pruning["curves"].items())
        + (f"; best aligning head: cross layer {alignment['best_head'][0]} head "
           f"{alignment['best_head'][1]} (AER {alignment['best_aer']:.3f}), all cross heads "
           f"averaged AER {alignment['average_aer']:.3f}" if alignment
           else f"; {result['alignment_note']}"))
    log(f"report: {run_dir / 'heads.md'}  (figures in {fig_dir}/, TensorBoard tags heads/...)")
    return result


def _report(r: dict, run_dir: Path) -> str:
    def img(tag: str, alt: str) -> str:
        return f"![{alt}]({Path(r['figures'][tag]).relative_to(run_dir).as_posix()})"

    pr = r["pruning"]
    L = []
    L += ["# What does each head do?", "",
          f"Run `{run_dir}`, checkpoint `{Path(r['checkpoint']).name}`, "
          f"{r['sentences']} sentences of the {r['split']} split"
          + (f" ({r['truncated']} truncated to the model's length)" if r["truncated"] else "")
          + f". {r['n_heads']} heads: "
          + ", ".join(f"{k} {a}×{b}" for k, (a, b) in r["shapes"].items())
          + " (layers × heads).", ""]

    L += ["## 1. Importance", "",
          ("Expected |∂ loss / ∂ gate| of each head (Michel et al., 2019), teacher-forced on "
          "the references, normalised per layer (L2). Low = the loss hardly notices the head."),
          ""]
    for kind in KINDS:
        L += [f"**{kind}**", "", *_grid_table(r["importance"][kind]), "",
              img(f"importance/{kind}", f"importance {kind}"), ""]

    L += ["## 2. Pruning without retraining", "",
          ("Heads masked least important first; greedy BLEU after each step. "
          f"Unpruned BLEU: **{pr['base']:.2f}**."), "",
          "| curve | heads | prunable (BLEU within 1 point) | BLEU at each step (heads masked: BLEU) |",
          "| --- | --- | --- | --- |"]
    for curve, pts in pr["curves"].items():
        total = pts[-1][1]
        k = pr["prunable"][curve]
        steps = ", ".join(f"{n}: {b:.1f}" for n, _, b in pts)
        L.append(f"| {curve} | {total} | **{k}** ({100 * k / max(total, 1):.0f}%) | {steps} |")
    L += ["", img("pruning", "BLEU vs heads masked"), ""]
    if r["pruned"]:
        p = r["pruned"]
        L += [f"Pruned checkpoint: `{p['path']}` — {p['n_masked']} of {r['n_heads']} heads "
              f"masked ({100 * p['n_masked'] / r['n_heads']:.0f}%; prune={p['fraction']:g}), BLEU {p['bleu']:.2f}. Masked: "
              + (", ".join(f"{k} {layer}.{h}" for k, layer, h in p["heads"]) or "none")
              + ". Translate with it: `python scripts/translate.py run=" + str(run_dir)
              + f" checkpoint={p['path']}`.", ""]

    L += ["## 3. Cross-attention as word alignment", ""]
    a = r["alignment"]
    if a is None:
        L += [f"Skipped: {r['alignment_note']}.", ""]
    else:
        L += [("Alignment error rate (AER, lower is better) of each cross-attention head's "
              "alignment against the corpus's gold word alignments: for each target word, the "
              "source word whose pieces get the most of its attention (EOS = no link). "
              f"{a['gold_links']} gold links."), "",
              *_grid_table(a["aer"]), "",
              "| heads averaged | AER |", "| --- | --- |"]
        for layer, v in enumerate(a["layer_average_aer"]):
            L.append(f"| layer {layer} | {_fmt_aer(v)} |")
        L += [f"| all cross heads | {_fmt_aer(a['average_aer'])} |", "",
              (f"Best head: **layer {a['best_head'][0]}, head {a['best_head'][1]}**, AER "
              f"**{a['best_aer']:.3f}**. Floor for one link per target word (oracle): "
              f"{a['oracle_aer']:.3f}."), "", img("aer", "AER per cross head"), ""]

    L += ["## 4. Entropy and distance", "",
          ("Entropy (nats) of each head's attention rows, and its distance from the diagonal "
          "as a fraction of the sentence (0 = on the diagonal). Self-attention labels: "
          f"previous / same / next token when ≥ {POSITIONAL_MASS:.0%} of the mass is on "
          f"that offset; broad when the entropy is ≥ {BROAD_ENTROPY:.0%} of the uniform's; "
          "else content."), "",
          "| kind | layer | head | entropy | distance | mean offset | mass at −1 / 0 / +1 "
          "| label |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for kind in KINDS:
        m = r["stats"][kind]
        for (layer, h), e in np.ndenumerate(m["entropy"]):
            off = f"{m['offset'][layer, h]:+.2f}" if "offset" in m else "—"
            mass = " / ".join(f"{m[n][layer, h]:.2f}" for n in ("prev", "same", "next")) \
                if "prev" in m else "—"
            L.append(f"| {kind} | {layer} | {h} | {e:.2f} | {m['distance'][layer, h]:.3f} "
                     f"| {off} | {mass} | {r['labels'][kind][layer][h]} |")
    L += ["", img("entropy_vs_distance", "entropy vs distance"), ""]
    for kind in KINDS:
        L += [img(f"entropy/{kind}", f"entropy {kind}") + " "
              + img(f"distance/{kind}", f"distance {kind}")]
    L.append("")
    return "\n".join(L)
