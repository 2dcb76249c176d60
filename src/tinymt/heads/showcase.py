"""The showcase sentence head by head: where each word looks, and which gold relation
that is.

For a run on the built-in corpus, the first showcase pair (我请李雷帮我订了去北京的机票。
/ I asked Li Lei to help me book a ticket to Beijing.) is fed teacher-forced through the
model; for every encoder self-attention head (source words) and decoder self-attention
head (target words) each word's most-attended word is taken, as the relation accuracy
does (:mod:`tinymt.heads.relations`: the word itself set aside), with the share of the
word's attention it got and the gold relation it realises, if any.
"""

from __future__ import annotations

import numpy as np
import torch

from tinymt.batching import eval_batches
from tinymt.corpus import SHOWCASE
from tinymt.corpus.relations import RELATIONS
from tinymt.data import normalize
from tinymt.heads.relations import attended_words
from tinymt.rundir import LoadedRun
from tinymt.words import piece_word_weights


def showcase_sides(data_cfg: dict) -> dict | None:
    """``{"src": (text, words, relations), "tgt": (...)}`` of the first showcase pair in
    the run's direction, or None when the run was not trained on the built-in corpus."""
    if not data_cfg or data_cfg.get("source") != "builtin":
        return None
    pair = SHOWCASE[0]
    sides = {"zh": (pair.zh, pair.zh_words, pair.zh_relations),
             "en": (pair.en, pair.en_words, pair.en_relations)}
    src, tgt = data_cfg.get("src_lang", "zh"), data_cfg.get("tgt_lang", "en")
    if data_cfg.get("reverse"):
        src, tgt = tgt, src
    return {"src": sides[src], "tgt": sides[tgt]}


@torch.inference_mode()
def showcase_links(run: LoadedRun, device) -> dict | None:
    """Per kind (``encoder_self``, ``decoder_self``): ``{"words", "attended" (L, h, n)
    (-1: none), "share" (L, h, n): the attended word's share of the query word's
    attention, "gold": {(query, key): relation name}}``; None off the built-in corpus."""
    sides = showcase_sides(run.config.get("data", {}) if isinstance(run.config, dict) else {})
    if sides is None:
        return None
    (src_text, src_words, src_rel), (tgt_text, tgt_words, tgt_rel) = sides["src"], sides["tgt"]
    src_ids = run.src_tokenizer.encode(normalize(src_text))
    tgt_ids = run.tgt_tokenizer.encode(normalize(tgt_text))
    (_, batch), = eval_batches([src_ids], [tgt_ids], 1 << 20)
    model = run.model
    was_training = model.training
    model.eval()
    try:
        batch = batch.to(device)
        _, attn = model(batch.src, batch.tgt_in, need_weights=True)
    finally:
        model.train(was_training)
    src_w = np.concatenate([piece_word_weights(run.src_tokenizer.pieces(src_ids), src_words),
                            np.zeros((1, len(src_words)))])  # + EOS
    tgt_w = np.concatenate([np.zeros((1, len(tgt_words))),  # BOS +
                            piece_word_weights(run.tgt_tokenizer.pieces(tgt_ids), tgt_words)])
    out = {}
    for kind, words, weights, rels in (("encoder_self", src_words, src_w, src_rel),
                                       ("decoder_self", tgt_words, tgt_w, tgt_rel)):
        a = torch.stack(attn[kind], 1)[0].float().cpu().numpy()  # (L, h, T, T)
        attended, share = attended_words(a, weights)  # (L, h, n) each
        gold = {}
        for r, d, h in rels:  # both directions: the query may be either end
            gold[(d, h)] = gold[(h, d)] = RELATIONS[r]
        out[kind] = {"words": list(words), "attended": attended, "share": share, "gold": gold}
    return out
