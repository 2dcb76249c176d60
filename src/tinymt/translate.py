"""Translate with a trained run: ``translate(cfg)``.

Input comes from the command line's sentences, a file (``input=``) or stdin; every line is
normalised as the training text was (:func:`tinymt.data.normalize`), decoded in
length-sorted batches and written one line per input line. ``ref=`` scores the result,
``attention=`` draws every head's map as PNG (:mod:`tinymt.attention_maps`) or writes the
interactive view of every sentence as one page (``attention=maps.html``). ``engine=ct2``
decodes an export with CTranslate2 (:func:`tinymt.ct2.translate_export_ids`); all around the
decoding step is this module's, the same for both engines.
"""

from __future__ import annotations

import bisect
import functools
import io
import itertools
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib.image
import numpy as np
import torch

from tinymt.attention_maps import attention_figures, collect_attention
from tinymt.batching import collate
from tinymt.config import attention_file, check_translate
from tinymt.ct2 import LoadedExport, export_attention, load_export, translate_export_ids
from tinymt.data import capped_lines, normalize, read_lines, source_language, target_language
from tinymt.decoding import translate_ids
from tinymt.errors import TinyMTError
from tinymt.files import check_outputs, write_bytes, write_text
from tinymt.loss import sequence_loss
from tinymt.metrics import score
from tinymt.plotting import figure_to_array
from tinymt.rundir import LoadedRun, load_run
from tinymt.runtime import pick_batch_tokens, pick_device
from tinymt.text import TAG, UNSPACED, assemble, mask_spans, plan, unsure
from tinymt.viewer.document import translation_document
from tinymt.viewer.html import html_page


def _parts(word: str) -> tuple[str, str, str]:
    """An output word's punctuation before, the word, its punctuation after (a scan: the
    regex ``(\\W*)(.*?)(\\W*)`` would backtrack, quadratic in a long run of punctuation)."""
    at = [i for i, c in enumerate(word) if c.isalnum() or c == "_"]  # what \w matches
    return (word, "", "") if not at else (word[:at[0]], word[at[0]:at[-1] + 1], word[at[-1] + 1:])


PIPE_LINES = 1000  # lines of a pipe decoded together (length-sorted batches), then printed


# ----------------------------------------------------------------------------- translate
def translate(cfg, sentences: Sequence[str] = (), stdin=None, stdout=None, warn=None) -> dict:
    """Translate ``sentences`` (or ``cfg.input``, or stdin) with a run (``engine=ct2``: an
    export): one output line per input line (``nbest > 1``: ``nbest`` lines
    ``score<TAB>translation`` and a blank line). ``output=`` is published whole (a failure
    keeps the old file). Returns ``{"translations": [...], "bleu": ..., "chrf": ...}``."""
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    check_translate(cfg)
    check_outputs(("output", cfg.output), ("attention", attention_file(cfg.attention)))
    run, device = load_translator(cfg)
    if sentences and cfg.input:
        raise TinyMTError(f"both input={cfg.input} and sentences on the command line: give one")
    refs = read_lines(cfg.ref) if cfg.ref else None
    stdin = stdin or sys.stdin or io.StringIO()  # (a closed stdin: no lines)
    stdin_lines = capped_lines(getattr(stdin, "buffer", stdin), "stdin")  # read when used
    out_f = io.StringIO() if cfg.output else stdout or sys.stdout
    translations, shown = [], []  # shown: the attention maps so far (view documents, PNGs)
    if sentences or cfg.input:
        lines = _arguments(sentences) if sentences else read_lines(cfg.input)
        _check_ref_count(cfg.ref, refs, len(lines))  # before any work
        translations = _translate_lines(run, lines, cfg, warn, out_f, device, shown=shown)
    else:  # stdin: each typed line answered at once, a pipe PIPE_LINES at a time (its memory)
        typed = stdin.isatty() and not cfg.output
        if typed:
            print("type a sentence, Ctrl-D to end", file=sys.stderr)
        chunks = iter(lambda: list(itertools.islice(stdin_lines, 1 if typed else PIPE_LINES)), [])
        for chunk in chunks:
            translations += _translate_lines(run, chunk, cfg, warn, out_f, device,
                                             first_line=len(translations) + 1, shown=shown)
            out_f.flush()
    if cfg.attention and not shown:
        warn(f"attention={cfg.attention}: no sentence to draw")
    _check_ref_count(cfg.ref, refs, len(translations))  # (stdin: counted as read)
    if cfg.output:
        write_text(out_f.getvalue(), cfg.output)
    result = {"translations": translations, "engine": cfg.engine}
    if isinstance(run, LoadedExport):
        result["model"] = str(run.path)
    else:
        result.update(run_dir=str(run.run_dir), checkpoint=str(run.checkpoint))
    if refs is not None:
        bleu, chrf, sig = score(translations, refs, target_language(run.config.get("data", {})))
        print(f"BLEU {bleu:.2f}  chrF {chrf:.2f}  ({sig})", file=sys.stderr)
        result.update(bleu=bleu, chrf=chrf, signature=sig)
    return result


