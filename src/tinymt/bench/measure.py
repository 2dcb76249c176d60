"""Timing one measurement: wall time (after a CUDA sync), peak memory, progress lines."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from tinymt.bench.memory import MemoryMeter

T = TypeVar("T")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA, nothing (fp32) on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def timed(work: Callable[[], T], meter: MemoryMeter, device: torch.device
          ) -> tuple[T, float, float]:
    """Run ``work()``: its result, its wall seconds (the GPU synchronised at the end) and
    the MiB it needed beyond what was resident when it began."""
    meter.begin()
    t0 = time.perf_counter()
    result = work()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    return result, seconds, meter.end()
