"""Decoding throughput: ours with the KV cache, ours recomputing the prefix, and the peer
(recomputing the prefix) -- greedy and beam 5, all through ``tinymt.decoding``; with a trained
run (``--run``) also the run exported to CTranslate2, float32 and int8 (:mod:`tinymt.bench.ct2_speed`),
and the BLEU of every method's translations."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tinymt.batching import Batch, collate, length_batches
from tinymt.bench.ct2_speed import Measured, ct2_rows
from tinymt.bench.measure import autocast, log, precision_label, timed
from tinymt.bench.memory import MemoryMeter, tensor_mib
from tinymt.bench.peer import PeerTransformer
from tinymt.bench.targets import CT2_METHODS, SEARCHES
from tinymt.bench.workload import build_pair, model_config
from tinymt.data import PreparedData, normalize, target_language
from tinymt.decoding import beam_search, greedy_decode, translate_ids
from tinymt.metrics import score
from tinymt.rundir import LoadedRun, load_run


@dataclass
class _Workload:
    """The models to decode with and how long their outputs may get."""

    src_ids: list[list[int]]
    models: dict[str, tuple[nn.Module, nn.Module]]  # label -> (ours, peer)
    max_len_a: float
    max_len_b: int
    length_rule: str  # for the report
    run: LoadedRun | None = None  # --run: the trained run (translations scored, exported)
    refs: list[str] | None = None  # --run: the test references, for BLEU


Measure = Callable[[], Measured]  # one timed pass: (outputs in sentence order, seconds, MiB)


def decode_once(model: nn.Module, use_cache: bool, beam: int, batches: list[Batch],
                max_len_a: float, max_len_b: int, outputs: list | None = None) -> int:
    """One pass over ``batches``; the number of output tokens (``outputs``: also collect
    the token lists, batch by batch). ``use_cache=False`` is the only way to drive the
    peer: the whole prefix is recomputed at every step and only its last position
    projected to the vocabulary."""
    out_tokens = 0
    for b in batches:
        kw = {"max_len_a": max_len_a, "max_len_b": max_len_b, "use_cache": use_cache}
        if beam == 1:
            outs = greedy_decode(model, b.src, b.src_pad_mask, **kw)
        else:
            outs = [h[0][0] for h in beam_search(model, b.src, b.src_pad_mask, beam=beam, **kw)]
        out_tokens += sum(len(o) for o in outs)
        if outputs is not None:
            outputs.extend(outs)
    return out_tokens


def _workload(args: argparse.Namespace, device: torch.device, data: PreparedData,
              data_info: dict, n: int) -> _Workload:
    """A trained run (``--run``: stops at EOS) or random models of every size (forced to a
    fixed output length, so that every method does the same work)."""
    test = data.splits["test"]
    if args.run:
        run = load_run(args.run, args.checkpoint, device)
        m = run.model
        peer = PeerTransformer.copy_of(m).to(device)
        return _Workload(
            [run.src_tokenizer.encode(normalize(t)) for t in test["src"][:n]],
            {f"trained ({m.config.name})": (m, peer)}, 1.5, 10,
            "trained model: stops at EOS, at most 1.5 × source length + 10 tokens "
            "(the translate defaults); the peer holds the same weights, so every "
            "method of ours produces the same translations; BLEU: sacreBLEU of each "
            "method's translations against the test references",
            run=run, refs=list(test["tgt"][:n]))
    ref_lens = data.lengths("test")[1][:n]
    decode_len = args.decode_len or max(1, round(statistics.mean(ref_lens)))
    models = {size: build_pair(model_config(size), data_info, device) for size in args.size_list}
    return _Workload(
        data.ids("test")[0][:n], models, 0.0, decode_len,
        f"random models: every sentence is decoded to exactly {decode_len} "
        f"tokens (max_len_a=0, max_len_b={decode_len}; the mean test reference "
        "length), EOS aside, so the three methods do the same work; the peer "
        "holds the same weights as ours")


def _our_passes(ours: nn.Module, peer: nn.Module, batches: list[Batch], order: list[int],
                beam: int, work: _Workload, device: torch.device, meter: MemoryMeter
                ) -> dict[str, tuple[Measure, float]]:
    """``{method: (measure one pass, static MiB)}`` of our model (cached, uncached) and the
    peer; a pass's outputs come in sentence order (``order``: the batches' sentences)."""
    def make(model: nn.Module, use_cache: bool) -> Measure:
        def one_pass() -> list[list[int]]:
            outs: list[list[int]] = []
            with autocast(device):
                decode_once(model, use_cache, beam, batches, work.max_len_a, work.max_len_b,
                            outs)
            in_order: list = [None] * len(outs)
            for i, o in zip(order, outs):
                in_order[i] = o
            return in_order
        return lambda: timed(one_pass, meter, device)

    static = tensor_mib(ours.parameters())
    return {"ours_cache": (make(ours, True), static), "ours_nocache": (make(ours, False), static),
            "peer": (make(peer, False), static)}


def _bench_search(label: str, search: str, passes: dict[str, tuple[Measure, float]], n: int,
                  args: argparse.Namespace, device: torch.device) -> dict:
    """Every method with one search, ``args.decode_repeats`` passes each, alternating;
    each entry keeps its last pass's ``outputs`` (for :func:`_score`)."""
    times = {m: [] for m in passes}
    mems = {m: [] for m in passes}
    outputs = {}
    for r in range(args.decode_repeats):
        for method, (measure, _) in passes.items():
            outputs[method], dt, mib = measure()
            mems[method].append(mib)
            times[method].append(dt)
            log(f"[decode {device.type} {label}] {search} {method} pass {r + 1}/"
                f"{args.decode_repeats}: {n / dt:,.1f} sentences/s ({dt:.2f}s)")
    return {m: {"seconds": statistics.median(times[m]),
                "sentences_per_s": n / statistics.median(times[m]),
                "runs_seconds": times[m],
                "output_tokens": sum(len(o) for o in outputs[m]),
                "peak_mib": static + statistics.median(mems[m]),
                "outputs": outputs[m]}
            for m, (_, static) in passes.items()}


