"""Training throughput: ours against the peer, and against our own model with the plain
training step (torch's dropout, the loss on full logits: the step before #36), on the same
batches, same weights, same optimiser; runs alternate ours, plain, peer, ours, ... with a
matmul peak measurement in each round, so that drift hits all of them. Each model's FLOP/s
(counted by :mod:`tinymt.bench.flops`) is reported as a share of that measured peak."""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
from dataclasses import dataclass, field

import torch
from torch import nn

from tinymt.batching import Batch, TokenBatchSampler, collate
from tinymt.bench.flops import PEAK_DTYPE, PEAK_SIZE, matmul_peak, training_flops
from tinymt.bench.machine import gpu_peak_tflops
from tinymt.bench.measure import autocast, log, precision_label, timed
from tinymt.bench.memory import MemoryMeter, optimizer_mib, tensor_mib
from tinymt.bench.workload import build_pair, model_config
from tinymt.data import PreparedData
from tinymt.layers import Dropout
from tinymt.loss import token_nll
from tinymt.model import count_parameters

LABEL_SMOOTHING = 0.1
CLIP_NORM = 1.0


CONTENDERS = ("ours", "plain", "peer")  # the order of every round


@dataclass
class _Contender:
    """One model in the race: its optimiser, what runs it (compiled or not), its runs."""

    model: nn.Module
    opt: torch.optim.Optimizer
    fwd: nn.Module
    fused_loss: bool  # the model computes its loss from targets (ours); else from logits
    runs: list[float] = field(default_factory=list)  # target tokens/s
    mem: list[float] = field(default_factory=list)  # MiB beyond what was resident
    loss: list[float] = field(default_factory=list)  # the last step's loss


