"""What a benchmark ran on: machine, software, code revision, GPU peak."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[3]  # src/tinymt/bench/ -> the checkout

# bf16 dense tensor-core peaks (TFLOP/s), looked up by substring of the device name, in order
PEAK_BF16_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM / HBM3
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
)


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_revision() -> str:
    """The short hash of the checked-out commit, or ``unknown`` outside a git checkout."""
    return (_git("rev-parse", "--short", "HEAD") or "").strip() or "unknown"


def uncommitted_changes() -> list[str]:
    """The paths that differ from the commit: modified, staged or untracked (ignored files
    such as outputs/ are not changes); empty when the working tree is clean or not git."""
    return [line[3:] for line in (_git("status", "--porcelain") or "").splitlines() if line]


def gpu_peak_tflops(name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in name.lower():
            return tflops
    return None


def machine_info(device: torch.device, argv: Sequence[str]) -> dict:
    """The machine section of the results; ``argv``: the benchmark's arguments."""
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python scripts/benchmark.py " + shlex.join(argv),
        "git": git_revision(),
        "uncommitted_changes": bool(uncommitted_changes()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device.type,
        "gpu": None,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info
