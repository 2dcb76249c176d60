"""The analysed sentences: the first pairs of one split of a run's data, as ids for the
model, texts for BLEU and (built-in corpus) piece -> word weights with gold alignments
and gold relations."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import OmegaConf

from tinymt.config import DataConfig
from tinymt.data import prepare, target_language
from tinymt.errors import TinyMTError
from tinymt.rundir import LoadedRun
from tinymt.words import piece_word_weights


@dataclass
class Sentences:
    """The analysed pairs: ids for the model, texts for BLEU, words for alignment."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    refs: list[str]
    words: dict | None  # see tinymt.heads.stats.attention_pass; None without gold alignments
    truncated: int = 0


def load_sentences(run: LoadedRun, split: str, max_sentences: int,
                   log) -> tuple[Sentences, str, str]:
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
    src_text, refs = ds["src"][:], ds["tgt"][:]
    max_len = run.model.max_positions - 1  # room for eos / bos
    src_ids = run.src_tokenizer.encode_batch(src_text)
    tgt_ids = run.tgt_tokenizer.encode_batch(refs)
    long = [len(s) > max_len or len(t) > max_len for s, t in zip(src_ids, tgt_ids)]
    src_ids = [s[:max_len] for s in src_ids]
    tgt_ids = [t[:max_len] for t in tgt_ids]
    words = None
    if {"src_words", "tgt_words", "alignment"} <= set(ds.column_names):
        words = _alignment_words(run, ds, src_ids, tgt_ids, long)
    d = run.config["data"]
    return (Sentences(src_ids, tgt_ids, refs, words, sum(long)), target_language(d),
            d.get("source", "?"))


def _alignment_words(run: LoadedRun, ds, src_ids, tgt_ids, long: list[bool]) -> dict:
    """``{"src_weights": [...], "tgt_weights": [...], "alignment": [...],
    "src_relations": [...], "tgt_relations": [...]}`` per sentence: piece -> word weights
    with a row of zeros for EOS, the gold links and the gold relation triples of each side
    (empty lists when the data has none); ``None`` for the sentences in ``long``
    (positions cut off: their alignment is incomplete)."""
    words: dict[str, list] = {"src_weights": [], "tgt_weights": [], "alignment": [],
                              "src_relations": [], "tgt_relations": []}
    n = len(src_ids)
    rels = {side: ds[side][:] if side in ds.column_names else [[]] * n
            for side in ("src_relations", "tgt_relations")}
    for s, t, sw, tw, al, src_rel, tgt_rel, too_long in zip(
            src_ids, tgt_ids, ds["src_words"][:], ds["tgt_words"][:], ds["alignment"][:],
            rels["src_relations"], rels["tgt_relations"], long):
        if too_long:
            for v in words.values():
                v.append(None)
            continue
        eos_src, eos_tgt = np.zeros((1, len(sw))), np.zeros((1, len(tw)))  # EOS: no word
        words["src_weights"].append(
            np.concatenate([piece_word_weights(run.src_tokenizer.pieces(s), sw), eos_src]))
        words["tgt_weights"].append(
            np.concatenate([piece_word_weights(run.tgt_tokenizer.pieces(t), tw), eos_tgt]))
        words["alignment"].append([tuple(a) for a in al])
        words["src_relations"].append([tuple(r) for r in src_rel])
        words["tgt_relations"].append([tuple(r) for r in tgt_rel])
    return words