def training_batches(data: PreparedData, max_tokens: int, n: int, device: torch.device
                     ) -> list[Batch]:
    """``n`` token-budget train batches, collated and on ``device`` (the epoch-0 order,
    repeated when the split has fewer)."""
    sampler = TokenBatchSampler(*data.lengths("train"), max_tokens=max_tokens, seed=0,
                                shuffle=True)
    order = sampler.batches(0)
    order = (order * (n // len(order) + 1))[:n]
    train_src, train_tgt = data.ids("train")
    return [collate([train_src[i] for i in idx], [train_tgt[i] for i in idx]).to(device)
            for idx in order]


def plain_step_model(model: nn.Module) -> nn.Module:
    """A copy of our model whose dropout is torch's ``nn.Dropout`` (same weights)."""
    plain = copy.deepcopy(model)
    for module in plain.modules():
        for name, child in module.named_children():
            if isinstance(child, Dropout):
                setattr(module, name, nn.Dropout(child.p))
    return plain


def _contender(model: nn.Module, compile_: bool, device: torch.device,
               fused_loss: bool) -> _Contender:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                            weight_decay=0.0, fused=True if device.type == "cuda" else None)
    return _Contender(model, opt, torch.compile(model) if compile_ else model, fused_loss)


def _step(c: _Contender, b: Batch, pad: int, device: torch.device) -> torch.Tensor:
    c.opt.zero_grad(set_to_none=True)
    with autocast(device):
        if c.fused_loss:  # the trainer's step
            loss_sum, _ = c.fwd(b.src, b.tgt_in, targets=b.tgt_out,
                                label_smoothing=LABEL_SMOOTHING)
        else:  # the step before #36, and the peer
            logits, _ = c.fwd(b.src, b.tgt_in)
            loss_sum = token_nll(logits, b.tgt_out, pad, LABEL_SMOOTHING)
    loss = loss_sum / b.n_tgt_tokens
    loss.backward()
    torch.nn.utils.clip_grad_norm_(c.model.parameters(), CLIP_NORM)
    c.opt.step()
    return loss.detach()


def _run(c: _Contender, warm: list[Batch], timed_batches: list[Batch], pad: int,
         meter: MemoryMeter, device: torch.device) -> float:
    """Warm-up steps, then the timed ones; returns the run's seconds."""
    c.model.train()
    for b in warm:
        _step(c, b, pad, device)
    c.opt.zero_grad(set_to_none=True)

    def work() -> torch.Tensor:
        loss = None
        for b in timed_batches:
            loss = _step(c, b, pad, device)
        return loss

    loss, seconds, mib = timed(work, meter, device)
    c.mem.append(mib)
    c.opt.zero_grad(set_to_none=True)
    c.loss.append(float(loss))
    return seconds


def _bench_size(size: str, args: argparse.Namespace, device: torch.device, batches: list[Batch],
                pad: int, data_info: dict, meter: MemoryMeter, peaks: list[float],
                gpu_peak: float | None) -> dict:
    cfg = model_config(size)
    ours, peer = build_pair(cfg, data_info, device)
    params = count_parameters(ours)
    contenders = {"ours": _contender(ours, args.compile, device, fused_loss=True),
                  "plain": _contender(plain_step_model(ours), args.compile, device,
                                      fused_loss=False),
                  "peer": _contender(peer, args.compile, device, fused_loss=False)}
    warm, timed_batches = batches[:args.warmup], batches[args.warmup:]
    tokens = sum(b.n_tgt_tokens for b in timed_batches)
    flops = sum(training_flops(cfg, data_info["vocab"][1], b, pad) for b in timed_batches)
    for r in range(args.repeats):
        peak = matmul_peak(device)
        peaks.extend(peak["runs"])
        log(f"[train {device.type} {size}] matmul peak {peak['flops'] / 1e9:,.0f} GFLOP/s "
            f"({peak['size']}² {peak['dtype']})")
        for name, c in contenders.items():  # alternate, so drift hits all
            dt = _run(c, warm, timed_batches, pad, meter, device)
            c.runs.append(tokens / dt)
            log(f"[train {device.type} {size}] {name} run {r + 1}/{args.repeats}: "
                f"{tokens / dt:,.0f} target tok/s ({dt:.2f}s, loss {c.loss[-1]:.3f})")

    row = {"params": params, "flops_per_target_token": flops / tokens,
           "config": {k: getattr(cfg, k) for k in (
               "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff")}}
    for name, c in contenders.items():
        static = tensor_mib(c.model.parameters()) + optimizer_mib(c.opt)
        tps = statistics.median(c.runs)
        row[name] = {
            "tokens_per_s": tps,
            "runs": c.runs,
            "peak_mib": static + statistics.median(c.mem),
            "static_mib": static,
            "transient_mib": statistics.median(c.mem),
            "final_loss": c.loss[-1],
            "model_flops_per_s": tps * flops / tokens,
            "mfu": (6 * params * tps / (gpu_peak * 1e12)) if gpu_peak else None,
        }
    row["ratio"] = row["ours"]["tokens_per_s"] / row["peer"]["tokens_per_s"]
    row["speedup"] = row["ours"]["tokens_per_s"] / row["plain"]["tokens_per_s"]
    return row


def bench_training(args: argparse.Namespace, device: torch.device, data: PreparedData,
                   data_info: dict, meter: MemoryMeter) -> dict:
    """The training section of the results: ``{"settings", "sizes": {size: row}}``; each
    contender's ``share_of_peak`` is its model FLOP/s over the median of every matmul peak
    run of the section."""
    cuda = device.type == "cuda"
    batches = training_batches(data, args.max_tokens, args.warmup + args.steps, device)
    timed_batches = batches[args.warmup:]
    pad = data.tgt_tokenizer.pad_id
    gpu_peak = (gpu_peak_tflops(torch.cuda.get_device_name(device), args.peak_tflops)
                if cuda else None)
    results, peaks = {}, []
    for size in args.size_list:
        results[size] = _bench_size(size, args, device, batches, pad, data_info, meter, peaks,
                                    gpu_peak)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    peak = statistics.median(peaks)
    for row in results.values():
        for name in CONTENDERS:
            row[name]["share_of_peak"] = row[name]["model_flops_per_s"] / peak
    settings = {
        "precision": precision_label(device),
        "compile": bool(args.compile),
        "max_tokens": args.max_tokens,
        "warmup": args.warmup,
        "steps": args.steps,
        "repeats": args.repeats,
        "timed_target_tokens_per_run": sum(b.n_tgt_tokens for b in timed_batches),
        "timed_batches": len(timed_batches),
        "gpu_peak_tflops": gpu_peak,
        "matmul_peak_flops": peak,
        "matmul_peak_runs": peaks,
        "matmul_peak_size": PEAK_SIZE[device.type],
        "matmul_peak_dtype": str(PEAK_DTYPE[device.type]).removeprefix("torch."),
    }
    return {"settings": settings, "sizes": results}
