"""The CUDA path: fused SDPA kernels in bf16, cached decoding, bf16 + fused AdamW + compile
training, torchrun with NCCL, translate and the attention figures, all on a GPU.

Every test here is marked ``cuda`` and skipped, with the reason, on a machine without a
GPU. With a CUDA build of torch (docs/benchmarks.md, "On a CUDA GPU, step by step"):
``python -m pytest -q -m cuda``.
"""

import subprocess
import sys
import warnings
from functools import partial

import pytest
import torch
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO_ROOT, TINY_TRAIN_OVERRIDES, compose_train
from tinymt import KINDS
from tinymt.attention import MultiHeadAttention
from tinymt.checkpoint import load_checkpoint
from tinymt.config import ModelConfig
from tinymt.decoding import beam_search, greedy_decode, greedy_search
from tinymt.model import Transformer, causal_mask
from tinymt.rundir import checkpoint_path, load_run
from tinymt.runtime import pick_device
from tinymt.trainer import train
from tinymt.translate import translate

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch.cuda.is_available() is False here)"),
]
CUDA = torch.device("cuda")


def bf16():
    return torch.autocast("cuda", dtype=torch.bfloat16)


# --------------------------------------------------------------------------- attention
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
def test_sdpa_kernels_match_explicit_weights_in_bf16(causal, padding):
    """The fused path (flash / memory-efficient SDPA) and the explicit-weights path agree in
    bf16 within 3e-2 (absolute and relative: bf16 keeps 8 mantissa bits), and both are that
    close to the float32 result."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(256, 8).to(CUDA).eval()
    x = torch.randn(4, 37, 256, device=CUDA)
    mask = (torch.arange(37, device=CUDA)[None, None, None, :]
            < torch.tensor([37, 30, 9, 1], device=CUDA)[:, None, None, None]) if padding else None
    if causal:
        tri = causal_mask(37, CUDA)
        mask = tri if mask is None else mask & tri
    with torch.no_grad():
        ref, _ = mha(x, mask=mask, need_weights=True)  # fp32
        with bf16():
            fused, _ = mha(x, mask=mask)
            explicit, w = mha(x, mask=mask, need_weights=True)
    assert fused.dtype == explicit.dtype == torch.bfloat16 and w.dtype == torch.float32
    torch.testing.assert_close(fused.float(), explicit.float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(fused.float(), ref, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-5, rtol=0)


def random_model(seed=0, vocab=300):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128,
                      dropout=0.0, max_positions=128)
    model = Transformer(cfg, vocab, vocab, shared_vocab=True).to(CUDA).eval()
    with torch.no_grad():
        model.output_proj.weight.mul_(4.0)  # peaked distributions: a non-trivial search
    return model


def test_new_shapes_run_fused_attention_but_not_cudnns():
    """Attention's shapes change with every batch and every decoded token, and cuDNN's
    attention (first in torch's order on Hopper and later GPUs) builds a plan for each new
    one: tens of ms of host a shape. On the device :func:`pick_device` sets up, training
    steps on five shapes and a cached greedy search run a fused kernel, never cuDNN's."""
    pick_device("cuda")
    model = random_model().train()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for b, s, t in [(3, 7, 9), (5, 11, 4), (2, 30, 17), (8, 5, 5), (1, 13, 21)]:
            src, tgt = (torch.randint(4, 300, (b, n), device=CUDA) for n in (s, t))
            with bf16():
                hidden, _ = model(src, tgt)  # (b, t, d)
            hidden.float().square().mean().backward()
        greedy_search(model, src)
    ops = {e.key for e in prof.key_averages()}
    assert {"aten::_scaled_dot_product_efficient_attention",
            "aten::_scaled_dot_product_flash_attention"} & ops, sorted(ops)
    assert not [op for op in ops if "cudnn" in op and "attention" in op]


def test_kv_cache_decoding_equals_full_decoding_on_gpu():
    model = random_model()
    g = torch.Generator().manual_seed(1)
    lengths = [12, 5, 30, 1, 17]
    src = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, 300, (n,), generator=g)
    src = src.to(CUDA)
    cached = greedy_search(model, src)
    full = greedy_decode(model, src)  # the core's plain loop: the whole prefix every step
    assert cached == full and any(len(t) > 3 for t in cached)
    cached_b = beam_search(model, src, beam=4, nbest=4)
    full_b = beam_search(model.cpu(), src.cpu(), beam=4, nbest=4)  # the same search on CPU
    assert [[t for t, _ in h] for h in cached_b] == [[t for t, _ in h] for h in full_b]
    for hc, hf in zip(cached_b, full_b):
        assert [s for _, s in hc] == pytest.approx([s for _, s in hf], abs=1e-4)


