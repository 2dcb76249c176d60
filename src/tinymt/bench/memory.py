"""Peak memory of one measurement, and the memory a model's own tensors take."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import resource
from collections.abc import Iterable
from pathlib import Path

import torch

MIB = 2**20


class MemoryMeter:
    """Peak memory of one measurement, beyond what was resident when it began.

    CUDA: ``max_memory_allocated`` minus ``memory_allocated`` at the start. CPU: the
    process's resident-set high-water mark, reset at the start (``/proc/self/clear_refs``,
    after ``malloc_trim`` hands freed heap back), minus the RSS at the start. Where the
    reset is not possible, ``ru_maxrss`` growth (process-wide, monotonic: a lower bound).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.method = "cuda" if self.cuda else self._cpu_method()

    @staticmethod
    def _status(key: str) -> int | None:
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return None

    @staticmethod
    def _trim() -> None:
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)

    def _cpu_method(self) -> str:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return "ru_maxrss"
        return "hwm" if self._status("VmHWM") is not None else "ru_maxrss"

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        self._trim()
        if self.method == "hwm":
            Path("/proc/self/clear_refs").write_text("5")
            self.base = self._status("VmRSS")
        else:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def end(self) -> float:
        """MiB above the starting point."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self.method == "hwm":
            peak = self._status("VmHWM")
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, peak - self.base) / MIB

    def describe(self) -> str:
        if self.method == "cuda":
            return ("`torch.cuda.max_memory_allocated` during the timed steps minus what was "
                    "allocated when they began, plus the model's own parameters (+ AdamW state "
                    "when training) counted tensor by tensor")
        if self.method == "hwm":
            return ("process RSS high-water mark (`VmHWM`, reset through `/proc/self/clear_refs` "
                    "after `malloc_trim`) during the timed part minus the RSS when it began, "
                    "plus the model's own parameters (+ AdamW state when training) counted "
                    "tensor by tensor; both models live in one process, so RSS alone would "
                    "mix them")
        return ("growth of the process's max RSS (`ru_maxrss`) during the timed part -- "
                "process-wide and monotonic, so a lower bound -- plus the model's own tensors")


def tensor_mib(tensors: Iterable[torch.Tensor | None]) -> float:
    """MiB of ``tensors``, each storage counted once (tied weights)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total / MIB


def optimizer_mib(optimizer: torch.optim.Optimizer) -> float:
    return tensor_mib(v for state in optimizer.state.values() for v in state.values()
                      if hasattr(v, "data_ptr") and v.dim() > 0)