def _check_ref_count(ref: str | None, refs: list[str] | None, n_inputs: int) -> None:
    if refs is not None and len(refs) != n_inputs:  # before output= is touched
        raise TinyMTError(f"ref={ref} has {len(refs)} lines but the input has {n_inputs}")


def _arguments(sentences: Sequence[str]) -> list[str]:
    """Command-line sentences; an argument that is not valid UTF-8 (Python keeps its bytes
    as surrogates) is a one-line error."""
    for n, s in enumerate(sentences, 1):
        if any("\ud800" <= c <= "\udfff" for c in s):  # what UTF-8 cannot encode
            raise TinyMTError(f"argument {n} is not valid UTF-8")
    return list(sentences)


def load_translator(cfg, threads: int = 0) -> tuple[LoadedRun | LoadedExport, object]:
    """``(model, torch device)`` that ``cfg`` names: a run's checkpoint (``engine=torch``) or
    an export (``engine=ct2``; the device is then CTranslate2's, returned as None).
    ``threads``: CTranslate2's intra-op threads (0 = its default); torch's are the process's."""
    if cfg.engine == "ct2":
        return load_export(cfg.model_dir, cfg.device, threads), None
    device = pick_device(cfg.device)
    return load_run(cfg.run, cfg.checkpoint, device, cfg.outputs_root), device


def source_ids(run: LoadedRun | LoadedExport, sentences: Sequence[str], warn=None,
               lines: dict[int, int] | None = None, copy: bool = True
               ) -> tuple[list[tuple[str, list[tuple[int, int, str]]]], list[list[int]]]:
    """``(masked, ids)``: each sentence normalised as the training text was, what its source
    vocabulary cannot spell masked (:func:`tinymt.text.mask_spans`; ``masked``: the text,
    its spans, none with ``copy`` off, and its tags' stand-ins), and encoded. A sentence
    longer than the model takes is cut to fit (``warn``, when given, names its input line:
    ``lines``, by the sentence's index)."""
    tok = run.src_tokenizer
    max_positions = run.max_positions if isinstance(run, LoadedExport) else \
        run.model.max_positions
    max_src = max_positions - 1  # room for eos
    masked, ids = [], []
    spells = functools.cache(lambda span: tok.unk_id not in tok.encode(span))  # (repeated)
    for n, sentence in enumerate(map(normalize, sentences)):
        masked.append(mask_spans(sentence, spells if copy else None))
        toks = tok.encode(masked[-1][0])
        if len(toks) > max_src and warn is not None:
            warn(f"line {lines[n]}: a sentence of {len(toks)} tokens, longer than the model's "
                 f"maximum {max_src}: translated after truncation")
        ids.append(toks[:max_src])
    return masked, ids