def synchronizing(run, *args, **kwargs) -> int:
    """How often ``run(*args, **kwargs)`` made the host wait for the GPU: torch's sync debug
    mode warns at every wait (a read, a shape that depends on values, a copy from pageable
    memory)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchronizing" in str(w.message) for w in caught)


@pytest.mark.parametrize("rule", [None, "shrink", "full"])
def test_decoding_waits_for_the_gpu_once_a_token_step(rule, monkeypatch):
    """Greedy and beam search (both rules) wait for the GPU once a token step (the step's
    one read) and once a batch (the length caps): tests/test_decoding.py counts the waits
    it can see on a CPU, this the ones only a GPU shows."""
    import tinymt.decoding.search as search

    pick_device("cuda")  # as every script: cuDNN's attention off
    model, src = random_model(), torch.randint(4, 300, (6, 9), device=CUDA)
    src[1, 3:] = src[4, 6:] = model.pad_id  # sentences of other lengths leave earlier
    steps, real = [], search.next_logits
    monkeypatch.setattr(search, "next_logits", lambda *args: steps.append(1) or real(*args))
    run = partial(beam_search, beam=4, nbest=2, rule=rule) if rule else greedy_search
    run(model, src)  # torch's lazy set-up first
    steps.clear()
    waits = synchronizing(run, model, src)
    assert len(steps) > 5 and waits <= len(steps) + 1, (waits, len(steps))


# --------------------------------------------------------------------------- training
def _scalars(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("train/loss")], acc.Tags()["images"]


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    """A tiny run trained on the GPU: bf16 autocast, fused AdamW, torch.compile."""
    tmp = tmp_path_factory.mktemp("gpu_run")
    train(compose_train(tmp, "trainer.device=cuda", "trainer.precision=bf16",
                        "trainer.compile=true", "optim.fused=true", "trainer.max_steps=60",
                        "trainer.valid_every=30", "trainer.num_threads=0",
                        "trainer.attention_images=true"))
    return tmp / "run"


def test_bf16_fused_adamw_compile_training_on_gpu(gpu_run):
    losses, images = _scalars(gpu_run)
    assert len(losses) == 60 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-15:]) / 15 < sum(losses[:15]) / 15 - 0.5  # it learned
    state = load_checkpoint(checkpoint_path(gpu_run, "last"))
    assert {v.dtype for v in state["model"].values() if v.is_floating_point()} == {torch.float32}
    assert not any(k.startswith("_orig_mod.") for k in state["model"])
    # the figures were drawn from the GPU run: every kind, at both validations
    assert {t.split("/")[1] for t in images if t.startswith("attention/")} == set(KINDS)
    # the checkpoint loads on a machine without a GPU
    run = load_run(str(gpu_run), "last", "cpu")
    assert next(run.model.parameters()).device.type == "cpu"


def test_training_waits_for_the_gpu_only_to_read_the_losses(tmp_path, monkeypatch):
    """From the second step on (the first sets the optimizer's state up) a training step
    never makes the host wait for the GPU: its forward and backward passes, the batch's
    copy, clipping and the fused update. The loop waits only where it must (reading the
    losses at a log, validating; tests/test_trainer.py counts the reads a CPU shows)."""
    import tinymt.trainer.loop as loop

    waits = {"train_step": [], "optimizer_step": []}

    def counted(name):
        real = getattr(loop, name)

        def call(t, *args):
            if not waits[name] and t.state["step"] == 0:  # the first step: not counted
                waits[name].append(None)
                return real(t, *args)
            out = []
            waits[name].append(synchronizing(lambda: out.append(real(t, *args))))
            return out[0]
        return call

    for name in waits:
        monkeypatch.setattr(loop, name, counted(name))
    train(compose_train(tmp_path, "trainer.device=cuda", "trainer.max_steps=12",
                        "trainer.valid_every=6", "trainer.log_every=4"))
    assert waits == {name: [None] + [0] * 11 for name in waits}


@pytest.mark.parametrize("read", ["at each log", "at the time budget"])
def test_the_training_clock_counts_what_the_gpu_has_queued(tmp_path, monkeypatch, read):
    """A step does not wait for the GPU, so the host runs ahead of it; ``train_seconds``
    (and the log's tokens/s, and the time budget) must still count the GPU's time. Each
    step here queues a quarter of a second of GPU work the host does not wait for: a clock
    of the host's time alone would miss what is queued when the losses are read, at each
    log (``log_every=1``), or only once, when the host's clock reaches a budget of 12 steps
    (no log before)."""
    import tinymt.trainer.loop as loop

    def gpu_seconds(cycles):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)  # a kernel that spins for this many GPU clock cycles
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000

    gpu_seconds(10**6)
    cycles = int(10**8 * 0.25 / gpu_seconds(10**8))
    busy = gpu_seconds(cycles)
    real = loop.optimizer_step
    monkeypatch.setattr(loop, "optimizer_step",
                        lambda t: (torch.cuda._sleep(cycles), real(t))[1])
    steps = ("trainer.max_steps=12", "trainer.valid_every=12", "trainer.log_every=1") \
        if read == "at each log" else ("trainer.max_steps=1000", "trainer.valid_every=1000",
                                       "trainer.log_every=1000", f"trainer.max_minutes={busy / 5}")
    metrics = train(compose_train(tmp_path, "trainer.device=cuda", *steps))
    assert metrics["train_seconds"] >= 0.9 * metrics["steps"] * busy
    assert metrics["steps"] >= 12 and metrics["stop_reason"] in ("max_steps", "max_minutes")


def test_translate_on_cuda(gpu_run, tmp_path, capsys):
    sentences = ["我请李雷帮我订了去北京的机票。", "他喜欢猫吗？", "那只小猫昨天在公园里追了一只蝴蝶。"]
    out = {}
    for device in ("cuda", "cpu"):
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
            cfg = compose(config_name="translate", overrides=[
                f"run={gpu_run}", "checkpoint=last", f"device={device}", "decode.beam=1",
                f"attention={tmp_path / device}"])
        out[device] = translate(cfg, sentences)["translations"]
        capsys.readouterr()
    assert len(out["cuda"]) == 3
    # float32 on both devices: the same greedy translations, bar near-ties
    assert sum(a == b for a, b in zip(out["cuda"], out["cpu"])) >= 2
    assert len(list((tmp_path / "cuda").glob("line*.png"))) == 3


def test_torchrun_one_process_nccl(tmp_path):
    """``torchrun --nproc_per_node=1`` joins a real NCCL process group (DDP, collectives)."""
    run_dir = tmp_path / "run"
    overrides = [*TINY_TRAIN_OVERRIDES, f"data.cache_dir={tmp_path / 'cache'}",
                 "trainer.device=cuda", "trainer.max_steps=20", "trainer.valid_every=20",
                 f"run_dir={run_dir}", f"hydra.run.dir={run_dir}"]
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
         "scripts/train.py", *overrides],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 process (nccl)" in r.stdout
    losses, _ = _scalars(run_dir)
    assert len(losses) == 20 and all(torch.isfinite(torch.tensor(losses)))

