"""Benchmark tinymt against the same model built from ``torch.nn.Transformer``.

    python scripts/benchmark.py --quick                      # < 2 min on a CPU: structure check
    python scripts/benchmark.py --device cpu --json docs/benchmarks.json    # the CPU report
    python scripts/benchmark.py --device cuda --merge docs/benchmarks.json \\
        --json docs/benchmarks-cuda.json                      # add the GPU sections

Measures, in one process:

* training throughput (target tokens/s) of our ``Transformer`` and the ``nn.Transformer``
  peer (``tinymt.peer``) on the same token-budget batches of the Multi30k train split,
  runs alternating ours, peer, ours, peer, ...; median of the repeats; the ratio;
  on CUDA with bf16 autocast and model FLOPs utilisation;
* decoding throughput (sentences/s) on the Multi30k test sentences, greedy and beam 5:
  ours with the KV cache, ours recomputing the prefix, the peer's recompute loop;
* peak memory of each measurement;

and writes a markdown report (``--out``) and, with ``--json``, the raw numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import gc
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = "multi30k-hub-layout"
MIB = 2**20

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

CPU_SIZES = ("tiny", "small")
CUDA_SIZES = ("tiny", "small", "base")
METHODS = ("ours_cache", "ours_nocache", "peer")
METHOD_LABELS = {
    "ours_cache": "ours, KV cache",
    "ours_nocache": "ours, recompute prefix",
    "peer": "peer (nn.Transformer), recompute prefix",
}
SEARCHES = {"greedy": 1, "beam5": 5}
TRAIN_TARGETS = {"cuda": ("base", 1.5), "cpu": (None, 1.0)}  # (size or all, min ours/peer)
CACHE_VS_PEER_TARGET = 3.0  # KV-cache greedy sentences/s over the peer's loop, CPU
BEAM_OVER_GREEDY_TARGET = 2.5  # beam-5 time / greedy time, at most


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- arguments
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/benchmark.py",
        description=(
            "Training and decoding throughput of tinymt's Transformer against the same model "
            "built from torch.nn.Transformer (tinymt.peer), plus peak memory. Writes a "
            "markdown report and optionally JSON."
        ),
        epilog=(
            "Defaults per device: CPU sizes tiny,small, fp32, --max-tokens 4096, --steps 20; "
            "CUDA sizes tiny,small,base, bf16 autocast, --max-tokens 16384, --steps 50. "
            "Without --run, decoding uses randomly initialised models forced to a fixed output "
            "length (--decode-len) so every method does the same work."
        ),
    )
    p.add_argument("--quick", action="store_true",
                   help="smoke run (< 2 min on a CPU): tiny only, 1+3 steps, 1 repeat, "
                        "50 sentences; numbers are not meaningful")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto = cuda when available, else cpu")
    p.add_argument("--sizes", default=None,
                   help="comma-separated model sizes (configs/model/<size>.yaml); default "
                        "tiny,small on CPU, tiny,small,base on CUDA")
    p.add_argument("--steps", type=int, default=None,
                   help="timed training steps per run (default 20 CPU, 50 CUDA)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed training steps before each run (default 3 CPU, 10 CUDA)")
    p.add_argument("--repeats", type=int, default=None,
                   help="training runs per model, alternating ours/peer; the median is "
                        "reported (default 3)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="token budget per training batch, padding included (default 4096 "
                        "CPU, 16384 CUDA)")
    p.add_argument("--sentences", type=int, default=None,
                   help="test sentences to decode (default 1000 = all of Multi30k test)")
    p.add_argument("--decode-repeats", type=int, default=1,
                   help="passes over the test sentences per decoding method; the median is "
                        "reported (default 1)")
    p.add_argument("--batch-tokens", type=int, default=4096,
                   help="source tokens per decoding batch, sentences batched by length "
                        "(default 4096)")
    p.add_argument("--decode-len", type=int, default=None,
                   help="random models only: every sentence decodes exactly this many tokens "
                        "(default: mean test reference length, rounded)")
    p.add_argument("--run", default=None,
                   help="a trained run dir: decode with its model and tokenizer instead of "
                        "random models (stops at EOS; the peer gets the same weights)")
    p.add_argument("--checkpoint", default="best",
                   help="with --run: best | last | avg | path (default best)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile both models for training (decoding stays eager)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default 0 = torch's default)")
    p.add_argument("--data-path", default=None,
                   help="Multi30k in the hub layout (default ../shared/data/"
                        f"{DEFAULT_DATA} beside the repo, or $TINYMT_SHARED_DATA/{DEFAULT_DATA});"
                        " absent: the built-in zh-en corpus, noted in the report")
    p.add_argument("--cache-dir", default="outputs/.cache",
                   help="prepared-data cache, relative to the repo root (default "
                        "outputs/.cache)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="GPU bf16 dense peak for MFU when the GPU is not in the built-in table")
    p.add_argument("--out", default="docs/benchmarks.md",
                   help="markdown report to write (default docs/benchmarks.md)")
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--merge", default=None,
                   help="JSON of an earlier run on another device (e.g. the CPU run): its "
                        "sections are included in this report")
    args = p.parse_args(argv)
    for name in ("steps", "warmup", "repeats", "max_tokens", "sentences", "decode_len"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warmup" else 1):
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def resolve_defaults(args: argparse.Namespace, device_type: str) -> None:
    cuda = device_type == "cuda"
    if args.quick:
        defaults = {"sizes": "tiny", "steps": 3, "warmup": 1, "repeats": 1, "sentences": 50}
    else:
        defaults = {"sizes": ",".join(CUDA_SIZES if cuda else CPU_SIZES),
                    "steps": 50 if cuda else 20, "warmup": 10 if cuda else 3, "repeats": 3,
                    "sentences": 1000}
    defaults["max_tokens"] = 16384 if cuda else 4096
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.size_list = [s.strip() for s in args.sizes.split(",") if s.strip()]


# --------------------------------------------------------------------------- machine
def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True,
                               timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}{' (with uncommitted changes)' if dirty else ''}" if rev else "unknown"


def gpu_peak_tflops(name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in name.lower():
            return tflops
    return None


def machine_info(torch, device) -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python scripts/benchmark.py " + shlex.join(sys.argv[1:]),
        "git": git_revision(),
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


# --------------------------------------------------------------------------- memory
class MemoryMeter:
    """Peak memory of one measurement, beyond what was resident when it began.

    CUDA: ``max_memory_allocated`` minus ``memory_allocated`` at the start. CPU: the
    process's resident-set high-water mark, reset at the start (``/proc/self/clear_refs``,
    after ``malloc_trim`` hands freed heap back), minus the RSS at the start. Where the
    reset is not possible, ``ru_maxrss`` growth (process-wide, monotonic: a lower bound).
    """

    def __init__(self, torch, device):
        self.torch, self.device = torch, device
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
            self.torch.cuda.synchronize(self.device)
            self.base = self.torch.cuda.memory_allocated(self.device)
            self.torch.cuda.reset_peak_memory_stats(self.device)
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
            self.torch.cuda.synchronize(self.device)
            peak = self.torch.cuda.max_memory_allocated(self.device)
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


def tensor_mib(tensors) -> float:
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total / MIB


def optimizer_mib(optimizer) -> float:
    return tensor_mib(v for state in optimizer.state.values() for v in state.values()
                      if hasattr(v, "data_ptr") and v.dim() > 0)


# --------------------------------------------------------------------------- data
def data_folder(args) -> Path:
    if args.data_path:
        return Path(args.data_path)
    env = os.environ.get("TINYMT_SHARED_DATA")
    base = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    return base / DEFAULT_DATA


def load_data(args):
    """Multi30k de->en through ``tinymt.data.prepare``, or the built-in corpus."""
    from tinymt.config import DataConfig
    from tinymt.data import prepare

    folder = data_folder(args)

    def quiet(msg: str) -> None:
        log(f"  {msg}")

    if folder.is_dir():
        # the path as the configs spell it (relative to the repo root) so that the prepared
        # cache of `data=multi30k data.path=../shared/...` is reused
        path = os.path.relpath(folder.resolve(), REPO_ROOT) if folder.is_absolute() else str(folder)
        cfg = DataConfig(name="multi30k", source="hub", path=path, src_lang="de", tgt_lang="en",
                         train_split="train", valid_split="validation", test_split="test",
                         vocab_size=8000, cache_dir=args.cache_dir)
        data = prepare(cfg, log=quiet)
        note = None
        name = f"Multi30k de→en (`{path}`), joint BPE 8000"
    else:
        train_size = 3000 if args.quick else 30000
        cfg = DataConfig(name="builtin_zh_en", source="builtin", src_lang="zh", tgt_lang="en",
                         train_size=train_size, valid_size=10, test_size=1000, vocab_size=2000,
                         cache_dir=args.cache_dir)
        data = prepare(cfg, log=quiet)
        note = (f"Multi30k not found at `{folder}`: measured on the built-in zh→en corpus "
                f"instead ({train_size} training pairs, joint BPE 2000), so the numbers are "
                "not comparable with Multi30k ones (shorter sentences, smaller vocabulary)")
        name = f"built-in zh→en corpus, joint BPE 2000 (fallback: {folder} absent)"
    train_lens = data.lengths("train")
    return data, {"name": name, "note": note, "train_pairs": len(train_lens[0]),
                  "test_pairs": len(data.lengths("test")[0]),
                  "vocab": [data.src_tokenizer.vocab_size, data.tgt_tokenizer.vocab_size],
                  "shared_vocab": data.src_tokenizer is data.tgt_tokenizer}


def model_config(size: str):
    from omegaconf import OmegaConf

    from tinymt.config import ModelConfig
    from tinymt.errors import TinyMTError

    path = REPO_ROOT / "configs" / "model" / f"{size}.yaml"
    if not path.is_file():
        sizes = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise TinyMTError(f"--sizes: no model size {size!r} (configs/model/ has {sizes})")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                               OmegaConf.load(path)))


def build_pair(torch, cfg, data_info, device):
    """Our model and the peer with the same weights."""
    from tinymt.model import Transformer
    from tinymt.peer import PeerTransformer

    src_v, tgt_v = data_info["vocab"]
    torch.manual_seed(0)
    ours = Transformer(cfg, src_v, tgt_v, shared_vocab=data_info["shared_vocab"])
    peer = PeerTransformer(cfg, src_v, tgt_v, shared_vocab=data_info["shared_vocab"])
    peer.load_from_ours(ours)
    return ours.to(device), peer.to(device)


# --------------------------------------------------------------------------- training
def bench_training(torch, args, device, data, data_info, meter) -> dict:
    import torch.nn.functional as F

    from tinymt.batching import TokenBatchSampler, collate
    from tinymt.model import count_parameters

    cuda = device.type == "cuda"
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else \
        contextlib.nullcontext
    sampler = TokenBatchSampler(*data.lengths("train"), max_tokens=args.max_tokens, seed=0,
                                shuffle=True)
    need = args.warmup + args.steps
    order = sampler.batches(0)
    order = (order * (need // len(order) + 1))[:need]
    train_src, train_tgt = data.ids("train")
    batches = [collate([train_src[i] for i in idx], [train_tgt[i] for i in idx]).to(device)
               for idx in order]
    timed = batches[args.warmup:]
    tokens = sum(b.n_tgt_tokens for b in timed)
    pad = data.tgt_tokenizer.pad_id
    peak = gpu_peak_tflops(torch.cuda.get_device_name(device), args.peak_tflops) if cuda else None

    results = {}
    for size in args.size_list:
        cfg = model_config(size)
        ours, peer = build_pair(torch, cfg, data_info, device)
        params = count_parameters(ours)
        entries = {}
        for name, model in (("ours", ours), ("peer", peer)):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                    weight_decay=0.0, fused=True if cuda else None)
            fwd = torch.compile(model) if args.compile else model
            entries[name] = {"model": model, "opt": opt, "fwd": fwd, "runs": [], "mem": [],
                             "loss": []}

        def step(e, b):
            e["opt"].zero_grad(set_to_none=True)
            with autocast():
                logits, _ = e["fwd"](b.src, b.tgt_in)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                   b.tgt_out.reshape(-1), ignore_index=pad, label_smoothing=0.1,
                                   reduction="sum") / b.n_tgt_tokens
            loss.backward()
            torch.nn.utils.clip_grad_norm_(e["model"].parameters(), 1.0)
            e["opt"].step()
            return loss.detach()

        for r in range(args.repeats):
            for name in ("ours", "peer"):  # alternate, so drift hits both
                e = entries[name]
                e["model"].train()
                for b in batches[:args.warmup]:
                    step(e, b)
                e["opt"].zero_grad(set_to_none=True)
                meter.begin()
                t0 = time.perf_counter()
                for b in timed:
                    loss = step(e, b)
                if cuda:
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                e["mem"].append(meter.end())
                e["opt"].zero_grad(set_to_none=True)
                e["loss"].append(float(loss))
                e["runs"].append(tokens / dt)
                log(f"[train {device.type} {size}] {name} run {r + 1}/{args.repeats}: "
                    f"{tokens / dt:,.0f} target tok/s ({dt:.2f}s, loss {float(loss):.3f})")

        row = {"params": params, "config": {k: getattr(cfg, k) for k in (
            "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff")}}
        for name, e in entries.items():
            static = tensor_mib(e["model"].parameters()) + optimizer_mib(e["opt"])
            tps = statistics.median(e["runs"])
            row[name] = {
                "tokens_per_s": tps,
                "runs": e["runs"],
                "peak_mib": static + statistics.median(e["mem"]),
                "static_mib": static,
                "transient_mib": statistics.median(e["mem"]),
                "final_loss": e["loss"][-1],
                "mfu": (6 * params * tps / (peak * 1e12)) if peak else None,
            }
        row["ratio"] = row["ours"]["tokens_per_s"] / row["peer"]["tokens_per_s"]
        results[size] = row
        del entries, ours, peer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    settings = {
        "precision": "bf16 autocast" if cuda else "fp32",
        "compile": bool(args.compile),
        "max_tokens": args.max_tokens,
        "warmup": args.warmup,
        "steps": args.steps,
        "repeats": args.repeats,
        "timed_target_tokens_per_run": tokens,
        "timed_batches": len(timed),
        "gpu_peak_tflops": peak,
    }
    return {"settings": settings, "sizes": results}


# --------------------------------------------------------------------------- decoding
def decode_once(method, search, ours, peer, batches, max_len_a, max_len_b) -> int:
    from tinymt.decoding import beam_search, greedy_decode

    beam = SEARCHES[search]
    out_tokens = 0
    for b in batches:
        kw = {"max_len_a": max_len_a, "max_len_b": max_len_b}
        if beam == 1:
            if method == "peer":
                outs = peer.greedy_decode(b.src, b.src_pad_mask, **kw)
            else:
                outs = greedy_decode(ours, b.src, b.src_pad_mask,
                                     use_cache=method == "ours_cache", **kw)
        else:
            model = peer if method == "peer" else ours
            hyps = beam_search(model, b.src, b.src_pad_mask, beam=beam,
                               use_cache=method == "ours_cache", **kw)
            outs = [h[0][0] for h in hyps]
        out_tokens += sum(len(o) for o in outs)
    return out_tokens


def bench_decoding(torch, args, device, data, data_info, meter) -> dict:
    from tinymt.batching import collate, length_batches
    from tinymt.data import normalize
    from tinymt.peer import PeerTransformer
    from tinymt.rundir import load_run

    cuda = device.type == "cuda"
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else \
        contextlib.nullcontext
    test = data.splits["test"]
    n = min(args.sentences, len(test))
    ref_lens = data.lengths("test")[1][:n]
    if args.run:
        run = load_run(args.run, args.checkpoint, device)
        src_ids = [run.src_tokenizer.encode(normalize(t)) for t in test["src"][:n]]
        peer = PeerTransformer(run.model.config, run.model.src_vocab_size,
                               run.model.tgt_vocab_size, run.model.shared_vocab,
                               run.model.pad_id).load_from_ours(run.model).to(device)
        models = {f"trained ({run.model.config.name})": (run.model, peer)}
        max_len_a, max_len_b = 1.5, 10
        length_rule = ("trained model: stops at EOS, at most 1.5 × source length + 10 tokens "
                       "(the translate defaults); the peer holds the same weights, so every "
                       "method produces the same translations")
    else:
        src_ids = data.ids("test")[0][:n]
        decode_len = args.decode_len or max(1, round(statistics.mean(ref_lens)))
        models = {}
        for size in args.size_list:
            models[size] = build_pair(torch, model_config(size), data_info, device)
        max_len_a, max_len_b = 0.0, decode_len
        length_rule = (f"random models: every sentence is decoded to exactly {decode_len} "
                       f"tokens (max_len_a=0, max_len_b={decode_len}; the mean test reference "
                       "length), EOS aside, so the three methods do the same work; the peer "
                       "holds the same weights as ours")
    idx_batches = length_batches([len(s) for s in src_ids], args.batch_tokens)
    batches = [collate([src_ids[i] for i in idx], [[] for _ in idx]).to(device)
               for idx in idx_batches]

    results = {}
    for label, (ours, peer) in models.items():
        ours.eval()
        peer.eval()
        static = tensor_mib(ours.parameters())
        row = {}
        for search in SEARCHES:
            times = {m: [] for m in METHODS}
            mems = {m: [] for m in METHODS}
            toks = {}
            for r in range(args.decode_repeats):
                for method in METHODS:
                    meter.begin()
                    t0 = time.perf_counter()
                    with autocast():
                        toks[method] = decode_once(method, search, ours, peer, batches,
                                                   max_len_a, max_len_b)
                    if cuda:
                        torch.cuda.synchronize(device)
                    dt = time.perf_counter() - t0
                    mems[method].append(meter.end())
                    times[method].append(dt)
                    log(f"[decode {device.type} {label}] {search} {method} pass {r + 1}/"
                        f"{args.decode_repeats}: {n / dt:,.1f} sentences/s ({dt:.2f}s)")
            row[search] = {
                m: {"seconds": statistics.median(times[m]),
                    "sentences_per_s": n / statistics.median(times[m]),
                    "runs_seconds": times[m],
                    "output_tokens": toks[m],
                    "peak_mib": static + statistics.median(mems[m])}
                for m in METHODS
            }
        g, b = row["greedy"], row["beam5"]
        row["ratios"] = {
            "greedy_cache_over_peer": g["ours_cache"]["sentences_per_s"]
            / g["peer"]["sentences_per_s"],
            "greedy_cache_over_nocache": g["ours_cache"]["sentences_per_s"]
            / g["ours_nocache"]["sentences_per_s"],
            "beam5_cache_over_peer": b["ours_cache"]["sentences_per_s"]
            / b["peer"]["sentences_per_s"],
            "beam5_over_greedy_time": b["ours_cache"]["seconds"] / g["ours_cache"]["seconds"],
        }
        results[label] = row
    settings = {
        "sentences": n,
        "batches": len(batches),
        "batch_tokens": args.batch_tokens,
        "repeats": args.decode_repeats,
        "model": args.run or "random",
        "max_len_a": max_len_a,
        "max_len_b": max_len_b,
        "length_rule": length_rule,
        "precision": "bf16 autocast" if cuda else "fp32",
    }
    return {"settings": settings, "sizes": results}


# --------------------------------------------------------------------------- targets
def evaluate_targets(devices: dict) -> list[dict]:
    rows = []

    def add(name, where, measured, ok):
        rows.append({"target": name, "where": where, "measured": measured, "met": ok})

    cuda = devices.get("cuda")
    if cuda and "base" in cuda["training"]["sizes"]:
        ratio = cuda["training"]["sizes"]["base"]["ratio"]
        add("GPU training ≥ 1.5× peer", "CUDA, base", f"{ratio:.2f}×", ratio >= 1.5)
    else:
        add("GPU training ≥ 1.5× peer", "CUDA, base", "not measured", None)
    cpu = devices.get("cpu")
    for size in CPU_SIZES:
        if cpu and size in cpu["training"]["sizes"]:
            ratio = cpu["training"]["sizes"][size]["ratio"]
            add("CPU training ≥ 1.0× peer", f"CPU, {size}", f"{ratio:.2f}×", ratio >= 1.0)
        else:
            add("CPU training ≥ 1.0× peer", f"CPU, {size}", "not measured", None)
    if cpu:
        for label, row in cpu["decoding"]["sizes"].items():
            r = row["ratios"]["greedy_cache_over_peer"]
            add("KV-cache greedy ≥ 3× peer's recompute loop", f"CPU, {label}", f"{r:.2f}×",
                r >= CACHE_VS_PEER_TARGET)
    else:
        add("KV-cache greedy ≥ 3× peer's recompute loop", "CPU", "not measured", None)
    for dev, res in devices.items():
        if not res:
            continue
        for label, row in res["decoding"]["sizes"].items():
            r = row["ratios"]["beam5_over_greedy_time"]
            add("beam 5 within 2.5× of greedy (time)", f"{dev.upper()}, {label}", f"{r:.2f}×",
                r <= BEAM_OVER_GREEDY_TARGET)
    return rows


# --------------------------------------------------------------------------- report
def fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def mark(ok) -> str:
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def gpu_command(cpu_json: str | None) -> str:
    merge = f" --merge {cpu_json}" if cpu_json else ""
    return (f"python scripts/benchmark.py --device cuda{merge} --json docs/benchmarks-cuda.json "
            "--out docs/benchmarks.md")


def plural(n: int, word: str) -> str:
    suffix = "es" if word.endswith(("s", "ch")) else "s"
    return f"{n:,} {word}{'' if n == 1 else suffix}"


def render_device(dev: str, res: dict, meta: dict) -> list[str]:
    L = []
    tr, de = res["training"], res["decoding"]
    ts = tr["settings"]
    cuda = dev == "cuda"
    machine = res["machine"]
    where = machine["gpu"] if cuda else \
        f"{machine['cpu']}, {plural(machine['torch_threads'], 'thread')}"
    L += [f"### Training throughput ({where})", ""]
    compiled = ", torch.compile on both models" if ts["compile"] else ", eager (no torch.compile)"
    L += [(f"Target tokens per second (teacher-forced forward + backward + AdamW step, grad-norm "
          f"clipping), {ts['precision']}{compiled}; "
          f"batches of ≤ {ts['max_tokens']:,} tokens (padding included) from the train split, "
          f"the same {plural(ts['timed_batches'], 'batch')} "
          f"({ts['timed_target_tokens_per_run']:,} target tokens) timed in every run after "
          f"{plural(ts['warmup'], 'warm-up step')}; {plural(ts['repeats'], 'run')} per model "
          "alternating ours, peer, ours, peer, …; median."), ""]
    head = ("| size | params | ours tok/s | peer tok/s | ours/peer | target | ours peak MiB "
            "| peer peak MiB |")
    sep = "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"
    if cuda:
        head += " ours MFU | peer MFU |"
        sep += " ---: | ---: |"
    L += [head, sep]
    for size, row in tr["sizes"].items():
        o, p = row["ours"], row["peer"]
        tsize, tmin = TRAIN_TARGETS[dev]
        target = f"≥ {tmin:.1f}×" if tsize in (None, size) else "—"
        if target != "—":
            target += f" ({'met' if row['ratio'] >= tmin else 'missed'})"
        line = (f"| {size} | {row['params'] / 1e6:.2f} M | {fmt(o['tokens_per_s'])} | "
                f"{fmt(p['tokens_per_s'])} | **{row['ratio']:.2f}×** | {target} | "
                f"{fmt(o['peak_mib'])} | {fmt(p['peak_mib'])} |")
        if cuda:
            line += "".join(f" {e['mfu'] * 100:.1f}% |" if e["mfu"] is not None else " n/a |"
                            for e in (o, p))
        L.append(line)
    if cuda:
        peak = ts.get("gpu_peak_tflops")
        L += ["", ("MFU = 6 × params × target tokens/s ÷ "
                   + (f"{peak:g} TFLOP/s (the GPU's bf16 dense peak)" if peak else
                      "the GPU's bf16 dense peak (unknown for this GPU: pass --peak-tflops)")
                   + "; it ignores attention FLOPs and the encoder's source tokens.")]
    L += ["", "Final training loss of the last run (sanity: both start from the same weights "
          "and see the same batches): " + ", ".join(
              f"{s} ours {r['ours']['final_loss']:.3f} / peer {r['peer']['final_loss']:.3f}"
              for s, r in tr["sizes"].items()) + ".", ""]

    ds = de["settings"]
    L += [f"### Decoding throughput ({where})", ""]
    L += [(f"{ds['sentences']:,} test sentences in {ds['batches']} length-sorted batch(es) of ≤ "
          f"{ds['batch_tokens']:,} source tokens, {ds['precision']}, median of "
          f"{plural(ds['repeats'], 'pass')} per method; time includes the encoder. "
          f"{ds['length_rule'][0].upper() + ds['length_rule'][1:]}."), ""]
    L += [("| model | search | method | sentences/s | seconds | output tokens | peak MiB "
           "| vs peer |"),
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, row in de["sizes"].items():
        for search in SEARCHES:
            peer_sps = row[search]["peer"]["sentences_per_s"]
            for m in METHODS:
                e = row[search][m]
                L.append(f"| {label} | {search} | {METHOD_LABELS[m]} | "
                         f"{fmt(e['sentences_per_s'], 1)} | {e['seconds']:.2f} | "
                         f"{e['output_tokens']:,} | {fmt(e['peak_mib'])} | "
                         f"{e['sentences_per_s'] / peer_sps:.2f}× |")
    L += ["", ("| model | KV-cache greedy / peer greedy | target | KV-cache / recompute (greedy) "
               "| KV-cache / peer (beam 5) | beam-5 time / greedy time | target |"),
          "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for label, row in de["sizes"].items():
        r = row["ratios"]
        t1 = (f"≥ {CACHE_VS_PEER_TARGET:g}× ("
              f"{'met' if r['greedy_cache_over_peer'] >= CACHE_VS_PEER_TARGET else 'missed'})"
              if not cuda else "— (CPU target)")
        t2 = (f"≤ {BEAM_OVER_GREEDY_TARGET:g}× ("
              f"{'met' if r['beam5_over_greedy_time'] <= BEAM_OVER_GREEDY_TARGET else 'missed'})")
        L.append(f"| {label} | **{r['greedy_cache_over_peer']:.2f}×** | {t1} | "
                 f"{r['greedy_cache_over_nocache']:.2f}× | {r['beam5_cache_over_peer']:.2f}× | "
                 f"**{r['beam5_over_greedy_time']:.2f}×** | {t2} |")
    L.append("")
    return L


def render_markdown(results: dict) -> str:
    meta, devices = results["meta"], results["devices"]
    L = ["# Benchmarks", "",
         ("tinymt's `Transformer` (our attention, `tinymt/attention.py`) against the same model "
         "built from `torch.nn.Transformer` (`tinymt/peer.py`: same widths, heads, layers, FFN, "
         "vocabulary, dropout, pre-LN with final norms, batch-first, same scaled tied "
         "embeddings, sinusoidal positions and output projection -- the same parameter count, "
         "and the same weights in every comparison). "
         "Written by `scripts/benchmark.py`; do not edit the numbers by hand, rerun it."), ""]
    L += ["## Machine and command", "", "| | |", "| --- | --- |"]
    for dev in ("cpu", "cuda"):
        res = devices.get(dev)
        if not res:
            continue
        m = res["machine"]
        L += [f"| {dev.upper()} run: date | {m['date']} |",
              f"| {dev.upper()} run: command | `{m['command']}` |",
              f"| {dev.upper()} run: code | git {m['git']} |",
              f"| {dev.upper()} run: software | torch {m['torch']}"
              + (f" (CUDA {m['cuda']})" if m.get("cuda") else "")
              + f", Python {m['python']}, {m['platform']} |",
              (f"| {dev.upper()} run: CPU | {m['cpu']}, {m['cpu_cores']} cores, "
               f"{m['torch_threads']} torch threads |")]
        if m.get("gpu"):
            L.append(f"| {dev.upper()} run: GPU | {m['gpu']} |")
        L.append(f"| {dev.upper()} run: data | {res['data']['name']}; "
                 f"{res['data']['train_pairs']:,} train / {res['data']['test_pairs']:,} test "
                 "pairs |")
    L.append("")
    notes = [res["data"]["note"] for res in devices.values() if res and res["data"]["note"]]
    if meta.get("quick"):
        notes.append("`--quick` run: a smoke test of the benchmark itself (few steps, few "
                     "sentences); its numbers are not meaningful")
    for note in notes:
        L += [f"> **Note:** {note}.", ""]

    L += ["## Targets", "", "Measured ratios beside the targets, met or not.", "",
          "| target | where | measured | met |", "| --- | --- | ---: | --- |"]
    for t in results["targets"]:
        L.append(f"| {t['target']} | {t['where']} | {t['measured']} | {mark(t['met'])} |")
    L.append("")

    cpu_json = meta.get("json")
    for dev, title in (("cpu", "CPU"), ("cuda", "CUDA")):
        L += [f"## {title}", ""]
        res = devices.get(dev)
        if res:
            L += render_device(dev, res, meta)
        elif dev == "cuda":
            why = ("no GPU on this machine" if not meta.get("cuda_available")
                   else "this run used --device cpu")
            L += [(f"Not measured: {why}. On a machine with a GPU run (`--merge` keeps the "
                   "CPU sections; add `--data-path <dir>/multi30k-hub-layout` where "
                   "`../shared/data` is not beside the repo):"), "", "```",
                  gpu_command(cpu_json), "```", ""]
        else:
            L += ["Not measured in this run. On the CPU machine run:", "", "```",
                  "python scripts/benchmark.py --device cpu --json docs/benchmarks.json", "```",
                  ""]

    meter = meta.get("memory_method", {})
    L += ["## Method", ""]
    memory = meter.get("cpu", meter.get("cuda", "see the JSON"))
    if "cpu" in meter and "cuda" in meter:
        memory += "; on CUDA: " + meter["cuda"]
    L += [
        ("- **One process, same work.** For every size our model is built from the size's "
         "`configs/model/<size>.yaml`, the peer copies its weights "
         "(`PeerTransformer.load_from_ours`), and both train on the same pre-collated batches "
         "(tokens already on the device, so data loading is not timed) with the same AdamW "
         "(lr 1e-4, betas 0.9/0.98, fused on CUDA), label-smoothed (0.1) cross-entropy and "
         "grad-norm clipping at 1.0. Runs alternate ours, peer, ours, peer, … so that thermal "
         "or background drift hits both; each run re-does its warm-up steps; the median run "
         "is reported."),
        ("- **Throughput** counts target tokens (`tgt_out` without padding) of the timed steps "
         "divided by their wall time (`time.perf_counter`, after `torch.cuda.synchronize` on "
         "GPU)."),
        ("- **Decoding**: ours with the KV cache (`greedy_decode` / `beam_search`, "
         "`use_cache=True`), ours re-running the decoder on the whole prefix each step "
         "(`use_cache=False`), and the peer: its own greedy loop "
         "(`PeerTransformer.greedy_decode`: recompute the prefix, project only the last "
         "position) and, for beam 5, `tinymt.decoding.beam_search` driving the peer's `decode` "
         "(recompute, no cache). Finished sentences leave the batch in every method. "
         "Sentences/s = test sentences ÷ wall time of one pass over all batches (encoder "
         "included)."),
        f"- **Peak memory**: {memory}.",
        ("- **Precision**: fp32 on CPU; bf16 autocast for both models on CUDA (ours then uses "
         "`scaled_dot_product_attention`'s fused kernels, the peer `nn.MultiheadAttention`), "
         "`torch.set_float32_matmul_precision('high')`."),
    ]
    L += ["", "## Commands", "", "```",
          "# CPU report (this file) + raw numbers; --quick for a < 2 min smoke run",
          "python scripts/benchmark.py --device cpu --json docs/benchmarks.json",
          "# GPU sections, keeping the CPU ones",
          gpu_command("docs/benchmarks.json"),
          "# decoding with a trained model instead of random weights",
          "python scripts/benchmark.py --run outputs/<date>/<time>",
          "```", ""]
    return "\n".join(L)


# --------------------------------------------------------------------------- main
def json_name(path: str | None) -> str | None:
    """How the report names the JSON: relative to the repo root when inside it."""
    if not path:
        return None
    rel = os.path.relpath(path, REPO_ROOT)
    return path if rel.startswith("..") else rel


def main(argv=None) -> int:
    args = parse_args(argv)
    cwd = Path.cwd()
    for name in ("out", "json", "merge", "run", "data_path"):
        value = getattr(args, name)
        if value:
            setattr(args, name, str((cwd / value).resolve()) if name != "run" or
                    value != "latest" else value)
    os.chdir(REPO_ROOT)  # data/cache paths as the configs spell them

    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import torch

    from tinymt.cli import one_line_errors
    from tinymt.errors import TinyMTError

    @one_line_errors
    def run() -> int:
        if args.threads:
            torch.set_num_threads(args.threads)
        cuda_available = torch.cuda.is_available()
        if args.device == "cuda" and not cuda_available:
            raise TinyMTError("--device cuda: torch sees no CUDA GPU (use --device cpu)")
        device = torch.device("cuda" if args.device == "cuda" or
                              (args.device == "auto" and cuda_available) else "cpu")
        if device.type == "cuda":
            torch.set_float32_matmul_precision("high")
        resolve_defaults(args, device.type)
        for size in args.size_list:
            model_config(size)  # fail early on a bad --sizes
        merged = {}
        if args.merge:
            try:
                merged = json.loads(Path(args.merge).read_text())["devices"]
            except (OSError, ValueError, KeyError) as e:
                raise TinyMTError(f"--merge {args.merge}: not a benchmark JSON ({e})") from None

        t_start = time.time()
        log(f"benchmark on {device.type}: sizes {','.join(args.size_list)}, "
            f"{torch.get_num_threads()} threads")
        data, data_info = load_data(args)
        meter = MemoryMeter(torch, device)
        training = bench_training(torch, args, device, data, data_info, meter)
        decoding = bench_decoding(torch, args, device, data, data_info, meter)
        mine = {"machine": machine_info(torch, device), "data": data_info,
                "training": training, "decoding": decoding,
                "memory_method": meter.describe(),
                "wall_seconds": round(time.time() - t_start, 1)}
        devices = {dev: merged.get(dev) for dev in ("cpu", "cuda")}
        devices[device.type] = mine
        memory_methods = {dev: res["memory_method"] for dev, res in devices.items() if res}
        results = {
            "schema": 1,
            "meta": {"quick": bool(args.quick), "json": json_name(args.json),
                     "cuda_available": cuda_available,
                     "memory_method": memory_methods, "device": device.type},
            "devices": devices,
            "targets": evaluate_targets(devices),
        }
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_markdown(results))
        log(f"report: {out} ({mine['wall_seconds']:.0f}s)")
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=2) + "\n")
            log(f"json: {path}")
        for t in results["targets"]:
            log(f"  {t['target']:<45} {t['where']:<22} {t['measured']:>12}  {mark(t['met'])}")
        return 0

    return run()


if __name__ == "__main__":
    sys.exit(main())
