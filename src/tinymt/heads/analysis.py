"""``analyze(cfg)``: the head analysis of a trained run, step by step (see
:mod:`tinymt.heads`)."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from tinymt.checkpoint import save_checkpoint
from tinymt.config import check_analyze
from tinymt.errors import TinyMTError
from tinymt.files import check_output, write_text
from tinymt.heads.alignment import alignment_summary
from tinymt.heads.gates import all_heads, gates_without, head_shapes
from tinymt.heads.importance import head_importance, normalize_importance
from tinymt.heads.pruning import (
    BLEU_DROP,
    gated_bleu,
    prune_order,
    pruned_state,
    pruning_curves,
)
from tinymt.heads.relation_report import JSON_REPORT, write_json
from tinymt.heads.relations import relation_summary
from tinymt.heads.report import (
    FIGURES,
    REPORT,
    markdown_report,
    write_figures,
    write_tensorboard,
)
from tinymt.heads.sentences import Sentences, load_sentences
from tinymt.heads.showcase import showcase_links
from tinymt.heads.stats import attention_pass, head_labels
from tinymt.heads.sweep import SWEEP_REPORT, sweep_report, sweep_runs
from tinymt.model import KINDS
from tinymt.rundir import LoadedRun, checkpoint_path, find_run, load_run
from tinymt.runlock import lock_run
from tinymt.runtime import pick_device


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def analyze(cfg, progress: bool = True, log=None) -> dict:
    """Analyse every head of a trained run (see :mod:`tinymt.heads`); returns the numbers.

    ``cfg`` is a :class:`tinymt.config.AnalyzeConfig`. Writes ``<run>/heads.md``,
    ``<run>/heads/*.png``, TensorBoard events in ``<run>`` and, with ``cfg.prune``, a
    pruned checkpoint.
    """
    log = log or _stderr
    check_analyze(cfg)
    runs = sweep_runs(Path(cfg.run)) if Path(cfg.run).is_dir() else []
    if runs:
        return _analyze_sweep(cfg, runs, progress, log)
    run_dir = find_run(cfg.run, cfg.outputs_root)
    if cfg.prune_output:  # before any work: never over the run's last.pt, best.pt, ...
        check_output(cfg.prune_output, "prune_output", owner=run_dir)
    lock = lock_run(run_dir, "analyse the heads of")  # its reports go into the run
    try:
        return _analyze_run(cfg, str(run_dir), progress, log)
    finally:
        lock.release()


# long: the analysis in paper order, each step one call
def _analyze_run(cfg, run_dir: str, progress: bool, log) -> dict:
    device = pick_device(cfg.device)
    run, data, tgt_lang, source = _load(OmegaConf.merge(cfg, {"run": run_dir}), device, log)
    model = run.model
    # 1. importance
    raw = head_importance(model, data.src_ids, data.tgt_ids, cfg.batch_tokens, device,
                          progress)
    importance = normalize_importance(raw)
    # 2. attention statistics, alignment and relations
    stats, counts, rel_counts = attention_pass(model, data.src_ids, data.tgt_ids,
                                               cfg.batch_tokens, device, data.words, progress)
    means = stats.means()
    # 3. pruning curves
    pruning = None if not cfg.pruning else pruning_curves(
        model, data.src_ids, data.refs, run.tgt_tokenizer, tgt_lang, importance,
        cfg.prune_step, cfg.batch_tokens, device, progress)
    # 4. pruned checkpoint
    pruned = None if cfg.prune is None else \
        _write_pruned(cfg, run, data, tgt_lang, importance, device, log)
    # 5. figures, TensorBoard, report
    alignment = None if counts is None else alignment_summary(counts)
    relations = None if rel_counts is None or not rel_counts.n else \
        relation_summary(rel_counts)
    run_dir = run.run_dir
    result = {
        "run_dir": str(run_dir), "checkpoint": str(run.checkpoint), "split": cfg.split,
        "sentences": len(data.src_ids), "truncated": data.truncated,
        "shapes": head_shapes(model), "n_heads": len(all_heads(model)),
        "importance_raw": raw, "importance": importance,
        "stats": means, "labels": {k: head_labels(means[k], k) for k in KINDS},
        "pruning": pruning, "alignment": alignment,
        "alignment_note": None if alignment else (
            f"no gold word alignments in data.source={source}: alignment error rates need "
            "the built-in corpus"),
        "relations": relations,
        "relations_note": None if relations else (
            f"no gold relations in data.source={source}: relation accuracy needs the "
            "built-in corpus"),
        "showcase": showcase_links(run, device) if relations else None,
        "pruned": pruned, "report": str(run_dir / REPORT),
        "json": str(run_dir / JSON_REPORT),
    }
    _write_outputs(result, run_dir, int(run.state.get("step") or 0))
    _log_summary(result, log)
    return result


def _analyze_sweep(cfg, runs: list[Path], progress: bool, log) -> dict:
    """Every run of a sweep folder, then ``<sweep>/heads_sweep.md`` comparing them."""
    if cfg.prune_output:
        raise TinyMTError(f"run={cfg.run} is a sweep of {len(runs)} runs: prune_output= "
                          "would be the same file for all of them; leave it unset")
    log(f"heads: sweep {cfg.run}: {len(runs)} runs")
    results = [analyze(OmegaConf.merge(cfg, {"run": str(r)}), progress, log) for r in runs]
    report = write_text(sweep_report(runs, results), Path(cfg.run) / SWEEP_REPORT)
    log(f"sweep report: {report}")
    return {"runs": [str(r) for r in runs], "results": results, "report": str(report)}


def _load(cfg, device, log) -> tuple[LoadedRun, Sentences, str, str]:
    """The run and its analysed sentences, their target language and data source."""
    run = load_run(cfg.run, cfg.checkpoint, device, cfg.outputs_root)
    if not run.model._masks_all_ones():
        log(f"note: {run.checkpoint} already has masked heads; they stay masked "
            "(importance 0, masked first)")
    data, tgt_lang, source = load_sentences(run, cfg.split, cfg.max_sentences, log)
    if not data.src_ids:
        raise TinyMTError(f"split={cfg.split} of {run.run_dir} has no sentences")
    log(f"heads: {run.run_dir} ({run.checkpoint.name}), {len(data.src_ids)} {cfg.split} "
        f"sentences, device {device}")
    return run, data, tgt_lang, source


def _write_pruned(cfg, run: LoadedRun, data: Sentences, tgt_lang: str, importance: dict,
                  device, log) -> dict:
    """Publish the checkpoint with the ``cfg.prune`` least important heads masked; its
    path, the masked heads and its BLEU."""
    n_total = len(all_heads(run.model))
    k = round(cfg.prune * n_total)
    heads = prune_order(importance)[:k]
    state = pruned_state(run.state, gates_without(run.model, heads, device="cpu"), heads,
                         cfg.prune, run.checkpoint)
    out_path = Path(cfg.prune_output or checkpoint_path(run.run_dir, "pruned"))
    save_checkpoint(state, out_path, owner=run.run_dir)
    bleu = gated_bleu(run.model, data.src_ids, data.refs, run.tgt_tokenizer, tgt_lang,
                      gates_without(run.model, heads, device), cfg.batch_tokens, device)
    log(f"pruned checkpoint ({k}/{n_total} heads masked, BLEU {bleu:.2f}): {out_path}")
    return {"path": str(out_path), "fraction": cfg.prune, "n_masked": k, "heads": heads,
            "bleu": bleu}


def _write_outputs(result: dict, run_dir: Path, step: int) -> None:
    """Figures, TensorBoard and ``heads.md``; adds ``result["figures"]``."""
    pngs = write_figures(result, run_dir / FIGURES, owner=run_dir)
    write_tensorboard(run_dir, {tag: img for tag, (_, img) in pngs.items()}, result, step)
    result["figures"] = {tag: str(p) for tag, (p, _) in pngs.items()}
    write_text(markdown_report(result, run_dir), run_dir / REPORT, owner=run_dir)
    write_json(result, run_dir / JSON_REPORT, owner=run_dir)


def _log_summary(r: dict, log) -> None:
    pruning, alignment = r["pruning"], r["alignment"]
    log((f"unpruned BLEU {pruning['base']:.2f}; heads prunable within {BLEU_DROP:g} BLEU: "
         + ", ".join(f"{c} {pruning['prunable'][c]}/{pts[-1][1]}"
                     for c, pts in pruning["curves"].items()) if pruning
         else "pruning curves skipped (pruning=false)")
        + (f"; best aligning head: cross layer {alignment['best_head'][0]} head "
           f"{alignment['best_head'][1]} (AER {alignment['best_aer']:.3f}), all cross heads "
           f"averaged AER {alignment['average_aer']:.3f}" if alignment
           else f"; {r['alignment_note']}"))
    if r["relations"]:
        log("relations with a head beating the best fixed offset: " + "; ".join(
            f"{kind} {len(v['tracked'])}/{len({row['relation'] for row in v['rows']})}"
            + (f" ({', '.join(v['tracked'])})" if v["tracked"] else "")
            for kind, v in r["relations"].items()))
    run_dir = Path(r["run_dir"])
    log(f"report: {run_dir / REPORT}, numbers: {run_dir / JSON_REPORT}  (figures in "
        f"{run_dir / FIGURES}/, TensorBoard tags heads/...)")
