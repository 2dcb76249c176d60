"""Validation and what the trainer writes to TensorBoard about it.

:func:`validate` gives teacher-forced loss / perplexity on a whole split and sacreBLEU /
chrF of greedy (or beam) translations of ``limit`` sentences spread evenly over it (in a
source listed by length, as Tatoeba's is, the first ``limit`` would be the shortest and the
score too kind); under torchrun each rank does a share and the results are gathered.
:func:`log_validation` writes the numbers, source/reference/hypothesis samples, every
head's attention of the probe sentences (as view documents for the Attention tab,
:mod:`tinymt.viewer`, with every head's label measured on the first
:data:`LABEL_SENTENCES` validation pairs, :mod:`tinymt.labels`; and as PNG grids) and each
head's mean attention entropy.
"""

from __future__ import annotations

import math
import time

import torch
from omegaconf import DictConfig
from torch.utils.tensorboard import SummaryWriter

from tinymt import KINDS, runtime
from tinymt.attention_maps import attention_figures, collect_attention
from tinymt.batching import eval_batches
from tinymt.corpus import SHOWCASE
from tinymt.corpus.dictionary import HELD_OUT, WORDS
from tinymt.corpus.pair import join_english
from tinymt.data import PreparedData, normalize, target_language
from tinymt.decoding import translate_ids
from tinymt.labels import LabelSample, frame_labels, label_sample, sentence_words
from tinymt.loss import sequence_loss
from tinymt.metrics import score
from tinymt.plotting import figure_to_array
from tinymt.viewer.document import GOLD_COLUMNS, Probe, build_document, probe_from_pair
from tinymt.viewer.summary import probe_summary

LABEL_SENTENCES = 64  # the validation pairs every frame's head labels are measured on


@torch.inference_mode()
def validate(model, cfg: DictConfig, data: PreparedData, split: str, rt: runtime.Runtime,
             limit: int = 0, beam: int = 1) -> dict:
    """Teacher-forced loss/ppl on the whole split, BLEU/chrF of translations of ``limit``
    sentences spread evenly over it (0 = all); with the built-in corpus's test split, the
    share of :func:`held_out_words` translated exactly."""
    model.eval()
    ds = data.splits[split]
    limit_len = cfg.model.max_positions - 1  # valid/test are never length-filtered: clip
    src_ids, tgt_ids = ([x[:limit_len] for x in side] for side in data.ids(split))
    n = len(src_ids)
    losses, tok = [torch.zeros((), device=rt.device)], 0  # summed losses: read at once
    batches = eval_batches(src_ids, tgt_ids, cfg.trainer.max_tokens)
    for _, batch in batches[rt.rank::rt.world_size]:  # each rank a share of the batches
        tok += batch.n_tgt_tokens  # counted on the host
        batch = batch.to(rt.device)
        with runtime.autocast(rt.device, rt.autocast_dtype):
            hidden, _ = model(batch.src, batch.tgt_in)  # (B, T, d)
            losses.append(sequence_loss(hidden, model.output_proj.weight, batch.tgt_out,
                                        model.pad_id))
    loss_sum, tok = runtime.all_reduce(rt, [sum(torch.stack(losses).tolist()), tok])
    k = n if not limit else min(limit, n)
    keep = [i * n // k for i in range(k)]  # k indices evenly spaced over the split, increasing
    mine = keep[rt.rank::rt.world_size]
    with runtime.autocast(rt.device, rt.autocast_dtype):
        outs = translate_ids(model, [src_ids[i] for i in mine], beam=beam,
                             max_len_a=1.5, max_len_b=cfg.trainer.valid_max_len_b,
                             device=rt.device, batch_tokens=cfg.trainer.max_tokens)
    hyps_mine = [data.tgt_tokenizer.decode(o[0][0]) for o in outs]
    gathered = runtime.all_gather_objects(rt, list(zip(mine, hyps_mine)))
    by_index = dict(pair for part in gathered for pair in part)
    hyps = [by_index[i] for i in keep]
    tgt_text, src_text = ds["tgt"][:], ds["src"][:]
    refs = [tgt_text[i] for i in keep]
    bleu, chrf, sig = score(hyps, refs, target_language(cfg.data))
    loss = loss_sum / max(tok, 1)
    words = held_out_words(model, data, rt, beam) if split == "test" and \
        cfg.data.source == "builtin" and cfg.data.src_lang == "zh" else None  # (zh -> en)
    return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": bleu, "chrf": chrf,
            "signature": sig, "hyps": hyps, "refs": refs, "srcs": [src_text[i] for i in keep],
            "held_out_words": words}


@torch.inference_mode()
def held_out_words(model, data: PreparedData, rt: runtime.Runtime, beam: int = 1) -> float:
    """The share of the built-in lexicon's held-out words (:data:`HELD_OUT`: only ever seen
    inside sentences) that ``model`` translates alone exactly as the lexicon does."""
    words = sorted(HELD_OUT)
    outs = translate_ids(model.eval(), [data.src_tokenizer.encode(w) for w in words],
                         beam=beam, device=rt.device)
    return sum(data.tgt_tokenizer.decode(o[0][0]) == join_english(WORDS[w])
               for w, o in zip(words, outs)) / len(words)


