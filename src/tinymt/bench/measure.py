"""Timing one measurement: wall time (after a CUDA sync), peak memory, progress lines."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import torch

from tinymt import runtime
from tinymt.bench.memory import MemoryMeter

T = TypeVar("T")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def precision(device: torch.device) -> torch.dtype | None:
    """What the benchmark runs in: bf16 autocast on CUDA, fp32 (None) on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else None


def precision_label(device: torch.device) -> str:
    return "bf16 autocast" if precision(device) is not None else "fp32"


def autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """The benchmark's :func:`precision` as a context (:func:`tinymt.runtime.autocast`)."""
    return runtime.autocast(device, precision(device))


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
