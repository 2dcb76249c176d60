"""One teacher-forced pass with attention weights (:func:`attention_pass`): every head's
entropy, distance and offsets, the cross heads' word alignments and the self-attention
heads' relation counts (:class:`RelationCounts`).

Per head, sums over the non-padding query rows: the entropy (nats), the distance from the
diagonal ``sum_j w_ij |j - j*_i| / T_k`` with ``j*_i = (i + 1/2) T_k / T_q - 1/2`` (``j* =
i`` for self-attention) and for self-attention the mass on the offsets -1 / 0 / +1 and the
mean signed offset; :meth:`AttentionStats.means` turns them into means (the offsets and the
entropy relative to the uniform's over the rows with more than one key: not the decoder's
BOS row).

Alignment: decoder row ``t`` predicts target piece ``t``; pieces are mapped to words by
their characters (:func:`tinymt.words.piece_word_weights`). :class:`AlignmentCounts` adds
up ``|A & G|``, ``|A|`` and ``|G|`` over the split for ``AER = 1 - 2|A & G| / (|A| + |G|)``
(sure = possible = gold). One link per target word cannot reproduce many-to-one gold links
(这 个 -> "This"): that floor is the "oracle AER".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tinymt.batching import eval_batches
from tinymt.heads.gates import SELF_KINDS, head_shapes, progress_bar
from tinymt.heads.relations import RelationCounts
from tinymt.metrics import attention_entropy
from tinymt.model import KINDS, Transformer
from tinymt.runtime import eval_mode

_TIE = 1e-6  # word masses this close (relatively) to the maximum count as a tie


def attention_links(attn: np.ndarray, src_weights: np.ndarray,
                    tgt_weights: np.ndarray) -> np.ndarray:
    """Word links of cross-attention ``attn`` ``(..., T_q, S)``: bool ``(..., n_src_words,
    n_tgt_words)``. ``src_weights`` ``(S, n_src_words)`` / ``tgt_weights`` ``(T_q,
    n_tgt_words)``: how much of each key / of the piece each row predicts is each word
    (zero rows for EOS). A target word is linked to the source word whose pieces get the
    most of its pieces' attention (several on an exact tie), unless the positions of no
    word (EOS = NULL) together get more.
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
    links &= (to_tgt.sum(axis=1) > 0)[:, None]  # only target words that have pieces
    return np.swapaxes(links[..., :n_src], -1, -2)  # (..., W_s, W_t)


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
        :func:`attention_links` takes them; gold links ``[(src_i, tgt_i), ...]``."""
        gold = np.zeros((src_weights.shape[1], tgt_weights.shape[1]), dtype=bool)
        for i, j in gold_links:
            gold[i, j] = True
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


def alignment_summary(counts: AlignmentCounts) -> dict:
    """The numbers the report gives: AER per cross head ``(n_layers, n_heads)``, per layer
    (heads averaged), of all cross heads averaged, the best head and its AER, the oracle
    AER and the number of gold links."""
    head_aer = counts.aer(counts.heads)  # (L, h)
    best = np.unravel_index(np.nanargmin(head_aer), head_aer.shape) \
        if np.isfinite(head_aer).any() else (0, 0)
    return {"aer": head_aer, "layer_average_aer": counts.aer(counts.layers),
            "average_aer": float(counts.aer(counts.overall)),
            "best_head": (int(best[0]), int(best[1])),
            "best_aer": float(head_aer[best]), "oracle_aer": counts.oracle_aer,
            "gold_links": counts.gold}


POSITIONAL_MASS = 0.5  # a self-attention head is "positional" with this much mass on one offset
BROAD_ENTROPY = 0.8  # ... "broad" when its entropy is this fraction of the uniform's
# statistics averaged over the query rows with more than one key to choose from
_CHOICE_ROW_STATS = frozenset({"norm_entropy", "offset", "prev", "same", "next"})
_OFFSETS = ((-1, "prev", "previous token"), (0, "same", "same token"), (1, "next", "next token"))


@dataclass
class AttentionStats:
    """Per kind, sums over query rows ``{name: (n_layers, n_heads)}`` and the numbers of
    rows summed ``[all, with more than one key]``; :meth:`means` divides."""

    sums: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    rows: dict[str, np.ndarray] = field(default_factory=dict)

    def means(self) -> dict[str, dict[str, np.ndarray]]:
        """``{kind: {name: (n_layers, n_heads)}}``: the sums divided by their rows."""
        return {kind: {name: v / max(self.rows[kind][int(name in _CHOICE_ROW_STATS)], 1)
                       for name, v in d.items()} for kind, d in self.sums.items()}


def _row_sums(kind: str, w: torch.Tensor, q_len: torch.Tensor,
              k_len: torch.Tensor) -> tuple[dict[str, torch.Tensor], int, int]:
    """One layer's ``w`` ``(B, h, T_q, T_k)`` (real lengths ``q_len`` / ``k_len``): the
    sums over its rows ``{name: (h,)}``, the number of rows, of rows with a choice."""
    B, _H, T_q, T_k = w.shape
    w = w.float()  # float32 on the device (MPS has no float64); batches add up in float64
    i = torch.arange(T_q, device=w.device, dtype=torch.float32)[:, None]  # (T_q, 1)
    j = torch.arange(T_k, device=w.device, dtype=torch.float32)[None, :]  # (1, T_k)
    q_real = i[None, :, 0] < q_len[:, None]  # (B, T_q)
    ql, kl = q_len.float()[:, None, None], k_len.float()[:, None, None]  # (B, 1, 1)
    dist = (j[None] - ((i[None] + 0.5) * kl / ql - 0.5)).abs() / kl  # (B, T_q, T_k)
    ent = attention_entropy(w)  # (B, h, T_q)
    causal = kind == "decoder_self"
    n_keys = ((i[None, :, 0] + 1).expand(B, T_q) if causal else k_len[:, None].expand(B, T_q)
              ).float()
    multi = q_real & (n_keys > 1)  # rows where the uniform distribution has entropy > 0
    per_row = {"entropy": ent, "norm_entropy": ent / n_keys.clamp_min(2).log()[:, None, :],
               "distance": (w * dist[:, None]).sum(-1)}  # each (B, h, T_q)
    if kind in SELF_KINDS:
        rel = j - i  # (T_q, T_k) key offset from the query
        per_row["offset"] = (w * rel).sum(-1)
        for off, name, _ in _OFFSETS:
            per_row[name] = (w * (rel == off)).sum(-1)
    sums = {name: (v * (multi if name in _CHOICE_ROW_STATS else q_real)[:, None, :].float()
                   ).sum((0, 2)) for name, v in per_row.items()}
    return sums, int(q_real.sum()), int(multi.sum())


def attention_pass(model: Transformer, src_ids, tgt_ids, batch_tokens: int = 4096,
                   device="cpu", words: dict | None = None, progress: bool = False
                   ) -> tuple[AttentionStats, AlignmentCounts | None, RelationCounts | None]:
    """Every head's entropy / distance statistics and (with ``words``: per sentence, or
    None to skip it, ``src_weights`` / ``tgt_weights`` as :func:`attention_links` takes
    them, ``alignment``, ``src_relations`` / ``tgt_relations`` as
    :meth:`RelationCounts.add`) the cross heads' alignment and self heads' relation counts."""
    stats = AttentionStats()
    shapes = head_shapes(model)
    counts = AlignmentCounts.zeros(*shapes["cross"]) if words is not None else None
    relations = RelationCounts(shapes) if words and "src_relations" in words else None
    batches = eval_batches(src_ids, tgt_ids, batch_tokens)
    with eval_mode(model, inference=True):
        for idx, batch in progress_bar(batches, desc="attention", unit="batch",
                                       disable=not progress):
            batch = batch.to(device)
            _, attn = model(batch.src, batch.tgt_in, need_weights=True)
            src_len = (~batch.src_pad_mask).sum(1)  # (B,) eos included
            tgt_len = (~batch.tgt_pad_mask).sum(1)  # (B,) bos included
            for kind, (q_len, k_len) in (("encoder_self", (src_len, src_len)),
                                         ("decoder_self", (tgt_len, tgt_len)),
                                         ("cross", (tgt_len, src_len))):
                layers = [_row_sums(kind, w, q_len, k_len) for w in attn[kind]]
                d = stats.sums.setdefault(kind, {})
                for name in layers[0][0]:
                    v = torch.stack([s[name] for s, _, _ in layers]).cpu().double().numpy()
                    d[name] = d.get(name, 0.0) + v  # (n_layers, h)
                stats.rows[kind] = stats.rows.get(kind, 0) + np.array(layers[-1][1:])
            if counts is None:
                continue
            stacked = {k: torch.stack(attn[k], 1).float().cpu().numpy()  # (B, L, h, T_q, T_k)
                       for k in KINDS}
            for b, i in enumerate(idx):  # the gold words of each sentence
                src_w, tgt_w = words["src_weights"][i], words["tgt_weights"][i]
                if src_w is None:
                    continue
                n_t, n_s = int(tgt_len[b]), int(src_len[b])
                counts.add(stacked["cross"][b, :, :, :n_t, :n_s], src_w, tgt_w,
                           words["alignment"][i])
                if relations is None:
                    continue
                # decoder input = BOS + the target pieces: the rows of tgt_w (+ EOS) shifted
                dec_w = np.concatenate([np.zeros((1, tgt_w.shape[1])), tgt_w[:-1]])
                relations.add("encoder_self", stacked["encoder_self"][b, :, :, :n_s, :n_s],
                              src_w, words["src_relations"][i])
                relations.add("decoder_self", stacked["decoder_self"][b, :, :, :n_t, :n_t],
                              dec_w, words["tgt_relations"][i])
    return stats, counts, relations


def head_labels(means: dict[str, np.ndarray], kind: str) -> list[list[str]]:
    """A word per head ``[layer][head]``: previous/same/next token (self-attention with >=
    50% of its mass on that offset), broad (entropy >= 80% of the uniform's) or content."""
    def label(layer: int, h: int) -> str:
        if kind in SELF_KINDS:
            mass, name = max(((means[key][layer, h], name) for _, key, name in _OFFSETS),
                             key=lambda m: m[0])
            if mass >= POSITIONAL_MASS:
                return name
        return "broad" if means["norm_entropy"][layer, h] >= BROAD_ENTROPY else "content"

    n_layers, n_heads = means["entropy"].shape
    return [[label(layer, h) for h in range(n_heads)] for layer in range(n_layers)]
