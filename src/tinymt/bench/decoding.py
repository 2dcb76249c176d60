"""Decoding throughput: ours with the KV cache, ours recomputing the prefix, and the peer
(recomputing the prefix) -- greedy and beam 5, all through ``tinymt.decoding``."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch
from torch import nn

from tinymt.batching import Batch, collate, length_batches
from tinymt.bench.measure import autocast, log, precision_label, timed
from tinymt.bench.memory import MemoryMeter, tensor_mib
from tinymt.bench.targets import METHODS, SEARCHES
from tinymt.bench.workload import build_pair, model_config
from tinymt.data import PreparedData, normalize
from tinymt.decoding import beam_search, greedy_decode
from tinymt.peer import PeerTransformer
from tinymt.rundir import load_run


@dataclass
class _Workload:
    """The models to decode with and how long their outputs may get."""

    src_ids: list[list[int]]
    models: dict[str, tuple[nn.Module, nn.Module]]  # label -> (ours, peer)
    max_len_a: float
    max_len_b: int
    length_rule: str  # for the report


def decode_once(model: nn.Module, use_cache: bool, beam: int, batches: list[Batch],
                max_len_a: float, max_len_b: int) -> int:
    """One pass over ``batches``; the number of output tokens. ``use_cache=False`` is the
    only way to drive the peer: the whole prefix is recomputed at every step and only its
    last position projected to the vocabulary."""
    out_tokens = 0
    for b in batches:
        kw = {"max_len_a": max_len_a, "max_len_b": max_len_b, "use_cache": use_cache}
        if beam == 1:
            outs = greedy_decode(model, b.src, b.src_pad_mask, **kw)
        else:
            outs = [h[0][0] for h in beam_search(model, b.src, b.src_pad_mask, beam=beam, **kw)]
        out_tokens += sum(len(o) for o in outs)
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
            "method produces the same translations")
    ref_lens = data.lengths("test")[1][:n]
    decode_len = args.decode_len or max(1, round(statistics.mean(ref_lens)))
    models = {size: build_pair(model_config(size), data_info, device) for size in args.size_list}
    return _Workload(
        data.ids("test")[0][:n], models, 0.0, decode_len,
        f"random models: every sentence is decoded to exactly {decode_len} "
        f"tokens (max_len_a=0, max_len_b={decode_len}; the mean test reference "
        "length), EOS aside, so the three methods do the same work; the peer "
        "holds the same weights as ours")


def _bench_search(label: str, search: str, ours: nn.Module, peer: nn.Module,
                  batches: list[Batch], work: _Workload, n: int, args: argparse.Namespace,
                  device: torch.device, meter: MemoryMeter) -> dict:
    """Every method with one search, ``args.decode_repeats`` passes each, alternating."""
    times = {m: [] for m in METHODS}
    mems = {m: [] for m in METHODS}
    toks = {}
    for r in range(args.decode_repeats):
        for method in METHODS:
            model = peer if method == "peer" else ours

            def one_pass(model=model, method=method) -> int:
                with autocast(device):
                    return decode_once(model, method == "ours_cache", SEARCHES[search],
                                       batches, work.max_len_a, work.max_len_b)

            toks[method], dt, mib = timed(one_pass, meter, device)
            mems[method].append(mib)
            times[method].append(dt)
            log(f"[decode {device.type} {label}] {search} {method} pass {r + 1}/"
                f"{args.decode_repeats}: {n / dt:,.1f} sentences/s ({dt:.2f}s)")
    static = tensor_mib(ours.parameters())
    return {m: {"seconds": statistics.median(times[m]),
                "sentences_per_s": n / statistics.median(times[m]),
                "runs_seconds": times[m],
                "output_tokens": toks[m],
                "peak_mib": static + statistics.median(mems[m])}
            for m in METHODS}


def _ratios(row: dict) -> dict:
    g, b = row["greedy"], row["beam5"]
    return {
        "greedy_cache_over_peer": g["ours_cache"]["sentences_per_s"]
        / g["peer"]["sentences_per_s"],
        "greedy_cache_over_nocache": g["ours_cache"]["sentences_per_s"]
        / g["ours_nocache"]["sentences_per_s"],
        "beam5_cache_over_peer": b["ours_cache"]["sentences_per_s"]
        / b["peer"]["sentences_per_s"],
        "beam5_over_greedy_time": b["ours_cache"]["seconds"] / g["ours_cache"]["seconds"],
    }


def bench_decoding(args: argparse.Namespace, device: torch.device, data: PreparedData,
                   data_info: dict, meter: MemoryMeter) -> dict:
    """The decoding section of the results: ``{"settings", "sizes": {label: row}}``."""
    n = min(args.sentences, len(data.splits["test"]))
    work = _workload(args, device, data, data_info, n)
    idx_batches = length_batches([len(s) for s in work.src_ids], args.batch_tokens)
    batches = [collate([work.src_ids[i] for i in idx], [[] for _ in idx]).to(device)
               for idx in idx_batches]  # collated up front: the timing is decoding only
    results = {}
    for label, (ours, peer) in work.models.items():
        ours.eval()
        peer.eval()
        row = {search: _bench_search(label, search, ours, peer, batches, work, n, args,
                                     device, meter)
               for search in SEARCHES}
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
    }
    return {"settings": settings, "sizes": results}
