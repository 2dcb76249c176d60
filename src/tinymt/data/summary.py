"""The numbers that describe prepared data (``PreparedData.stats``) and their table."""

from __future__ import annotations

import numpy as np

from tinymt.data.sources import SPLITS
from tinymt.tokenizer import UNK_ID


def side_stats(lens: np.ndarray, unk: int) -> dict:
    """One side of one split: mean / p95 / max token count (``lens``: each sentence's) and
    the % of unknown pieces (``unk`` of them)."""
    total = int(lens.sum())
    return {
        "mean": float(lens.mean()) if len(lens) else 0.0,
        "p95": float(np.percentile(lens, 95)) if len(lens) else 0.0,
        "max": int(lens.max()) if len(lens) else 0,
        "unk_pct": 100.0 * unk / total if total else 0.0,
    }


def count_unknown(ids: list[list[int]]) -> int:
    return sum(x.count(UNK_ID) for x in ids)


def summary_table(stats: dict) -> str:
    """A plain-text table of the prepared data: pairs, drops, lengths, unknowns."""
    header = (
        "split",
        "pairs",
        "empty",
        "max_len",
        "ratio",
        "src mean",
        "src p95",
        "tgt mean",
        "tgt p95",
        "src unk%",
        "tgt unk%",
    )
    rows = [header]
    for s in SPLITS:
        d, tok = stats["dropped"][s], stats["tokens"][s]
        rows.append(
            (
                s,
                str(stats["pairs"][s]),
                str(d.get("empty", 0)),
                str(d.get("max_len", 0)),
                str(d.get("max_len_ratio", 0)),
                f"{tok['src']['mean']:.1f}",
                f"{tok['src']['p95']:.0f}",
                f"{tok['tgt']['mean']:.1f}",
                f"{tok['tgt']['p95']:.0f}",
                f"{tok['src']['unk_pct']:.2f}",
                f"{tok['tgt']['unk_pct']:.2f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    v = stats["vocab_size"]
    vocab = f"{v['src']} joint" if stats["joint_vocab"] else f"{v['src']} src / {v['tgt']} tgt"
    top = [
        f"data: {stats['source']}",
        (
            f"vocabulary: {vocab} pieces; tokens per sentence (no bos/eos); "
            "empty/max_len/ratio = pairs dropped by each filter (length filters: train only)"
        ),
    ]
    bottom = [
        f"cache: {stats.get('cache_dir', '?')} ({'hit' if stats.get('cache_hit') else 'built'})"
    ]
    return "\n".join(top + lines + bottom)