def copy_spans(run: LoadedRun | LoadedExport, masked: tuple[str, list, list],
               src: Sequence[int], out: Sequence[int], device) -> str:
    """``out`` as text, each span of the masked sentence missing there in place of the output
    word that attends to it most (``attn``, (T_out, T_src): the last layer's cross-attention
    heads averaged, as CTranslate2's alignment heads): Luong et al. (2015)'s unknown-word
    replacement, the word replaced whole, its punctuation kept; and each inline element's
    stand-ins (:data:`tinymt.text.TAGS`) around the output words that read its words most
    (:func:`_place_tags`)."""
    sentence, spans, marks = masked
    text = run.tgt_tokenizer.decode(out)
    missing = [span for span in spans if span[2] not in text]
    if not (missing or marks) or not out:  # (no word to replace or wrap)
        return " ".join([text, *(s[2] for s in missing)]).strip() + "".join(m for _, m in marks)
    attn = export_attention(run, src, out) if isinstance(run, LoadedExport) else \
        collect_attention(run.model, src, out, device)["cross"][-1].mean(0)[:len(out), :len(src)]
    at = [0, *itertools.accumulate(len(c.encode()) for c in sentence)]  # char -> byte offset
    pieces = run.src_tokenizer.sp.encode(sentence, return_type="proto").pieces[:len(src)]
    unspaced = target_language(run.config.get("data", {})) in UNSPACED
    words: list[list[int]] = []  # output positions, a word each (a piece: Chinese)
    for i, piece in enumerate(run.tgt_tokenizer.pieces(out)):
        if not words or unspaced or piece.startswith("▁"):
            words.append([])
        words[-1].append(i)
    texts = [run.tgt_tokenizer.decode([out[i] for i in w]).strip() for w in words]
    by_word = np.stack([attn[w].sum(0) for w in words])  # (words, source pieces)
    reads = by_word.argmax(1)  # the source piece each word reads most
    # the attention of each word to the pieces before each piece: a range's in two lookups
    before = np.pad(by_word.astype(np.float64).cumsum(1), ((0, 0), (1, 0)))  # (words, 1 + pieces)
    begins, ends = [p.begin for p in pieces], [p.end for p in pieces]  # (bytes, in order)

    def cols(a: int, b: int) -> range:  # the source pieces of characters a..b
        return range(bisect.bisect_right(ends, at[a]), bisect.bisect_left(begins, at[b]))

    def most(c: range, none: int) -> int:  # the word reading the pieces c most
        return int((before[:, c.stop] - before[:, c.start]).argmax()) if c else none
    replaced: dict[int, list[str]] = {}  # word -> the spans in its place (a second: beside)
    for start, end, written in missing:  # (a span cut off with the sentence's tail: at the end)
        replaced.setdefault(most(cols(start, end), len(texts)), []).append(written)
    texts += [""] if len(texts) in replaced else []
    for w, spans in replaced.items():
        lead, _, trail = _parts(texts[w])
        texts[w] = lead + " ".join(spans) + trail

    def readers(a: int, b: int) -> list[int]:  # the words reading characters a..b most
        c = cols(a, b)  # (consecutive pieces; none past those the model read: the last word)
        return np.flatnonzero((reads >= c.start) & (reads < c.stop)).tolist() or [most(c, -1)]
    return ("" if unspaced else " ").join(
        t for t in _place_tags(texts, marks, len(sentence), readers) if t)


