"""Share of peak: the arithmetic a training step does (counted from the model's shapes and
the batch's real tokens) against the matmul throughput measured on the same machine, in
the same run."""

from __future__ import annotations

import statistics
import time

import torch

from tinymt.batching import Batch

PEAK_SIZE = {"cpu": 2048, "cuda": 8192}  # square matmul the peak is measured on
PEAK_DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}  # what training runs in


def training_flops(cfg, tgt_vocab: int, batch: Batch, pad_id: int) -> float:
    """Matmul FLOPs of one training step on ``batch``: forward + backward = 3 x forward.

    Counted per sentence on its real tokens (``S`` source, ``T`` target positions; padding
    is not work the model needed): per encoder layer ``S (8 d^2 + 4 d d_ff) + 4 S^2 d``; per
    decoder layer ``T (12 d^2 + 4 d d_ff) + 4 S d^2`` (cross-attention's keys and values)
    ``+ 4 T^2 d + 4 T S d``; the output projection ``2 T d V``. A matmul of ``(m, k)`` by
    ``(k, n)`` is ``2 m k n``; the attention scores and their weighted sum are two.
    """
    d, f = cfg.d_model, cfg.d_ff
    S = batch.src.ne(pad_id).sum(dim=1).double()  # (B,) source tokens per sentence
    T = batch.tgt_out.ne(pad_id).sum(dim=1).double()  # (B,) target tokens per sentence
    enc = cfg.n_encoder_layers * (S * (8 * d * d + 4 * d * f) + 4 * S * S * d)
    dec = cfg.n_decoder_layers * (T * (12 * d * d + 4 * d * f) + 4 * S * d * d
                                  + 4 * T * T * d + 4 * T * S * d)
    out = 2 * T * d * tgt_vocab
    return 3 * float((enc + dec + out).sum())


def matmul_peak(device: torch.device, repeats: int = 7) -> dict:
    """FLOP/s of one square matmul (2048 fp32 on a CPU, 8192 bf16 on a GPU), the median of
    ``repeats`` timed runs after two warm-ups, with torch's current thread setting."""
    n, dtype = PEAK_SIZE[device.type], PEAK_DTYPE[device.type]
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    seconds = []
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            seconds.append(time.perf_counter() - start)
    runs = [2 * n**3 / s for s in seconds]
    return {"flops": statistics.median(runs), "runs": runs, "size": n,
            "dtype": str(dtype).removeprefix("torch.")}
