"""Where a job runs: device, precision, seeds, (under torchrun) ranks; its progress bar.

Under torchrun (any ``--nproc_per_node``, or ``WORLD_SIZE > 1``) :func:`setup` joins the
process group (NCCL on CUDA, gloo on CPU) and every helper here is the collective version;
otherwise each is the identity (``--nproc_per_node=1`` runs the real NCCL/DDP path).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from tinymt.config import MAX_BEAM_TOKENS
from tinymt.errors import TinyMTError, first_line


@dataclass
class Runtime:
    device: torch.device
    autocast_dtype: torch.dtype | None  # bf16 on CUDA by default, None = fp32
    rank: int = 0
    world_size: int = 1
    distributed: bool = False  # joined a torch.distributed group: collectives and DDP on

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on ``device``; nothing at all when ``dtype`` is None
    (fp32)."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module, inference: bool = False):
    """Eval mode for the block (``inference``: and ``torch.inference_mode``); the model's
    own mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode() if inference else contextlib.nullcontext():
            yield
    finally:
        model.train(was_training)


def progress_bar(it, **kw):
    """``tqdm`` on stderr, redrawn at most once a second (every progress bar of tinymt)."""
    return tqdm(it, file=sys.stderr, dynamic_ncols=True, mininterval=1.0, **kw)


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` = cuda -> mps -> cpu; anything else (spelt as the config's rule allows) is
    checked to exist. The one place a job's device is chosen, and set up (CUDA: below)."""
    if name == "auto":
        mps = getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
        name = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TinyMTError(f"device={name} asked for, but torch sees no CUDA GPU (use device=auto)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # torchrun: each rank its own GPU
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise TinyMTError(f"device={name} asked for, but torch sees {torch.cuda.device_count()} "
                          f"CUDA GPU(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise TinyMTError(f"device={name} asked for, but MPS is not available (use device=auto)")
    if device.type == "cuda":  # cuDNN's attention, first on Hopper and later, builds a plan
        # for every new shape (tens of ms of host each); ours change with every batch and
        # every decoded token. Flash or memory-efficient attention then, with no plan to build
        torch.backends.cuda.enable_cudnn_sdp(False)
    return device


def pick_precision(name: str, device: torch.device) -> torch.dtype | None:
    """``auto``: bf16 autocast on a GPU with bf16 in hardware (compute capability 8.0 on, or
    ROCm; older ones emulate it, slower than fp32), else fp32; ``bf16``: bf16 autocast on
    any device (on a CPU slower, but the GPU's dtype paths)."""
    if name != "auto":
        return torch.bfloat16 if name == "bf16" else None
    native = device.type == "cuda" and torch.cuda.is_available() and (
        bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8)
    return torch.bfloat16 if native else None


def pick_batch_tokens(asked: int, device: torch.device, beam: int = 1) -> int:
    """Source tokens a decoding batch: ``asked``, or for 0 what suits ``device``: 16,384 on
    a CUDA GPU, where a token step is launch-bound (it costs about as much for a hundred
    sentences as for a thousand), else 4,096; hypotheses within ``MAX_BEAM_TOKENS``."""
    return asked or min(16_384 if device.type == "cuda" else 4_096, MAX_BEAM_TOKENS // beam)


class CoreShare:
    """torch's CPU threads: as many as the cores other processes leave idle (one at least,
    torch's default at most), looked at every few seconds in ``/proc/stat`` (Linux; elsewhere
    the default stays). Two trainings on 2 cores then run a thread each, where four threads
    would take turns on two cores: 1.2-1.8x the time alone, not 2.4-3.2x (docs/speed.md)."""

    def __init__(self, on: bool = True, every: float = 2.0):
        self.every, self.most, self.cores = every, torch.get_num_threads(), os.cpu_count() or 1
        self.last = self._read() if on else None  # off: torch's threads stay as they are

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        """``(now, seconds all CPUs were busy, seconds this process ran)``."""
        try:
            with open("/proc/stat") as f:  # cpu  user nice system idle iowait irq softirq
                user, nice, system, _, _, irq, softirq = map(int, f.readline().split()[1:8])
        except (OSError, ValueError):
            return None
        busy, own = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), os.times()
        return time.monotonic(), busy, own.user + own.system

    def __call__(self) -> None:
        if self.last is None or time.monotonic() - self.last[0] < self.every:
            return
        now = self._read()
        wall, busy, own = (a - b for a, b in zip(now, self.last))
        self.last, others = now, max(0.0, busy - own) / wall  # the cores others kept busy
        torch.set_num_threads(max(1, min(self.most, round(self.cores - others))))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup(device: str = "auto", precision: str = "auto", num_threads: int = 0) -> Runtime:
    """Pick the device and precision; join the process group under torchrun."""
    if num_threads > 0:
        torch.set_num_threads(num_threads)
    world_size, rank, local_rank = (int(os.environ.get(k, v)) for k, v in (
        ("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0")))
    dev = pick_device(device, local_rank)
    joined = "TORCHELASTIC_RUN_ID" in os.environ or world_size > 1  # torchrun (any nproc)
    if joined and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        # a rank that dies makes the others fail within the timeout instead of hanging
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                timeout=timedelta(minutes=10))
    return Runtime(dev, pick_precision(precision, dev), rank, world_size, distributed=joined)


def rank_lost(rt: Runtime, e: BaseException) -> str | None:
    """``rank <r>: another rank stopped (<why>)`` when ``e`` is a collective's failure (gloo
    and NCCL raise one here when another rank died or hung), else None."""
    if not (rt.distributed and isinstance(e, RuntimeError)
            and (isinstance(e, dist.DistError) or "gloo" in str(e))):
        return None
    why = first_line(e).rpartition("] ")[2].split(". ")[0]  # no "[file:line]", no advice
    return f"rank {rt.rank}: another rank stopped ({why})"


def teardown(rt: Runtime) -> None:
    if rt.distributed and dist.is_initialized():
        # once a rank ends, torchrun's agent SIGTERMs the others: this one is ending already
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # (with its one line, not killed mute)
        dist.destroy_process_group()


def barrier(rt: Runtime) -> None:
    if rt.distributed:
        dist.barrier()


def broadcast_object(rt: Runtime, obj):
    """Rank 0's ``obj`` on every rank."""
    box = [obj]
    if rt.distributed:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_objects(rt: Runtime, obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank."""
    if not rt.distributed:
        return [obj]
    out = [None] * rt.world_size
    dist.all_gather_object(out, obj)
    return out


def all_reduce(rt: Runtime, values: list[float], op: str = "sum") -> list[float]:
    """Each value summed (``op="max"``: its largest) over the ranks, on every rank; the
    largest is what they must decide together (the wall-clock budget: the slowest step)."""
    if not rt.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.tolist()