def _place_tags(texts: list[str], marks: list[tuple[int, str]], n: int, readers) -> list[str]:
    """The output words ``texts`` with the stand-ins ``marks`` (``(offset, stand-in)`` in a
    source sentence of ``n`` characters) put in: an element's start tag before the first of the
    words reading its characters most (``readers(a, b)``: word indices), its end tag after the
    last, inside their punctuation; at the source's start or end, at the output's; a tag whose
    partner is in another sentence as if that stood at this one's end (start). Where the tags
    would cross (the words reordered), they go around the whole sentence in their order (the
    input's nesting): up to the last start tag before it, the rest after."""
    where = {m: o for o, m in marks}
    pre, post = [[] for _ in texts], [[] for _ in texts]
    first, last, spot = [], [], {}  # spot: where each start tag went
    for offset, mark in marks:
        opens = (ord(mark) - TAG) % 2 == 0
        partner = where.get(chr(ord(mark) + (1 if opens else -1)))
        a, b = (offset, n if partner is None else partner) if opens else (partner or 0, offset)
        words = readers(a, max(b, min(a + 1, n)))  # (an empty element: the next character)
        if opens:
            spot[mark] = first if a == 0 else last if a == n else pre[min(words)]
        else:  # (an empty element's end tag: right after its start tag)
            spot[mark] = spot.get(chr(ord(mark) - 1)) if a == b else None
            spot[mark] = spot[mark] if spot[mark] is not None else \
                last if b == n else first if b == 0 else post[max(words)]
        spot[mark].append(mark)
    stack = []
    for mark in first + [m for w in range(len(texts)) for m in pre[w] + post[w]] + last:
        if (ord(mark) - TAG) % 2 == 0:
            stack.append(chr(ord(mark) + 1))
        elif stack[-1:] == [mark]:
            stack.pop()
        elif stack or chr(ord(mark) - 1) in where:  # crossed: in their order, all around
            order = [m for _, m in marks]
            cut = max((k + 1 for k, m in enumerate(order) if (ord(m) - TAG) % 2 == 0), default=0)
            first, last = order[:cut], order[cut:]
            pre, post = [[] for _ in texts], [[] for _ in texts]
            break
    parts = [_parts(t) for t in texts]
    texts = [lead + "".join(pre[w]) + core + "".join(post[w]) + trail
             for w, (lead, core, trail) in enumerate(parts)]
    texts[0] = "".join(first) + texts[0]
    texts[-1] += "".join(last)
    return texts


def hypothesis_texts(run: LoadedRun | LoadedExport, masked: Sequence[tuple[str, list, list]],
                     ids: Sequence[Sequence[int]], nbests, device) -> list[list[str]]:
    """Each sentence's hypotheses as text, spans copied in (:func:`copy_spans`)."""
    return [[copy_spans(run, m, src, toks, device) for toks, _ in hyps]
            for m, src, hyps in zip(masked, ids, nbests)]


SHORT_INPUT = 4  # source pieces: an input this short may be a word the model never saw alone
LIKELY = 0.4  # the token probability (geometric mean) its translation then needs


def likelihood(run: LoadedRun | LoadedExport, src: Sequence[int], out: Sequence[int],
               device) -> float:
    """The probability the model gives each token of ``out`` and its end after ``src``,
    teacher-forced: their geometric mean (a beam score's ``exp`` at ``len_penalty=1``)."""
    if isinstance(run, LoadedExport):
        logp = run.translator.score_batch([run.src_tokenizer.pieces(src)],
                                          [run.tgt_tokenizer.pieces(out)])[0].log_probs
        return math.exp(sum(logp) / len(logp))
    batch = collate([list(src)], [list(out)]).to(device)
    with torch.inference_mode():  # the training loss of these tokens, per token
        nll = sequence_loss(run.model(batch.src, batch.tgt_in)[0], run.model.output_proj.weight,
                            batch.tgt_out, run.model.pad_id)
    return math.exp(-nll.item() / batch.n_tgt_tokens)


def doubt(run: LoadedRun | LoadedExport, text: str, src: Sequence[int], out: Sequence[int],
          device) -> str | None:
    """Why the translation ``out`` of ``text`` is not to be served as certain, or None: a
    text of at most SHORT_INPUT pieces, not confidently in the model's source language
    (py3langid, among LibreTranslate's languages), whose translation the model finds
    unlikely (:func:`likelihood` below LIKELY)."""
    if not src or len(src) > SHORT_INPUT or not (
            lang := unsure(text, source_language(run.config.get("data", {})))) or \
            (likely := likelihood(run, src, out, device)) >= LIKELY:
        return None
    return (f"{text.strip()!r} is short, of uncertain language ({lang[0]} {lang[1]:.0%}), and "
            f"the model finds its translation unlikely (a token's probability {likely:.2f}): "
            "it may be made up")


