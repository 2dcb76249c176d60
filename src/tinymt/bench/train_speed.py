"""Training throughput on the same batches, weights and AdamW: *ours* (the trainer's CPU
step: ``speed.use_bit_dropout``, ``speed.linear_cross_entropy``), *plain* (our model with
``nn.Dropout`` and ``loss.sequence_loss`` on full logits) and the *peer* (plain step).
Each round measures the matmul peak, then runs the three in turn, so drift hits all; each
one's FLOP/s (``measure.training_flops``) is reported as a share of the median peak.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from tinymt import runtime
from tinymt.batching import Batch, TokenBatchSampler, collate
from tinymt.bench import measure
from tinymt.bench.workload import build_pair, model_config
from tinymt.data import PreparedData
from tinymt.loss import sequence_loss
from tinymt.model import count_parameters
from tinymt.speed import linear_cross_entropy, use_bit_dropout

LABEL_SMOOTHING, CLIP_NORM = 0.1, 1.0


@dataclass
class _Contender:
    model: nn.Module
    loss_fn: Callable  # (hidden, weight, targets, pad_id, label_smoothing) -> summed loss
    opt: torch.optim.Optimizer
    runs: list[float] = field(default_factory=list)  # target tokens/s
    mem: list[float | None] = field(default_factory=list)  # MiB beyond what was resident
    final_loss: float = float("nan")


def training_batches(data: PreparedData, max_tokens: int, n: int, device: torch.device
                     ) -> list[Batch]:
    """``n`` token-budget train batches of epoch 0 on ``device`` (repeated when fewer)."""
    order = TokenBatchSampler(*data.lengths("train"), max_tokens=max_tokens, seed=0,
                              shuffle=True).batches(0)
    order = (order * (n // len(order) + 1))[:n]
    src, tgt = data.ids("train")
    return [collate([src[i] for i in idx], [tgt[i] for i in idx]).to(device) for idx in order]


def contenders(ours: nn.Module, peer: nn.Module, device: torch.device) -> dict[str, _Contender]:
    made = {"ours": (use_bit_dropout(copy.deepcopy(ours)), linear_cross_entropy),
            "plain": (ours, sequence_loss), "peer": (peer, sequence_loss)}
    out = {}
    for name, (model, loss_fn) in made.items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                weight_decay=0.0, fused=True if device.type == "cuda" else None)
        out[name] = _Contender(model, loss_fn, opt)
    return out


def _step(c: _Contender, b: Batch, pad: int, device: torch.device) -> torch.Tensor:
    c.opt.zero_grad(set_to_none=True)
    with runtime.autocast(device, runtime.pick_precision("auto", device)):
        hidden, _ = c.model(b.src, b.tgt_in)  # (B, T, d)
        loss = c.loss_fn(hidden, c.model.output_proj.weight, b.tgt_out, pad,
                         LABEL_SMOOTHING) / b.tgt_out.ne(pad).sum()  # not read: no wait
    loss.backward()
    torch.nn.utils.clip_grad_norm_(c.model.parameters(), CLIP_NORM)
    c.opt.step()
    return loss.detach()


def _run(c: _Contender, warm: list[Batch], steps: list[Batch], pad: int,
         meter: measure.MemoryMeter, device: torch.device) -> float:
    """Warm-up steps, then the timed ones; the timed seconds."""
    c.model.train()
    for b in warm:
        _step(c, b, pad, device)
    loss, seconds, mib = measure.timed(lambda: [_step(c, b, pad, device) for b in steps][-1], meter)
    c.mem.append(mib)
    c.final_loss = float(loss)
    return seconds


def bench_training(args: argparse.Namespace, device: torch.device, data: PreparedData,
                   data_info: dict, argv: list[str]) -> dict:
    """The training section: ``{"machine", "data", "settings", "sizes": {size: row}}``."""
    pad, meter, peaks, sizes = data.tgt_tokenizer.pad_id, measure.MemoryMeter(device), [], {}
    # a size's own batches at its budget: one for every size, or one a size (zip cuts the rest)
    for size, max_tokens in zip(args.sizes, args.max_tokens * len(args.sizes)):
        batches = training_batches(data, max_tokens, args.warmup + args.steps, device)
        warm, steps = batches[:args.warmup], batches[args.warmup:]
        tokens = sum(b.n_tgt_tokens for b in steps)
        cfg = model_config(size)
        ours, peer = build_pair(cfg, data_info, device)
        racers = contenders(ours, peer, device)
        flops = sum(measure.training_flops(cfg, data_info["vocab"][1], b.src, b.tgt_out, pad)
                    for b in steps)
        for r in range(args.repeats):
            peaks += measure.matmul_peak(device)
            for name, c in racers.items():  # round 1 first meets every timed batch untimed:
                # a GPU's first step on a batch shape costs it ~10x (kernel choice, allocator)
                seconds = _run(c, warm if r else warm + steps, steps, pad, meter, device)
                c.runs.append(tokens / seconds)
                measure.log(f"[train {device.type} {size}] {name} {r + 1}/{args.repeats}: "
                            f"{tokens / seconds:,.0f} target tok/s (loss {c.final_loss:.3f})")
        row = {"params": count_parameters(ours), "flops_per_target_token": flops / tokens,
               "max_tokens": max_tokens, "timed_target_tokens_per_run": tokens}
        for name, c in racers.items():
            static = measure.tensor_mib(c.model.parameters()) + measure.tensor_mib(
                v for s in c.opt.state.values() for v in s.values() if torch.is_tensor(v))
            row[name] = {"tokens_per_s": statistics.median(c.runs), "runs": c.runs,
                         "peak_mib": None if None in c.mem else static + statistics.median(c.mem),
                         "final_loss": c.final_loss}
        sizes[size] = row
        del racers, ours, peer, batches, warm, steps
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    peak = statistics.median(peaks)
    for row in sizes.values():
        for name in ("ours", "plain", "peer"):
            row[name]["share_of_peak"] = (row[name]["tokens_per_s"]
                                          * row["flops_per_target_token"] / peak)
    bf16 = runtime.pick_precision("auto", device) is not None
    return {"machine": measure.machine_info(device, argv), "data": data_info, "settings": {
        "quick": args.quick, "precision": "bf16 autocast" if bf16 else "fp32",
        "warmup": args.warmup, "steps": args.steps, "repeats": args.repeats,
        "timed_batches": args.steps, "matmul_peak_flops": peak, "matmul_peak_runs": peaks,
        "matmul_peak_size": measure.PEAK_SIZE[device.type]}, "sizes": sizes}
