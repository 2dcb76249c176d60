"""The analysed sentences: the first pairs of one split of a run's data, as ids for the
model, texts for BLEU and (built-in corpus) piece -> word weights with gold alignments and
relations; and the first showcase pair (我请李雷帮我订了去北京的机票。 / I asked Li Lei to
help me book a ticket to Beijing.): each of its gold relations with the head that carries
it (:func:`showcase_links`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinymt.attention_maps import collect_attention
from tinymt.config import DataConfig, as_typed
from tinymt.corpus import SHOWCASE
from tinymt.data import normalize, prepare, source_language, target_language
from tinymt.errors import TinyMTError
from tinymt.labels import sentence_words, word_weights
from tinymt.relations import RELATION_KINDS, relation_heads
from tinymt.rundir import LoadedRun


@dataclass
class Sentences:
    """The analysed pairs: ids for the model, texts for BLEU, words for alignment."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    refs: list[str]
    words: dict | None  # tinymt.labels.sentence_words; None without gold alignments
    truncated: int = 0


def load_sentences(run: LoadedRun, split: str, max_sentences: int, log,
                   cache_dir: str | None = None) -> tuple[Sentences, str, str]:
    """``(sentences, target language, data source)``: the first ``max_sentences`` (0 = all)
    pairs of ``split`` of the run's data (rebuilt from its ``config["data"]`` in ``cache_dir``
    or its own, a cache hit normally), tokenized by its own tokenizers; too long ones
    truncated (no alignment)."""
    data_cfg = run.config.get("data")  # (a dict: the checkpoint loader checks it)
    if not data_cfg:
        raise TinyMTError(f"{run.checkpoint} holds no data config: cannot rebuild its "
                          "data split (was it written by tinymt's trainer?)")
    typed = as_typed(DataConfig, data_cfg, f"{run.checkpoint}: bad data config")
    typed.cache_dir = cache_dir or typed.cache_dir
    data = prepare(typed, log=log)
    ds = data.splits[split]
    ds = ds.select(range(min(max_sentences or len(ds), len(ds))))
    src_text, refs = ds["src"][:], ds["tgt"][:]
    src_ids, tgt_ids, words, cut = sentence_words(
        run.src_tokenizer, run.tgt_tokenizer, ds, run.src_tokenizer.encode_batch(src_text),
        run.tgt_tokenizer.encode_batch(refs), run.model.max_positions - 1)  # room for eos / bos
    return (Sentences(src_ids, tgt_ids, refs, words, cut), target_language(data_cfg),
            data_cfg.get("source", "?"))


def showcase_links(run: LoadedRun, device) -> dict | None:
    """The first showcase pair in the run's direction, per kind (``encoder_self``,
    ``decoder_self``): ``{"sentence", "words", "relations"}``, each gold relation with the
    head giving it the most weight (:func:`relation_heads`); None when the run was not
    trained on the built-in corpus."""
    data_cfg = run.config.get("data")
    if not data_cfg or data_cfg.get("source") != "builtin":
        return None
    pair = SHOWCASE[0]
    sides = {"zh": (pair.zh, pair.zh_words, pair.zh_relations),
             "en": (pair.en, pair.en_words, pair.en_relations)}
    src, tgt = source_language(data_cfg), target_language(data_cfg)
    src_ids = run.src_tokenizer.encode(normalize(sides[src][0]))
    tgt_ids = run.tgt_tokenizer.encode(normalize(sides[tgt][0]))
    attn = collect_attention(run.model, src_ids, tgt_ids, device)
    out = {}
    for kind, (text, words, rels), tok, ids, eos in (
            ("encoder_self", sides[src], run.src_tokenizer, src_ids, True),  # pieces + EOS
            ("decoder_self", sides[tgt], run.tgt_tokenizer, tgt_ids, False)):  # BOS + pieces
        out[kind] = {"sentence": text, "words": list(words), "relations": relation_heads(
            np.stack(attn[kind]), word_weights(tok, ids, words, eos), rels,
            RELATION_KINDS[kind])}  # (L, h, T, T), (T, n)
    return out