def _full_rule_outputs(work: _Workload, beam: int, args: argparse.Namespace,
                       device: torch.device) -> list[list[int]]:
    """Our beam-search translations by CTranslate2's rule (``beam_rule=full``), untimed:
    what the CTranslate2 rows are compared with."""
    hyps = translate_ids(work.run.model, work.src_ids, beam=beam, max_len_a=work.max_len_a,
                         max_len_b=work.max_len_b, batch_tokens=args.batch_tokens,
                         device=device, beam_rule="full")
    return [h[0][0] for h in hyps]


def _score(entries: dict, work: _Workload, full_rule: list[list[int]] | None = None) -> None:
    """A trained run: each method's BLEU, and how many sentences it translates exactly as
    ours (KV cache) does -- the CTranslate2 rows also as ours by their beam rule
    (``full_rule``; None: greedy, where it is ours), the int8 export also as the float32
    one. Drops the outputs."""
    outputs = {m: e.pop("outputs") for m, e in entries.items()}
    if work.run is None:
        return
    lang = target_language(work.run.config.get("data", {}))

    def same(a: list, b: list) -> int:
        return sum(x == y for x, y in zip(a, b))

    for m, e in entries.items():
        texts = [work.run.tgt_tokenizer.decode(o) for o in outputs[m]]
        e["bleu"] = score(texts, work.refs, lang)[0]
        e["identical_to_ours"] = same(outputs[m], outputs["ours_cache"])
        if m in CT2_METHODS:
            e["identical_to_ours_full_rule"] = same(outputs[m], full_rule or outputs["ours_cache"])
    if "ct2_int8" in entries:
        entries["ct2_int8"]["identical_to_ct2_float32"] = same(outputs["ct2_int8"],
                                                               outputs["ct2_float32"])


def _ratios(row: dict) -> dict:
    g, b = row["greedy"], row["beam5"]
    ratios = {
        "greedy_cache_over_peer": g["ours_cache"]["sentences_per_s"]
        / g["peer"]["sentences_per_s"],
        "greedy_cache_over_nocache": g["ours_cache"]["sentences_per_s"]
        / g["ours_nocache"]["sentences_per_s"],
        "beam5_cache_over_peer": b["ours_cache"]["sentences_per_s"]
        / b["peer"]["sentences_per_s"],
        "beam5_over_greedy_time": b["ours_cache"]["seconds"] / g["ours_cache"]["seconds"],
    }
    for m in CT2_METHODS:
        for search in SEARCHES:
            if m in row[search]:
                ratios[f"{search}_{m}_over_cache"] = (row[search][m]["sentences_per_s"]
                                                      / row[search]["ours_cache"]["sentences_per_s"])
    return ratios


def bench_decoding(args: argparse.Namespace, device: torch.device, data: PreparedData,
                   data_info: dict, meter: MemoryMeter) -> dict:
    """The decoding section of the results: ``{"settings", "sizes": {label: row}}``."""
    n = min(args.sentences, len(data.splits["test"]))
    work = _workload(args, device, data, data_info, n)
    idx_batches = length_batches([len(s) for s in work.src_ids], args.batch_tokens)
    batches = [collate([work.src_ids[i] for i in idx], [[] for _ in idx]).to(device)
               for idx in idx_batches]  # collated up front: the timing is decoding only
    order = [i for idx in idx_batches for i in idx]
    job = None if work.run is None else {  # the CTranslate2 rows, in a process of their own
        "run": str(work.run.run_dir), "checkpoint": str(work.run.checkpoint),
        "device": device.type, "threads": torch.get_num_threads(), "src_ids": work.src_ids,
        "max_len_a": work.max_len_a, "max_len_b": work.max_len_b,
        "batch_tokens": args.batch_tokens}
    results = {}
    with ct2_rows(job) as ct2:
        for label, (ours, peer) in work.models.items():
            ours.eval()
            peer.eval()
            row = {}
            for search, beam in SEARCHES.items():
                passes = _our_passes(ours, peer, batches, order, beam, work, device, meter)
                passes.update(ct2.passes(search) if ct2 else {})
                row[search] = _bench_search(label, search, passes, n, args, device)
                _score(row[search], work,  # greedy is its own full rule: ours_cache
                       _full_rule_outputs(work, beam, args, device) if ct2 and beam > 1 else None)
            row["ratios"] = _ratios(row)
            results[label] = row
    settings = {
        "sentences": n,
        "batches": len(batches),
        "batch_tokens": args.batch_tokens,
        "repeats": args.decode_repeats,
        "model": args.run or "random",
        "max_len_a": work.max_len_a,
        "max_len_b": work.max_len_b,
        "length_rule": work.length_rule,
        "precision": precision_label(device),
        "ct2_threads": torch.get_num_threads() if job is not None else None,
    }
    return {"settings": settings, "sizes": results}