def search(run: LoadedRun | LoadedExport, ids: Sequence[Sequence[int]], decode, device,
           progress: bool = False) -> list[list[tuple[list[int], float]]]:
    """Per id list, ``decode.nbest`` ``(ids, score)`` best first, by the engine ``run`` is
    (:func:`tinymt.decoding.translate_ids` or :func:`tinymt.ct2.translate_export_ids`, with
    the settings of a ``decode`` config node); an empty list gives no hypothesis."""
    d, export = decode, isinstance(run, LoadedExport)
    todo = [i for i, t in enumerate(ids) if t]
    on = torch.device(run.translator.device if export else device)  # ct2: its own device
    kw = {"beam": d.beam, "len_penalty": d.len_penalty, "max_len_a": d.max_len_a,
          "max_len_b": d.max_len_b, "nbest": d.nbest,
          "batch_tokens": pick_batch_tokens(d.batch_tokens, on, d.beam), "progress": progress}
    if d.beam_rule:  # None: the engine's own rule
        kw["beam_rule"] = d.beam_rule
    if export:  # the decoding step is the only difference
        outs = translate_export_ids(run, [ids[i] for i in todo], **kw)
    else:
        outs = translate_ids(run.model, [ids[i] for i in todo], device=device, **kw)
    outs = iter(outs)
    return [next(outs) if t else [] for t in ids]


def _translate_lines(run: LoadedRun | LoadedExport, lines, cfg, warn, out_f, device,
                     shown: list, first_line: int = 1) -> list[str]:
    """Each line's sentences translated as one batch (:mod:`tinymt.text`; an n-best list is
    of the whole line), printed a line each, the input's spacing kept."""
    d, data = cfg.decode, run.config.get("data", {})
    sents, plans, kept = plan(lines, source_language(data), d.nbest == 1, first=first_line)
    if kept:
        warn(f"{kept} segment(s) with no word of the model's language "
             f"({source_language(data)}) left as they are")
    of_line = [[i for i in parts if isinstance(i, int)] for parts in plans]  # each line's sentences
    line = {i: first_line + n for n, idx in enumerate(of_line) for i in idx}
    masked, ids = source_ids(run, sents, warn, line)
    drawn = sum(map(bool, ids)) + len(shown)  # (shown: earlier chunks' PNGs)
    if Path(cfg.attention or "").suffix.lower() == ".png" and drawn > 1:
        raise TinyMTError(f"attention={cfg.attention} is one file but there are {drawn} "
                          "sentences: give a folder instead")
    nbests = search(run, ids, d, device, progress=sum(map(bool, ids)) > 200)
    outs = hypothesis_texts(run, masked, ids, nbests, device)
    best = [o[0] if o else "" for o in outs]
    texts = [assemble(parts, best, target_language(data)).strip() for parts in plans]
    for n, one in enumerate(of_line):  # a line of one short sentence: made up?
        if len(one) == 1 and nbests[one[0]] and (why := doubt(
                run, sents[one[0]], ids[one[0]], nbests[one[0]][0][0], device)):
            warn(f"line {first_line + n}: {why}")
    for n, text in enumerate(texts):  # (n-best: each line one sentence, its lines, a blank)
        if d.nbest == 1:
            print(text, file=out_f)  # one output line per input line
            continue
        for (_, s), t in zip(nbests[n], outs[n]) if nbests[n] else [(([], float("nan")), "")]:
            print(f"{s:.4f}\t{t}", file=out_f)
        print("", file=out_f)
    if cfg.attention:  # a figure per sentence: line<n>.png, or line<n>.<k>.png for several
        names = {i: f"line{first_line + n}" + (f".{k}" if len(idx) > 1 else "")
                 for n, idx in enumerate(of_line) for k, i in enumerate(idx, 1)}
        _save_attention(run, cfg, sents, ids, nbests, device, names, shown)
    return texts


