"""Entropy, distance and offsets of every head's attention rows, and a label per head.

One teacher-forced pass (:func:`attention_pass`) sums, per head, over the non-padding
query rows: the entropy (nats), the distance from the diagonal ``sum_j w_ij |j - j*_i| /
T_k`` with ``j*_i = (i + 1/2) T_k / T_q - 1/2``, and for self-attention the mass on the
offsets -1 / 0 / +1 and the mean signed offset; :meth:`AttentionStats.means` turns the
sums into means (the offsets and the entropy relative to the uniform's over the rows with
more than one key). The same pass feeds the cross heads' :class:`AlignmentCounts` and
the self-attention heads' :class:`RelationCounts`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tinymt.batching import eval_batches
from tinymt.heads.alignment import AlignmentCounts
from tinymt.heads.gates import SELF_KINDS, head_shapes, progress_bar
from tinymt.heads.relations import RelationCounts
from tinymt.metrics import attention_entropy
from tinymt.model import KINDS, Transformer

POSITIONAL_MASS = 0.5  # a self-attention head is "positional" with this much mass on one offset
BROAD_ENTROPY = 0.8  # ... "broad" when its entropy is this fraction of the uniform's
# statistics averaged over the query rows with more than one key to choose from
_CHOICE_ROW_STATS = frozenset({"norm_entropy", "offset", "prev", "same", "next"})


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
                   ) -> tuple[AttentionStats, AlignmentCounts | None, RelationCounts | None]:
    """One teacher-forced pass with attention weights: entropy / distance statistics of
    every head, and (with ``words``) the cross heads' alignment counts and the self heads'
    relation counts.

    ``words``: ``{"src_weights": [...], "tgt_weights": [...], "alignment": [...],
    "src_relations": [...], "tgt_relations": [...]}``, one entry per sentence (``None``
    entries skip a sentence); weights as :func:`attention_links` takes them, relations as
    :meth:`RelationCounts.add`.
    """
    was_training = model.training
    model.eval()
    stats = AttentionStats()
    shapes = head_shapes(model)
    counts = AlignmentCounts.zeros(*shapes["cross"]) if words is not None else None
    relations = RelationCounts(shapes) if words and "src_relations" in words else None
    batches = eval_batches(src_ids, tgt_ids, batch_tokens)
    it = progress_bar(batches, desc="attention", unit="batch") if progress else batches
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
                _add_gold(attn, idx, src_len, tgt_len, words, counts, relations)
    finally:
        model.train(was_training)
    return stats, counts, relations


def _add_gold(attn: dict, idx, src_len, tgt_len, words: dict, counts: AlignmentCounts,
              relations: RelationCounts | None) -> None:
    """One batch's attention into the alignment and relation counts."""
    stacked = {k: torch.stack(attn[k], 1).float().cpu().numpy()  # (B, L, h, T_q, T_k)
               for k in KINDS}
    for b, i in enumerate(idx):
        src_w, tgt_w = words["src_weights"][i], words["tgt_weights"][i]
        if src_w is None:
            continue
        n_t, n_s = int(tgt_len[b]), int(src_len[b])
        counts.add(stacked["cross"][b, :, :, :n_t, :n_s], src_w, tgt_w, words["alignment"][i])
        if relations is None:
            continue
        # decoder input = BOS + the target pieces: the rows of tgt_w (pieces + EOS) shifted
        dec_w = np.concatenate([np.zeros((1, tgt_w.shape[1])), tgt_w[:-1]])
        relations.add("encoder_self", stacked["encoder_self"][b, :, :, :n_s, :n_s], src_w,
                      words["src_relations"][i])
        relations.add("decoder_self", stacked["decoder_self"][b, :, :, :n_t, :n_t], dec_w,
                      words["tgt_relations"][i])


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
