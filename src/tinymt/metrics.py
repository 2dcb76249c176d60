"""The numbers we report, each computed in one place (the loss: :mod:`tinymt.loss`).

- :func:`score`: corpus sacreBLEU and chrF of detokenized hypotheses.
- :func:`attention_entropy`: the entropy (nats) of attention rows.
"""

from __future__ import annotations

import numpy as np
import sacrebleu
import torch


def score(hyps: list[str], refs: list[str], tgt_lang: str) -> tuple[float, float, str]:
    """Corpus sacreBLEU (tokenized ``zh`` for Chinese, else ``13a``) and chrF of ``hyps``
    against ``refs``, and the BLEU signature."""
    bleu = sacrebleu.metrics.BLEU(tokenize="zh" if tgt_lang.startswith("zh") else "13a")
    b = bleu.corpus_score(hyps, [refs])
    c = sacrebleu.metrics.CHRF().corpus_score(hyps, [refs])
    return b.score, c.score, str(bleu.get_signature())


def attention_entropy(weights):
    """Entropy (nats) of each attention row: ``(..., T_key) -> (...)``, of a numpy array
    or a tensor (the same kind back); zero weights add nothing."""
    if isinstance(weights, torch.Tensor):
        return -(weights * weights.clamp_min(1e-12).log()).sum(-1)
    return -(weights * np.log(np.clip(weights, 1e-12, 1.0))).sum(-1)