def _save_attention(run: LoadedRun, cfg, lines, ids, nbests, device, names, shown: list):
    """``attention=`` ending in ``.html``: one interactive page, every sentence a probe
    (``shown``: the documents of the sentences read before, kept in the page); otherwise
    one PNG per sentence: the grids of every requested kind and layer, stacked (``shown``:
    the PNGs written)."""
    target = Path(cfg.attention)
    nonempty = [i for i, t in enumerate(ids) if t]
    if target.suffix.lower() == ".html":
        docs = attention_documents(run, lines, ids, [h[0][0] if h else [] for h in nbests], device)
        shown += docs
        docs = shown
        title = f"tinymt attention: {docs[0]['sentence'].strip()}" if docs else \
            "tinymt attention"
        write_text(html_page(view_name(run), docs, title=title), target)  # whole
        print(f"attention view: {target}", file=sys.stderr)
        for doc in docs[-len(nonempty):] if nonempty else []:  # this call's: the heads at work
            rels = [(kind, *r) for kind, v in doc["kinds"].items() for r in v.get("relations", [])]
            if rels:
                print(f"gold relations of {doc['sentence'].strip()}, each with the head giving the "
                      "most of the first word's attention to the second:", file=sys.stderr)
            for kind, q, k, label, layer, head, w in rels:
                print(f"  {kind:<12}  {q} → {k}  ({label})  layer {layer} head {head}  {w:.2f}",
                      file=sys.stderr)
        return
    single = target.suffix.lower() == ".png"  # (one sentence: checked before decoding)
    for i in nonempty:
        out = nbests[i][0][0]
        attn = collect_attention(run.model, ids[i], out, device)
        panels = [figure_to_array(fig) for _, fig in attention_figures(
            attn, run.src_tokenizer, run.tgt_tokenizer, ids[i], out,
            kinds=cfg.attention_kinds, title=lines[i].strip())]
        width = max(p.shape[1] for p in panels)
        image = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)),
                                       constant_values=255) for p in panels])
        path = target if single else target / f"{names[i]}.png"
        png = io.BytesIO()
        matplotlib.image.imsave(png, image, format="png")
        write_bytes(png.getvalue(), path)  # whole: a failure keeps the old file
        print(f"attention map: {path}", file=sys.stderr)
        shown.append(path)  # (one PNG file: one sentence, all chunks told)


def attention_documents(run: LoadedRun, lines, ids, outs, device) -> list[dict]:
    """The view document (:mod:`tinymt.viewer.document`) of each sentence: every head of all
    three kinds, teacher-forced on the model's own translation ``outs`` (an empty sentence
    has none). The built-in corpus's showcase sentences bring their gold words; each head's
    label is the checkpoint's (measured at its step by the trainer), where it has them."""
    data = run.config.get("data", {})
    gold = data.get("source") == "builtin" and not data.get("reverse")
    step, labels = int(run.state.get("step", 0)), run.state.get("labels", {})
    docs = [translation_document(
        collect_attention(run.model, src, out, device), run.src_tokenizer.pieces(src),
        run.tgt_tokenizer.pieces(out), line, run.tgt_tokenizer.decode(out), step, gold)
        for line, src, out in zip(lines, ids, outs) if src]
    for kind, doc in itertools.product(labels, docs):
        doc["kinds"].get(kind, {})["labels"] = labels[kind]
    return docs


def view_name(run: LoadedRun) -> str:
    """How the view names the model: run folder and checkpoint."""
    return f"{run.run_dir.name} · {run.checkpoint.name}"
