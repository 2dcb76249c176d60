"""What each head does, in a word: the statistics of its attention rows, the label they
give (:func:`head_labels`) and, at every probe frame of a run, the label measured on a
fixed sample of validation sentences (:func:`frame_labels`).

Row statistics (:func:`add_rows`), per head, summed over the non-padding query rows: the
entropy (nats), the distance from the diagonal ``sum_j w_ij |j - j*_i| / T_k`` with ``j*_i
= (i + 1/2) T_k / T_q - 1/2`` (``j* = i`` for self-attention), the mass on the *sink*
(``</s>``; ``<s>`` in the decoder's self-attention: where a head with nothing to do rests)
and, for self-attention, the mass on the offsets -1 / 0 / +1 and the mean signed offset;
:meth:`AttentionStats.means` turns them into means (the offsets, the sink and the entropy
relative to the uniform's over the rows with more than one key: not the decoder's BOS row).

A frame's label (:func:`frame_labels`, teacher-forced on a sample; each label is
``"<label> · <what was measured>"``): a relation (``object ← 0.62``), the :data:`PLACES` a
cross head reads (``aligned 0.73, </s> 0.17``) or the position (:func:`head_labels`); the
rules: docs/viewer.md's table of labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tinymt import KINDS
from tinymt.batching import Batch, eval_batches
from tinymt.metrics import attention_entropy
from tinymt.relations import (
    MARGIN,
    MIN_INSTANCES,
    RELATION_KINDS,
    RelationCounts,
    relation_summary,
    row_label,
)
from tinymt.runtime import eval_mode
from tinymt.words import piece_word_weights

POSITIONAL_MASS = 0.5  # "previous" etc.: this much mass on one position
BROAD_ENTROPY = 0.8  # "diffuse": entropy this fraction of the uniform's
# statistics averaged over the query rows with more than one key to choose from
_CHOICE_ROW_STATS = frozenset({"norm_entropy", "offset", "prev", "same", "next", "sink"})
_OFFSETS = ((-1, "prev", "previous", "the previous token"), (0, "same", "self", "itself"),
            (1, "next", "next", "the next token"))
# where a cross-attention head's weight goes in a row with gold-aligned source pieces: on
# them, on the piece just before or after them, on </s>; else elsewhere (each cell counts
# in its first place)
PLACES = {"aligned": "the gold-aligned source pieces", "before": "the piece before them",
          "after": "the piece after them", "</s>": "</s>", "elsewhere": "anything else"}


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
    sink = (torch.zeros_like(k_len) if causal else k_len - 1).view(B, 1, 1, 1)  # <s> / </s>
    per_row = {"entropy": ent, "norm_entropy": ent / n_keys.clamp_min(2).log()[:, None, :],
               "distance": (w * dist[:, None]).sum(-1),
               "sink": w.gather(-1, sink.expand(B, w.shape[1], T_q, 1))[..., 0]}  # (B, h, T_q)
    if kind in RELATION_KINDS:  # self-attention
        rel = j - i  # (T_q, T_k) key offset from the query
        per_row["offset"] = (w * rel).sum(-1)
        for off, name, _, _ in _OFFSETS:
            per_row[name] = (w * (rel == off)).sum(-1)
    sums = {name: (v * (multi if name in _CHOICE_ROW_STATS else q_real)[:, None, :].float()
                   ).sum((0, 2)) for name, v in per_row.items()}
    return sums, int(q_real.sum()), int(multi.sum())


def add_rows(stats: AttentionStats, attn: dict[str, list[torch.Tensor]], batch: Batch) -> None:
    """One batch's attention (the model's ``need_weights`` output) into ``stats``."""
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


def attention_batches(model, batches, device, stats: AttentionStats, arrays: bool = True):
    """Each ``(idx, batch)`` of ``batches`` teacher-forced through ``model``, its rows added
    to ``stats``; with ``arrays``, yielded as ``idx``, the attention ``{kind: (B, L, h, T_q,
    T_k)}`` in numpy and the unpadded lengths ``(B,)`` of the source (EOS included) and of the
    target (BOS included). Draw it to the end even without: that fills ``stats``."""
    with eval_mode(model, inference=True):
        for idx, batch in batches:
            batch = batch.to(device)
            _, attn = model(batch.src, batch.tgt_in, need_weights=True)
            add_rows(stats, attn, batch)
            if arrays:
                found = {k: torch.stack(attn[k], 1).float().cpu().numpy() for k in KINDS}
                yield idx, found, (~batch.src_pad_mask).sum(1), (~batch.tgt_pad_mask).sum(1)


def head_labels(means: dict[str, np.ndarray], kind: str, detail: bool = False) -> list[list[str]]:
    """A word per head ``[layer][head]``: previous / self / next (self-attention with at
    least :data:`POSITIONAL_MASS` of its mass on that offset), ``</s>`` (``<s>``: as much on
    the sink), diffuse (entropy at least :data:`BROAD_ENTROPY` of
    the uniform's) or content; with ``detail``, ``"<word> · <its numbers>"``."""
    sink = "<s>" if kind == "decoder_self" else "</s>"
    where = [(means[key], name, text) for _, key, name, text in _OFFSETS
             if kind in RELATION_KINDS] + [(means["sink"], sink, sink)]

    def label(layer: int, h: int) -> str:
        mass, name, text = max(((m[layer, h], n, t) for m, n, t in where), key=lambda x: x[0])
        ent = means["norm_entropy"][layer, h]
        if mass >= POSITIONAL_MASS:
            return f"{name} · {mass:.2f} of its attention on {text}"
        if ent >= BROAD_ENTROPY:
            return f"diffuse · entropy {ent:.2f} of the uniform's"
        return f"content · entropy {ent:.2f} of the uniform's, at most {mass:.2f} on one " \
               "position"

    n_layers, n_heads = means["entropy"].shape
    return [[label(layer, h) if detail else label(layer, h).split(" · ")[0]
             for h in range(n_heads)] for layer in range(n_layers)]


# ----------------------------------------------------------------------------- sentences
def word_weights(tokenizer, ids, words, eos: bool) -> np.ndarray:
    """:func:`piece_word_weights` of ``ids`` with a row of zeros (no word) for the EOS after
    them (``eos``) or the BOS before them."""
    weights = piece_word_weights(tokenizer.pieces(ids), words)
    none = np.zeros((1, len(words)))
    return np.concatenate([weights, none] if eos else [none, weights])


def sentence_words(src_tok, tgt_tok, ds, src_ids, tgt_ids, max_len: int
                   ) -> tuple[list, list, dict | None, int]:
    """``(src_ids, tgt_ids, words, cut)``: the ids of the pairs of split ``ds`` within
    ``max_len`` a side, their gold words (None without: only the built-in corpus has them)
    and how many pairs were cut. ``words``: ``{"src_weights", "tgt_weights", "alignment",
    "src_relations", "tgt_relations"}``, one entry per pair: piece -> word weights with a
    row of zeros for EOS, the gold links, the gold relation triples of each side; None
    for a cut pair (its alignment is incomplete)."""
    long = [len(s) > max_len or len(t) > max_len for s, t in zip(src_ids, tgt_ids)]
    src_ids, tgt_ids = [list(s[:max_len]) for s in src_ids], [list(t[:max_len]) for t in tgt_ids]
    if not {"src_words", "tgt_words", "alignment"} <= set(ds.column_names):
        return src_ids, tgt_ids, None, sum(long)
    words = {f"{side}_weights": [None if cut else word_weights(tok, ids, w, eos=True)
                                 for ids, w, cut in zip(side_ids, ds[f"{side}_words"][:], long)]
             for side, tok, side_ids in (("src", src_tok, src_ids), ("tgt", tgt_tok, tgt_ids))}
    for col in ("alignment", "src_relations", "tgt_relations"):
        words[col] = [None if cut else [tuple(x) for x in v] for v, cut in zip(ds[col][:], long)]
    return src_ids, tgt_ids, words, sum(long)


# ----------------------------------------------------------------------------- frames
@dataclass
class LabelSample:
    """The sentences every frame's labels are measured on (:func:`label_sample`):
    length-sorted batches ``[(indices, Batch)]``, their gold words (:func:`sentence_words`,
    or None) and per batch the cross-attention cells of each place but elsewhere, in the
    rows with gold-aligned cells ``(B, len(PLACES) - 1, T, S)``."""

    batches: list[tuple[list[int], Batch]]
    words: dict | None = None
    places: list[np.ndarray] = field(default_factory=list)


def label_sample(src_ids, tgt_ids, words: dict | None, batch_tokens: int = 600) -> LabelSample:
    """The sample of ``src_ids`` / ``tgt_ids`` (each within the model's positions), with
    ``words`` as :func:`sentence_words` gives them; batches of ``batch_tokens`` (padding
    costs: 600 halves the time of one batch of 64 sentences)."""
    batches = eval_batches(src_ids, tgt_ids, batch_tokens)
    if words is None:
        return LabelSample(batches)
    places = []
    for idx, batch in batches:
        cells = np.zeros((len(idx), len(PLACES) - 1, batch.tgt_out.shape[1], batch.src.shape[1]))
        for b, i in enumerate(idx):
            src_w, tgt_w, links = (words[k][i] for k in ("src_weights", "tgt_weights", "alignment"))
            if src_w is not None and links:
                gold = np.zeros((tgt_w.shape[1], src_w.shape[1]))
                gold[[t for _, t in links], [s for s, _ in links]] = 1
                a = tgt_w @ gold @ src_w.T > 0  # (T, S): aligned; column S - 1 is </s>
                before = np.pad(a[:, 1:], ((0, 0), (0, 1))) & ~a
                after = np.pad(a[:, :-1], ((0, 0), (1, 0))) & ~a & ~before
                sink = np.arange(a.shape[1]) == a.shape[1] - 1
                cells[b, :, :len(tgt_w), :len(src_w)] = np.stack(
                    [a, before, after, sink & ~a & ~before & ~after]) & a.any(1, keepdims=True)
        places.append(cells)
    return LabelSample(batches, words, places)


def frame_labels(model, sample: LabelSample, device) -> dict[str, list[list[str]]]:
    """Every head's label ``{kind: [layer][head]}`` (module docstring) on ``sample``,
    teacher-forced, batch by batch."""
    stats, counts = AttentionStats(), None
    mass, n_rows = 0.0, 0  # cross-attention: the weight on each place, of n_rows rows
    for k, (idx, arrays, n_src, n_tgt) in enumerate(attention_batches(
            model, sample.batches, device, stats, arrays=sample.words is not None)):
        counts = counts or RelationCounts({kind: arrays[kind].shape[1:3] for kind in KINDS})
        for b, i in enumerate(idx):
            if sample.words["src_weights"][i] is not None:
                counts.add_sentence(arrays, b, sample.words, i, int(n_src[b]), int(n_tgt[b]))
        places = sample.places[k]  # (B, places, T, S)
        mass = mass + np.einsum("blhts,bpts->lhp", arrays["cross"], places)
        n_rows += int(places[:, 0].any(-1).sum())
    means = stats.means()
    labels = {kind: head_labels(m, kind, detail=True) for kind, m in means.items()}
    if counts is not None:
        _relation_labels(labels, relation_summary(counts), means)
    for (layer, h), _ in np.ndenumerate(mass[..., 0] if n_rows else []):
        share = dict(zip(PLACES, [*mass[layer, h] / n_rows,
                                  max(0.0, 1 - mass[layer, h].sum() / n_rows)]))
        order = sorted(share, key=share.get, reverse=True)  # the first, then the first named
        top = order[:1] + [p for p in order[1:] if p != "elsewhere"][:1]
        labels["cross"][layer][h] = ", ".join(f"{p} {share[p]:.2f}" for p in top) + " · " + \
            ", ".join(f"{v:.2f} on {PLACES[p]}" for p, v in share.items()) + \
            f" · over {n_rows} target pieces with gold-aligned source words"
    return labels


def _relation_labels(labels: dict, summary: dict, means: dict) -> None:
    """A self-attention head that beats a relation's baseline (``summary``:
    :func:`relation_summary`'s): that relation's label (the largest margin), unless it is
    diffuse (the word it attends to most is then a matter of ties: a uniform decoder head
    "finds" every subject at the sentence's start)."""
    for kind, found in summary.items():
        # each head's largest margin so far; a diffuse head is never named by a relation
        best = np.where(means[kind]["norm_entropy"] < BROAD_ENTROPY, -np.inf, np.inf)
        for row in found["rows"]:
            base = row["baseline"]
            if row["instances"] < MIN_INSTANCES:
                continue
            for (layer, h), a in np.ndenumerate(row["accuracy"]):
                if a >= base + MARGIN and a - base > best[layer, h]:
                    best[layer, h] = a - base
                    labels[kind][layer][h] = (
                        f"{row_label(row)} {a:.2f} · accuracy {a:.2f} over "
                        f"{row['instances']} instances · baseline {base:.2f}: the word at "
                        f"offset {row['baseline_offset']:+d}")
