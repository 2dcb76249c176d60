"""Decoding throughput, greedy and beam 5: ours on the KV cache
(:func:`tinymt.decoding.translate_ids`), and for greedy the core's plain loop
(:func:`tinymt.decoding.greedy_decode`: the prefix recomputed every step) on ours and on
the peer; with a trained run (``--run``) also every method's BLEU."""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import torch

from tinymt import runtime
from tinymt.batching import collate, length_batches
from tinymt.bench import measure
from tinymt.bench.peer import PeerTransformer
from tinymt.bench.workload import build_pair, model_config
from tinymt.data import PreparedData, target_language
from tinymt.decoding import greedy_decode, translate_ids
from tinymt.metrics import score
from tinymt.rundir import LoadedRun, load_run
from tinymt.translate import source_ids

SEARCHES = {"greedy": 1, "beam5": 5}  # name -> beam
WARM_SENTENCES = 32  # each method's untimed first pass, before the timed ones
Measured = tuple[list[list[int]], float, float | None]  # a pass: outputs, seconds, MiB


def _workload(args: argparse.Namespace, device: torch.device, data: PreparedData,
              data_info: dict, n: int) -> tuple[list[list[int]], dict, dict, LoadedRun | None, str]:
    """The source ids, the length rule's keywords, the models by label, the trained run
    (or None) and the rule in words."""
    kw = {"max_len_a": 1.5, "max_len_b": 10,  # translate.py's defaults
          "batch_tokens": runtime.pick_batch_tokens(0, device, max(SEARCHES.values()))}
    if args.run:
        run = load_run(args.run, args.checkpoint, device)
        src_ids = source_ids(run, data.splits["test"]["src"][:n], copy=False)[1]  # as translate.py
        return src_ids, kw, {f"trained ({run.model.config.name})": (
            run.model, PeerTransformer(run.model).to(device))}, run, (
            "a trained model: stops at EOS, at most 1.5 × source length + 10 tokens "
            "(translate.py's defaults)")
    length = max(1, round(statistics.mean(data.lengths("test")[1][:n])))
    kw.update(max_len_a=0.0, max_len_b=length)
    models = {size: build_pair(model_config(size), data_info, device) for size in args.sizes}
    return data.ids("test")[0][:n], kw, models, None, (
        f"random models: every sentence decoded to exactly {length} tokens (the mean test "
        "reference length), so every method does the same work")


def bench_decoding(args: argparse.Namespace, device: torch.device, data: PreparedData,
                   data_info: dict, argv: list[str]) -> dict:
    """The decoding section: ``{"machine", "data", "settings", "sizes": {label: row}}``."""
    n = min(args.sentences, len(data.splits["test"]))
    src_ids, kw, models, run, rule = _workload(args, device, data, data_info, n)
    meter, sizes = measure.MemoryMeter(device), {}

    def timed(translate: Callable[[list], list], ids=src_ids) -> Measured:
        with runtime.autocast(device, runtime.pick_precision("auto", device)):
            return measure.timed(lambda: translate(ids), meter)

    for label, (model, peer) in models.items():
        static = measure.tensor_mib(model.parameters())
        row = sizes[label] = {}
        for search, beam in SEARCHES.items():
            on = {"device": device, "kw": kw}
            methods = {"ours_cache": functools.partial(cached, model, beam=beam, **on)}
            if beam == 1:  # the plain loop has no beam search
                methods.update(ours_nocache=functools.partial(plain_greedy, model, **on),
                               peer=functools.partial(plain_greedy, peer, **on))
            for translate in methods.values():
                timed(translate, src_ids[:WARM_SENTENCES])  # untimed: a GPU's first
                # calls of a kernel pay its set-up (the first method ran at 0.4x without)
            runs = {m: [] for m in methods}
            for r in range(args.decode_repeats):  # the methods alternate
                for method, translate in methods.items():
                    runs[method].append(timed(translate))
                    measure.log(f"[decode {device.type} {label}] {search} {method} {r + 1}/"
                        f"{args.decode_repeats}: {n / runs[method][-1][1]:,.1f} sentences/s")
            row[search] = {m: _entry(runs[m], static, n) for m in methods}
            if run is not None:
                _score(row[search], runs, run, list(data.splits["test"]["tgt"][:n]))
    return {"machine": measure.machine_info(device, argv), "data": data_info, "settings": {
        "quick": args.quick, "sentences": n, "repeats": args.decode_repeats,
        "model": "trained" if run else "random", "length_rule": rule, **kw}, "sizes": sizes}


def cached(model, ids: list[list[int]], beam: int, device: torch.device, kw: dict
           ) -> list[list[int]]:
    """Ours on the KV cache: the best output of each sentence by :func:`translate_ids`."""
    return [h[0][0] for h in translate_ids(model, ids, beam=beam, device=device, **kw)]


def plain_greedy(model, ids: list[list[int]], device: torch.device, kw: dict) -> list[list[int]]:
    """The core's greedy loop over ``ids``, in the batches :func:`translate_ids` makes."""
    outputs: dict[int, list[int]] = {}
    for idx in length_batches([len(s) for s in ids], kw["batch_tokens"]):
        src = collate([ids[i] for i in idx], [[] for _ in idx]).src.to(device)
        outputs.update(zip(idx, greedy_decode(model, src, max_len_a=kw["max_len_a"],
                                              max_len_b=kw["max_len_b"])))
    return [outputs[i] for i in range(len(ids))]


def _entry(runs: list[Measured], static_mib: float, n: int) -> dict:
    seconds = statistics.median(r[1] for r in runs)
    mibs = [r[2] for r in runs]  # None: no reset of the high-water mark here
    return {"sentences_per_s": n / seconds, "seconds": seconds,
            "output_tokens": sum(len(o) for o in runs[-1][0]),
            "peak_mib": None if None in mibs else static_mib + statistics.median(mibs)}


def _score(entries: dict, runs: dict[str, list[Measured]], run: LoadedRun, refs: list[str]) -> None:
    """Each method's BLEU, and the sentences it translates exactly as ours with the cache."""
    lang = target_language(run.config.get("data", {}))
    ours = runs["ours_cache"][-1][0]
    for method, e in entries.items():
        outputs = runs[method][-1][0]
        e["bleu"] = score([run.tgt_tokenizer.decode(o) for o in outputs], refs, lang)[0]
        e["identical_to_ours"] = sum(a == b for a, b in zip(outputs, ours))