def probe_sentences(cfg: DictConfig, data: PreparedData) -> list[Probe]:
    """Sentences whose every head is drawn at every validation: the configured ones (the
    model's own translation is forced), the built-in corpus's showcase sentences (zh→en)
    and the first ``n_probes`` of valid (their references are forced, with the gold words
    where the corpus has them)."""
    probes = [Probe(s) for s in cfg.trainer.probe_sentences]
    if cfg.data.source == "builtin" and not cfg.data.reverse:
        probes += [probe_from_pair(pair) for pair in SHOWCASE]
    valid = data.splits["valid"]
    n = min(cfg.trainer.n_probes, len(valid))
    gold = {c: valid[c][:n] for c in GOLD_COLUMNS if c in valid.column_names}
    for i, (src, tgt) in enumerate(zip(valid["src"][:n], valid["tgt"][:n])):
        probes.append(Probe(src, tgt, **{c: gold[c][i] for c in gold}))
    return probes


def label_sentences(cfg: DictConfig, data: PreparedData) -> LabelSample | None:
    """The first :data:`LABEL_SENTENCES` validation pairs (None without any), with their
    gold words where the data has them: every frame labels the heads on them."""
    valid = data.splits["valid"]
    n = min(LABEL_SENTENCES, len(valid))
    src, tgt = data.ids("valid")
    return label_sample(*sentence_words(
        data.src_tokenizer, data.tgt_tokenizer, valid.select(range(n)),
        [src[i] for i in range(n)], [tgt[i] for i in range(n)],
        cfg.model.max_positions - 1)[:3]) if n else None


def log_validation(writer: SummaryWriter, model, cfg: DictConfig, data: PreparedData,
                   metrics: dict, probes: list[Probe], rt: runtime.Runtime, step: int,
                   sample: LabelSample | None = None) -> None:
    for name in ("loss", "ppl", "bleu", "chrf"):
        writer.add_scalar(f"valid/{name}", metrics[name], step)
    k = cfg.trainer.n_text_samples
    rows = ["| source | reference | hypothesis |", "| --- | --- | --- |"]
    rows += [f"| {s} | {r} | {h} |" for s, r, h in
             zip(metrics["srcs"][:k], metrics["refs"][:k], metrics["hyps"][:k])]
    writer.add_text("samples", "\n".join(rows), step)
    return log_probes(writer, model, cfg, data, probes, rt, step, sample)


def log_probes(writer, model, cfg, data, probes: list[Probe], rt, step, sample=None,
                full=True) -> None:
    """Every head of every probe: the view document for the Attention tab (each head's
    label on ``sample`` in it; its maps, entropy and gold share at every frame), and at a
    validation (``full``) the PNG grids for the Images tab (``trainer.attention_images``).
    A probe with a reference is teacher-forced on it (the axes stay put from step to
    step). What the logging costs is logged too (``logging/*``: seconds, bytes;
    ``probe_seconds``: all of it but the PNG grids). Returns the labels
    ``{kind: [layer][head]}`` ({} without a sample)."""
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
    cap = cfg.model.max_positions - 1
    start = time.perf_counter()
    labels = frame_labels(model, sample, rt.device) if sample is not None else {}
    cost = {"attention_view_seconds": 0.0, "attention_view_bytes": 0,
            "attention_png_seconds": 0.0, "head_label_seconds": time.perf_counter() - start}
    sources = [src_tok.encode(normalize(probe.sentence))[:cap] for probe in probes]
    outs = [o[0][0] for o in translate_ids(model, sources, beam=1, device=rt.device,
                                           max_len_b=cfg.trainer.valid_max_len_b)]  # one batch
    for p, (probe, ids, out) in enumerate(zip(probes, sources, outs)):
        translation = tgt_tok.decode(out)
        forced = tgt_tok.encode(normalize(probe.reference))[:cap] \
            if probe.reference is not None else out
        attn = collect_attention(model, ids, forced, rt.device)
        t0 = time.perf_counter()
        doc = build_document(attn, src_tok.pieces(ids), tgt_tok.pieces(forced), probe,
                             translation, step, forced_reference=probe.reference is not None)
        for kind in labels.keys() & doc["kinds"].keys():
            doc["kinds"][kind]["labels"] = labels[kind]
        summary = probe_summary(f"probe_{p}", doc, probe.sentence, probe.reference)
        writer._get_file_writer().add_summary(summary, step)
        t1 = time.perf_counter()
        cost["attention_view_seconds"] += t1 - t0
        if full and cfg.trainer.attention_images:
            for tag, fig in attention_figures(attn, src_tok, tgt_tok, ids, forced, kinds=KINDS,
                                              title=probe.sentence):
                kind, layer = tag.split("/")
                writer.add_image(f"attention/{kind}/{layer}/probe_{p}", figure_to_array(fig),
                                 step, dataformats="HWC")
            cost["attention_png_seconds"] += time.perf_counter() - t1
        cost["attention_view_bytes"] += summary.ByteSize()
    cost["probe_seconds"] = time.perf_counter() - start - cost["attention_png_seconds"]
    for name, value in cost.items():
        writer.add_scalar(f"logging/{name}", value, step)
    return labels
