"""Translate with a trained run: ``translate(cfg)``, plus the pieces the trainer reuses.

- :func:`load_run` finds a run dir (``run=latest`` = newest under ``outputs/``), its
  tokenizer and a checkpoint, and rebuilds the model, with one-line errors for each
  thing that can be missing or mismatched.
- :func:`translate_ids` decodes token-id lists in length-sorted batches (greedy or
  beam search, both on the KV cache) and returns results in input order.
- :func:`collect_attention` / :func:`attention_figures` give every head's map of a
  translated sentence, the same figures the trainer logs to TensorBoard.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from tinymt.batching import collate
from tinymt.checkpoint import load_checkpoint
from tinymt.data import target_language
from tinymt.decoding import beam_search, greedy_decode
from tinymt.errors import TinyMTError
from tinymt.model import Transformer
from tinymt.plotting import attention_grid, figure_to_array
from tinymt.tokenizer import Tokenizer, load_tokenizers

KINDS = ("encoder_self", "decoder_self", "cross")


# ----------------------------------------------------------------------------- loading
@dataclass
class LoadedRun:
    model: Transformer
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    config: dict  # the run's resolved training config
    run_dir: Path
    checkpoint: Path


def find_run(run: str, outputs_root: str = "outputs") -> Path:
    """``latest`` -> the newest run dir (one holding checkpoints/last.pt) under outputs/."""
    if run == "latest":
        root = Path(outputs_root)
        runs = [p.parent.parent for p in root.glob("**/checkpoints/last.pt")]
        if not runs:
            raise TinyMTError(f"run=latest: no trained run (…/checkpoints/last.pt) under {root}/;"
                              " train one with scripts/train.py or pass run=<run dir>")
        return max(runs, key=lambda p: (p / "checkpoints" / "last.pt").stat().st_mtime)
    path = Path(run)
    if not path.is_dir():
        raise TinyMTError(f"run dir {path} does not exist")
    return path


def load_run(run: str, checkpoint: str = "best", device: torch.device | str = "cpu",
             outputs_root: str = "outputs") -> LoadedRun:
    run_dir = find_run(run, outputs_root)
    if checkpoint in ("best", "last", "avg"):
        ckpt_path = run_dir / "checkpoints" / f"{checkpoint}.pt"
        if not ckpt_path.is_file():
            raise TinyMTError(f"checkpoint={checkpoint}: expected {ckpt_path}, which does not "
                              "exist (checkpoint=best|last|avg|<path>)")
    else:
        ckpt_path = Path(checkpoint)
    state = load_checkpoint(ckpt_path, map_location="cpu")
    tok_dir = run_dir / "tokenizer"
    src_tok, tgt_tok = load_tokenizers(tok_dir)
    vocab = state["vocab"]
    if (vocab["src_size"], vocab["tgt_size"]) != (src_tok.vocab_size, tgt_tok.vocab_size):
        raise TinyMTError(
            f"{ckpt_path} was trained with vocab sizes {vocab['src_size']}/{vocab['tgt_size']} but "
            f"the tokenizer in {tok_dir} has {src_tok.vocab_size}/{tgt_tok.vocab_size}: the "
            "checkpoint belongs to another run")
    model_cfg = OmegaConf.create(state["model_config"])
    model = Transformer(model_cfg, vocab["src_size"], vocab["tgt_size"],
                        shared_vocab=vocab["shared"])
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0][:200]
        raise TinyMTError(f"{ckpt_path} does not fit its own model config ({first})") from None
    model.to(device).eval()
    return LoadedRun(model, src_tok, tgt_tok, state.get("config", {}), run_dir, ckpt_path)


# ----------------------------------------------------------------------------- decoding
def length_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Indices sorted by length, cut into batches of at most ``batch_tokens`` (padded)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, cur, longest = [], [], 0
    for i in order:
        longest_new = max(longest, lengths[i] + 1)
        if cur and longest_new * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, longest_new = [], lengths[i] + 1
        cur.append(i)
        longest = longest_new
    if cur:
        batches.append(cur)
    return batches


def translate_ids(model: Transformer, src_ids: Sequence[Sequence[int]], *, beam: int = 1,
                  len_penalty: float = 1.0, max_len_a: float = 1.5, max_len_b: int = 10,
                  nbest: int = 1, batch_tokens: int = 4096, device="cpu", use_cache: bool = True,
                  progress: bool = False, head_gates=None) -> list[list[tuple[list[int], float]]]:
    """Translate id lists (no eos) -> per sentence, ``nbest`` (ids, score) best first.

    Greedy (``beam=1``) reports a score of ``nan``: it does not rank hypotheses.
    ``head_gates`` (``{kind: (n_layers, n_heads)}``) scales heads, e.g. to prune them.
    """
    results: list = [None] * len(src_ids)
    batches = length_batches([len(s) for s in src_ids], batch_tokens)
    it: Iterable = batches
    if progress:
        from tqdm import tqdm

        it = tqdm(batches, desc="translate", unit="batch", file=sys.stderr, mininterval=1.0)
    for idx in it:
        batch = collate([list(src_ids[i]) for i in idx], [[] for _ in idx]).to(device)
        if beam == 1:
            outs = greedy_decode(model, batch.src, batch.src_pad_mask, max_len_a=max_len_a,
                                 max_len_b=max_len_b, use_cache=use_cache,
                                 head_gates=head_gates)
            hyps = [[(o, float("nan"))] for o in outs]
        else:
            hyps = beam_search(model, batch.src, batch.src_pad_mask, beam=beam,
                               len_penalty=len_penalty, max_len_a=max_len_a,
                               max_len_b=max_len_b, nbest=nbest, use_cache=use_cache,
                               head_gates=head_gates)
        for i, h in zip(idx, hyps):
            results[i] = [(list(t), float(s)) for t, s in h]
    return results


# ----------------------------------------------------------------------------- attention
@torch.inference_mode()
def collect_attention(model: Transformer, src_ids: Sequence[int], out_ids: Sequence[int],
                      device="cpu") -> dict[str, list[np.ndarray]]:
    """Every head's attention for one sentence and its translation (teacher-forced).

    Returns ``{kind: [layer -> (heads, T_query, T_key) array]}``. Source positions are
    ``src_ids + [eos]``; decoder positions are ``[bos] + out_ids`` (queries) whose
    predictions are ``out_ids + [eos]``.
    """
    was_training = model.training
    model.eval()
    batch = collate([list(src_ids)], [list(out_ids)]).to(device)
    _, attn = model(batch.src, batch.tgt_in, need_weights=True)
    model.train(was_training)
    return {k: [w[0].float().cpu().numpy() for w in attn[k]] for k in KINDS}


def attention_figures(attn: dict[str, list[np.ndarray]], src_tok: Tokenizer, tgt_tok: Tokenizer,
                      src_ids: Sequence[int], out_ids: Sequence[int],
                      kinds: Sequence[str] = ("cross",), title: str = ""):
    """Yield ``("<kind>/layer_<l>", figure)``: rows = the token each query position
    predicts (decoder) or reads (encoder), columns = the tokens it attends to."""
    src_labels = src_tok.pieces(list(src_ids)) + ["</s>"]
    dec_in = ["<s>"] + tgt_tok.pieces(list(out_ids))
    dec_out = tgt_tok.pieces(list(out_ids)) + ["</s>"]
    axes = {"encoder_self": (src_labels, src_labels), "decoder_self": (dec_out, dec_in),
            "cross": (dec_out, src_labels)}
    for kind in kinds:
        if kind not in axes:
            raise TinyMTError(f"attention kind {kind!r}: choose from {', '.join(KINDS)}")
        rows, cols = axes[kind]
        for layer, w in enumerate(attn[kind]):
            name = f"{kind} / layer {layer}" + (f" — {title}" if title else "")
            yield f"{kind}/layer_{layer}", attention_grid(w, rows, cols, title=name)


# ----------------------------------------------------------------------------- translate
def read_lines(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise TinyMTError(f"input file {p} does not exist")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise TinyMTError(f"{p}: line {line} is not valid UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def translate(cfg, sentences: Sequence[str] = (), stdin=None, stdout=None, warn=None) -> dict:
    """Translate ``sentences`` (or ``cfg.input``, or stdin) with a trained run.

    Output has exactly one line per input line (empty in -> empty out). With ``nbest >
    1`` each input gives ``nbest`` lines ``score<TAB>translation`` and a blank line.
    Returns ``{"translations": [...], "bleu": ..., "chrf": ...}``.
    """
    from tinymt.runtime import pick_device
    from tinymt.trainer import score

    stdout = stdout or sys.stdout
    warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
    d = cfg.decode
    if d.beam < 1 or d.nbest < 1 or d.nbest > d.beam:
        raise TinyMTError(f"decode.beam={d.beam}, decode.nbest={d.nbest}: need 1 <= nbest <= beam")
    device = pick_device(cfg.device)
    run = load_run(cfg.run, cfg.checkpoint, device, cfg.outputs_root)
    max_src = run.model.config.max_positions - 1  # room for eos

    interactive = False
    if sentences:
        lines = list(sentences)
    elif cfg.input:
        lines = read_lines(cfg.input)
    else:
        stdin = stdin or sys.stdin
        interactive = stdin.isatty() and not cfg.output
        lines = None

    out_f = open(cfg.output, "w", encoding="utf-8") if cfg.output else stdout
    translations: list[str] = []
    try:
        if lines is None and interactive:  # one sentence at a time, answered at once
            print("type a sentence, Ctrl-D to end", file=sys.stderr)
            for n, line in enumerate(stdin, 1):
                translations += _translate_lines(run, [line.rstrip("\n")], cfg, max_src, warn,
                                                 out_f, device, first_line=n)
                out_f.flush()
        else:
            if lines is None:
                lines = [ln.rstrip("\n") for ln in stdin]
            translations = _translate_lines(run, lines, cfg, max_src, warn, out_f, device)
    finally:
        if cfg.output:
            out_f.close()
    result = {"translations": translations, "run_dir": str(run.run_dir),
              "checkpoint": str(run.checkpoint)}
    if cfg.ref:
        refs = read_lines(cfg.ref)
        if len(refs) != len(translations):
            raise TinyMTError(f"ref={cfg.ref} has {len(refs)} lines but the input has "
                              f"{len(translations)}")
        bleu, chrf, sig = score(translations, refs,
                                target_language(run.config.get("data", {})))
        print(f"BLEU {bleu:.2f}  chrF {chrf:.2f}  ({sig})", file=sys.stderr)
        result.update(bleu=bleu, chrf=chrf, signature=sig)
    return result


def _translate_lines(run: LoadedRun, lines, cfg, max_src, warn, out_f, device,
                     first_line: int = 1) -> list[str]:
    import unicodedata

    d = cfg.decode
    ids: list[list[int]] = []
    for n, line in enumerate(lines, first_line):
        toks = run.src_tokenizer.encode(unicodedata.normalize("NFKC", line.strip()))
        if len(toks) > max_src:
            warn(f"line {n}: {len(toks)} tokens, longer than the model's maximum {max_src}: "
                 "translated after truncation")
            toks = toks[:max_src]
        ids.append(toks)
    todo = [i for i, t in enumerate(ids) if t]
    outs = translate_ids(run.model, [ids[i] for i in todo], beam=d.beam,
                         len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b,
                         nbest=d.nbest, batch_tokens=d.batch_tokens, device=device,
                         progress=len(todo) > 200)
    nbests: list[list[tuple[list[int], float]]] = [[] for _ in ids]
    for i, o in zip(todo, outs):
        nbests[i] = o
    texts = []
    for hyps in nbests:
        best = run.tgt_tokenizer.decode(hyps[0][0]) if hyps else ""
        texts.append(best)
        if d.nbest > 1:
            for toks, s in hyps or [([], float("nan"))]:
                print(f"{s:.4f}\t{run.tgt_tokenizer.decode(toks)}", file=out_f)
            print("", file=out_f)
        else:
            print(best, file=out_f)
    if cfg.attention:
        _save_attention(run, cfg, lines, ids, nbests, device, first_line)
    return texts


def _save_attention(run: LoadedRun, cfg, lines, ids, nbests, device, first_line):
    """One PNG per sentence: the grids of every requested kind and layer, stacked."""
    import matplotlib.image

    target = Path(cfg.attention)
    nonempty = [i for i, t in enumerate(ids) if t]
    single = target.suffix.lower() == ".png"
    if single and len(nonempty) > 1:
        raise TinyMTError(f"attention={target} is one file but there are {len(nonempty)} "
                          "sentences: give a folder instead")
    (target.parent if single else target).mkdir(parents=True, exist_ok=True)
    for i in nonempty:
        out = nbests[i][0][0]
        attn = collect_attention(run.model, ids[i], out, device)
        panels = [figure_to_array(fig) for _, fig in attention_figures(
            attn, run.src_tokenizer, run.tgt_tokenizer, ids[i], out,
            kinds=cfg.attention_kinds, title=lines[i].strip())]
        width = max(p.shape[1] for p in panels)
        image = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)),
                                       constant_values=255) for p in panels])
        path = target if single else target / f"line{first_line + i}.png"
        matplotlib.image.imsave(path, image)
        print(f"attention map: {path}", file=sys.stderr)
