"""How the benchmark measures: wall time, memory (``/proc``), a training step's FLOPs, the
matmul peak of the machine, and what it ran on."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import gc
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from tinymt import runtime

REPO_ROOT = Path(__file__).resolve().parents[3]  # src/tinymt/bench/ -> the checkout
MIB = 2**20
PEAK_SIZE = {"cpu": 2048, "cuda": 8192}  # the square matmul the peak is measured on
T = TypeVar("T")
log = functools.partial(print, file=sys.stderr, flush=True)  # progress, beside the report


# our own /proc reader: psutil is not a dependency of tinymt, and these are three fields
def proc_status(pid: int | str = "self") -> dict[str, int]:
    """The kB lines of ``/proc/<pid>/status`` (``VmRSS``, ...) in KiB; empty if unreadable."""
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.endswith(" kB"):
                out[key] = int(value.split()[0])
    return out


class MemoryMeter:
    """Peak memory of a measurement beyond what was resident when it began: on CUDA the
    allocator's peak; on a CPU this process's ``VmHWM``, reset at the start (after
    ``malloc_trim`` hands freed heap back), minus ``VmRSS`` then. None where no reset."""

    def __init__(self, device: torch.device):
        self.device, self.cuda, self.base, self.ok = device, device.type == "cuda", 0, True

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:  # a new VmHWM from the present VmRSS
            self.ok = Path("/proc/self/clear_refs").write_text("5") > 0
        except OSError:
            self.ok = False
        self.base = proc_status().get("VmRSS", 0) * 1024

    def end(self) -> float | None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        elif not self.ok:
            return None
        else:
            peak = proc_status().get("VmHWM", 0) * 1024
        return max(0, peak - self.base) / MIB


def timed(work: Callable[[], T], meter: MemoryMeter) -> tuple[T, float, float | None]:
    """``work()``'s result, wall seconds (the GPU synchronised) and MiB beyond the start."""
    meter.begin()
    t0 = time.perf_counter()
    result = work()
    if meter.cuda:
        torch.cuda.synchronize(meter.device)
    return result, time.perf_counter() - t0, meter.end()


def tensor_mib(tensors: Iterable[torch.Tensor]) -> float:
    """MiB of ``tensors``, each storage once (tied weights)."""
    seen = {t.data_ptr(): t.numel() * t.element_size() for t in tensors if t.dim() > 0}
    return sum(seen.values()) / MIB


def training_flops(cfg, tgt_vocab: int, src: torch.Tensor, tgt_out: torch.Tensor,
                   pad_id: int) -> float:
    """Matmul FLOPs of a training step (forward + backward = 3 × forward) on the real
    tokens (``S`` source, ``T`` target a sentence), a ``(m, k) @ (k, n)`` being ``2 m k n``:
    per encoder layer ``S (8 d² + 4 d f) + 4 S² d`` (Q K V O, FFN; scores, weighted sum),
    per decoder layer ``T (12 d² + 4 d f) + 4 S d² + 4 T² d + 4 T S d`` (+ cross-attention's
    K V of the memory), the output projection ``2 T d V``."""
    d, f = cfg.d_model, cfg.d_ff
    S = src.ne(pad_id).sum(dim=1).double()  # (B,)
    T = tgt_out.ne(pad_id).sum(dim=1).double()  # (B,)
    enc = cfg.n_encoder_layers * (S * (8 * d * d + 4 * d * f) + 4 * S * S * d)
    dec = cfg.n_decoder_layers * (T * (12 * d * d + 4 * d * f) + 4 * S * d * d
                                  + 4 * T * T * d + 4 * T * S * d)
    return 3 * float((enc + dec + 2 * T * d * tgt_vocab).sum())


def matmul_peak(device: torch.device, repeats: int = 7, n: int | None = None) -> list[float]:
    """FLOP/s of ``repeats`` timed square matmuls (2048 fp32 on a CPU, 8192 bf16 on a GPU:
    what training runs in) after two untimed ones, at torch's thread setting."""
    n = n or PEAK_SIZE[device.type]
    dtype = runtime.pick_precision("auto", device) or torch.float32
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    out = torch.empty(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    runs = []
    for i in range(repeats + 2):
        sync()
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        if i >= 2:
            runs.append(2 * n**3 / (time.perf_counter() - t0))
    return runs


def git(*args: str) -> str:
    """``git``'s output in the checkout; empty outside one."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout
    return ""


def cpu_name() -> str:
    with contextlib.suppress(OSError):  # platform.processor() is empty on Linux
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_info(device: torch.device, argv: Sequence[str]) -> dict:
    """What measured a section: command, date, commit, software, CPU, GPU."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python scripts/benchmark.py " + shlex.join(argv),
        "git": git("rev-parse", "--short", "HEAD").strip() or "unknown",
        "uncommitted_changes": bool(git("status", "--porcelain").strip()),
        "python": platform.python_version(), "torch": torch.__version__,
        "platform": platform.platform(), "cpu": cpu_name(), "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
