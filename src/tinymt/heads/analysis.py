"""``analyze(cfg)``: the head analysis of a trained run, step by step (see
:mod:`tinymt.heads`), or of every run of a sweep folder (``scripts/train.py -m ...``: runs
in sub-folders), compared in ``<sweep>/heads_sweep.md``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from tinymt import KINDS
from tinymt.checkpoint import save_checkpoint
from tinymt.config import check_analyze, load_config_file
from tinymt.errors import TinyMTError
from tinymt.files import CONFIG, check_output, check_outputs, is_run_dir, load_json, write_text
from tinymt.heads import pruning, report
from tinymt.heads.gates import all_heads, gates_without, head_shapes
from tinymt.heads.sentences import load_sentences, showcase_links
from tinymt.heads.stats import alignment_summary, attention_pass
from tinymt.labels import head_labels
from tinymt.relations import relation_summary
from tinymt.rundir import checkpoint_path, find_run, load_run, run_checkpoint
from tinymt.runtime import pick_device

_IGNORED = ("run_dir", "resume")  # settings that differ between any two runs of a sweep


def analyze(cfg, progress: bool = True, log=None) -> dict:
    """Analyse every head of a trained run (see :mod:`tinymt.heads`); returns the numbers.

    ``cfg`` is a :class:`tinymt.config.AnalyzeConfig`. Writes ``<run>/heads.md``,
    ``<run>/heads/*.png``, ``<run>/heads.json`` and, with ``cfg.prune``, a pruned
    checkpoint. For a sweep folder: every run, then ``<sweep>/heads_sweep.md``.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    check_analyze(cfg)
    if cfg.prune_output is not None and cfg.prune is None:
        raise TinyMTError(f"prune_output={cfg.prune_output}: it names the file of prune=; set "
                          "prune=<fraction> too")
    folder = Path(cfg.run)
    runs = [] if not folder.is_dir() or is_run_dir(folder) else sorted(  # 2_..., 10_...
        (p for p in folder.iterdir() if is_run_dir(p)), key=lambda p: (len(p.name), p.name))
    if runs:
        if cfg.prune_output:
            raise TinyMTError(f"run={cfg.run} is a sweep of {len(runs)} runs: prune_output= "
                              "would be the same file for all of them; leave it unset")
        log(f"heads: sweep {cfg.run}: {len(runs)} runs")
        # every run's files and outputs, and the report's, before any work
        labels, metrics = _run_labels(runs), [load_json(r / "metrics.json", "the run's metrics")
                                              if os.path.lexists(r / "metrics.json") else {}
                                              for r in runs]
        for r in runs:
            _check_run(cfg, r)
        path = check_output(folder / report.SWEEP_REPORT, "the sweep report")
        results = [_analyze_run(OmegaConf.merge(cfg, {"run": str(r)}), progress, log) for r in runs]
        write_text(report.sweep_report(labels, metrics, results), path)
        log(f"sweep report: {path}")
        return {"runs": [str(r) for r in runs], "results": results, "report": str(path)}
    run_dir = find_run(cfg.run, cfg.outputs_root)
    _check_run(cfg, run_dir)
    return _analyze_run(OmegaConf.merge(cfg, {"run": str(run_dir)}), progress, log)


def _check_run(cfg, run_dir: Path) -> None:
    """The checkpoint analysing ``run_dir`` reads and the files it writes, before any work."""
    if not (ckpt := run_checkpoint(run_dir, cfg.checkpoint)).is_file():
        raise TinyMTError(f"checkpoint {ckpt} does not exist (nothing was analysed)")
    check_outputs(("heads.md", run_dir / report.REPORT), ("heads.json", run_dir / report.JSON_REPORT),
                  ("prune_output", None if cfg.prune is None else _pruned(cfg, run_dir)))


def _pruned(cfg, run_dir: Path) -> Path | str:  # (as given: an empty one is refused)
    return checkpoint_path(run_dir, "pruned") if cfg.prune_output is None else cfg.prune_output


def _run_labels(runs: list[Path]) -> list[str]:
    """Each run of a sweep named by the training settings that differ between the runs."""
    def flat(d: dict, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    flats = [flat(load_config_file(r / CONFIG, "the run's config")) for r in runs]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if not k.endswith(_IGNORED)
              and len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1]
    return [", ".join(f"{k}={f.get(k)}" for k in differ) or r.name for r, f in zip(runs, flats)]


# long: the analysis in paper order, each step one call
def _analyze_run(cfg, progress: bool, log) -> dict:
    device = pick_device(cfg.device)
    run = load_run(cfg.run, cfg.checkpoint, device, cfg.outputs_root)
    if run.state.get("pruned"):  # written by prune=: its heads have zero W_O columns
        log(f"note: {run.checkpoint} already has masked heads; they stay masked "
            "(importance 0, masked first)")
    data, tgt_lang, source = load_sentences(run, cfg.split, cfg.max_sentences, log, cfg.cache_dir)
    log(f"heads: {run.run_dir} ({run.checkpoint.name}), {len(data.src_ids)} {cfg.split} "
        f"sentences, device {device}")
    model = run.model
    # 1. importance
    raw = pruning.head_importance(model, data.src_ids, data.tgt_ids, cfg.batch_tokens, device,
                                  progress)
    importance = pruning.normalize_importance(raw)
    # 2. attention statistics, alignment and relations
    stats, counts, rel_counts = attention_pass(model, data.src_ids, data.tgt_ids,
                                               cfg.batch_tokens, device, data.words, progress)
    means = stats.means()
    # 3. pruning curves
    curves = None if not cfg.pruning else pruning.pruning_curves(
        model, data.src_ids, data.refs, run.tgt_tokenizer, tgt_lang, importance,
        cfg.prune_step, cfg.batch_tokens, device, progress)
    # 4. pruned checkpoint: the cfg.prune least important heads masked
    pruned = None
    if cfg.prune is not None:
        k = round(cfg.prune * len(all_heads(model)))
        heads = pruning.prune_order(importance)[:k]
        out_path = _pruned(cfg, run.run_dir)
        save_checkpoint(pruning.pruned_state(run.state, heads, cfg.prune, run.checkpoint), out_path)
        bleu = pruning.gated_bleu(model, data.src_ids, data.refs, run.tgt_tokenizer, tgt_lang,
                                  gates_without(model, heads, device), cfg.batch_tokens, device)
        log(f"pruned checkpoint ({k}/{len(all_heads(model))} heads masked, BLEU {bleu:.2f}): "
            f"{out_path}")
        pruned = {"path": str(out_path), "fraction": cfg.prune, "n_masked": k, "heads": heads,
                  "bleu": bleu}
    # 5. figures, report
    alignment = None if counts is None else alignment_summary(counts)
    relations = None if rel_counts is None or not rel_counts.n else relation_summary(rel_counts)
    run_dir = run.run_dir
    result = {
        "run_dir": str(run_dir), "checkpoint": str(run.checkpoint), "split": cfg.split,
        "sentences": len(data.src_ids), "truncated": data.truncated,
        "shapes": head_shapes(model), "n_heads": len(all_heads(model)),
        "importance_raw": raw, "importance": importance,
        "stats": means, "labels": {k: head_labels(means[k], k) for k in KINDS},
        "pruning": curves, "alignment": alignment,
        "alignment_note": None if alignment else (
            f"no gold word alignments in data.source={source}: alignment error rates need "
            "the built-in corpus"),
        "relations": relations,
        "relations_note": None if relations else (
            f"no gold relations in data.source={source}: relation accuracy needs the "
            "built-in corpus"),
        "showcase": showcase_links(run, device) if relations else None,
        "pruned": pruned, "report": str(run_dir / report.REPORT),
        "json": str(run_dir / report.JSON_REPORT),
    }
    pngs = report.write_figures(result, run_dir / report.FIGURES)
    result["figures"] = {tag: str(p) for tag, p in pngs.items()}
    write_text(report.markdown_report(result, run_dir), result["report"])
    report.write_json(result, result["json"])
    _log_summary(result, log)
    return result


def _log_summary(r: dict, log) -> None:
    pr, alignment = r["pruning"], r["alignment"]
    log((f"unpruned BLEU {pr['base']:.2f}; heads prunable within {pruning.BLEU_DROP:g} BLEU: "
         + ", ".join(f"{c} {pr['prunable'][c]}/{pts[-1][1]}" for c, pts in pr["curves"].items())
         if pr else "pruning curves skipped (pruning=false)")
        + (f"; best aligning head: cross layer {alignment['best_head'][0]} head "
           f"{alignment['best_head'][1]} (AER {alignment['best_aer']:.3f}), all cross heads "
           f"averaged AER {alignment['average_aer']:.3f}" if alignment
           else f"; {r['alignment_note']}"))
    if r["relations"]:
        log("relations with a head beating the best fixed offset: " + "; ".join(
            f"{kind} {report.tracked(v)}" for kind, v in r["relations"].items())
            + f"; the showcase's object in the encoder: {report.showcase_object(r)}")
    log(f"report: {r['report']}, numbers: {r['json']}  (figures in "
        f"{Path(r['run_dir']) / report.FIGURES}/)")
