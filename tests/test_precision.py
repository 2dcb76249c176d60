"""bf16 autocast and torch.compile, on the CPU: the dtype paths the GPU takes, run here.

CUDA runs bf16 autocast by default; on CPU ``trainer.precision=bf16`` goes through the same
code (masks, ``-inf`` fills, softmax, the attention weights drawn as figures, the loss in
float32, float32 master weights in the checkpoint). These tests train with it, and with
``trainer.compile=true``, and use the results everywhere a run is used.
"""

import functools
import time

import pytest
import torch
from hydra import compose, initialize_config_dir
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import REPO_ROOT, compose_train
from tinymt import KINDS
from tinymt.attention import MultiHeadAttention
from tinymt.attention_maps import collect_attention
from tinymt.batching import collate
from tinymt.checkpoint import load_checkpoint
from tinymt.config import ModelConfig
from tinymt.loss import token_nll
from tinymt.model import Transformer, causal_mask
from tinymt.rundir import checkpoint_path, load_run
from tinymt.trainer import train
from tinymt.translate import translate

BF16 = torch.bfloat16


def cpu_bf16():
    return torch.autocast("cpu", dtype=BF16)


# --------------------------------------------------------------------------- attention
def mha_inputs(seed=0):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 7, 32)
    pad = torch.arange(7)[None, :] >= torch.tensor([7, 4, 1])[:, None]  # (B, T) True = pad
    return mha, x, pad


@pytest.mark.parametrize("causal", [False, True])
def test_attention_weights_under_bf16_autocast(causal):
    mha, x, pad = mha_inputs()
    mask = ~pad[:, None, None, :] & (causal_mask(7) if causal else True)  # True = may attend
    with torch.no_grad():
        ref_out, ref_w = mha(x, mask=mask, need_weights=True)
        with cpu_bf16():
            out, w = mha(x, mask=mask, need_weights=True)
            fused, none = mha(x, mask=mask)  # the SDPA path
    assert none is None
    # the projections run in bf16; the weights the figures draw are float32 probabilities
    assert out.dtype == fused.dtype == BF16
    assert w.dtype == torch.float32 and w.shape == (3, 4, 7, 7)
    assert torch.isfinite(w).all() and torch.isfinite(out.float()).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 7), atol=1e-6, rtol=0)
    # what may not be seen gets exactly 0: padding keys, and future keys when causal
    hidden = pad[:, None, None, :].expand(3, 4, 7, 7)
    if causal:
        hidden = hidden | torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert (w[hidden] == 0).all() and (w[~hidden] > 0).all()
    # near the float32 result, within bf16's 8-bit mantissa (relative error ~ 2**-8)
    torch.testing.assert_close(w, ref_w, atol=1e-2, rtol=0)
    torch.testing.assert_close(out.float(), ref_out, atol=3e-2, rtol=3e-2)
    # the explicit-weights path and the fused SDPA path agree under autocast too
    torch.testing.assert_close(out.float(), fused.float(), atol=3e-2, rtol=3e-2)


def test_fp32_path_is_untouched_by_the_upcast():
    """The float32 upcast in the explicit path is a no-op in float32 and keeps float64."""
    mha, x, pad = mha_inputs(1)
    with torch.no_grad():
        mask = ~pad[:, None, None, :]
        _, w32 = mha(x, mask=mask, need_weights=True)
        _, w64 = mha.double()(x.double(), mask=mask, need_weights=True)
    assert w32.dtype == torch.float32 and w64.dtype == torch.float64
    torch.testing.assert_close(w32.double(), w64, atol=1e-6, rtol=0)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64,
                      dropout=0.0, max_positions=64)
    return Transformer(cfg, 50, 50, shared_vocab=True).eval()


def test_model_under_bf16_autocast_loss_and_maps():
    model = tiny_model()
    batch = collate([[5, 6, 7, 8, 9], [10, 11]], [[12, 13, 14], [15, 16, 17, 18, 19, 20]])
    with torch.no_grad():
        hidden, ref_attn = model(batch.src, batch.tgt_in, need_weights=True)
        ref = model.logits(hidden)
        with cpu_bf16():
            hidden, attn = model(batch.src, batch.tgt_in, need_weights=True)
            logits = model.logits(hidden)
        ref_loss = token_nll(ref, batch.tgt_out, 0)
        loss = token_nll(logits, batch.tgt_out, 0)
    assert logits.dtype == BF16 and loss.dtype == torch.float32
    # the loss of bf16 logits is computed in float32: the same as float32 maths on them
    assert loss.item() == pytest.approx(token_nll(logits.float(), batch.tgt_out, 0).item(),
                                        rel=1e-6)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-2)
    for kind in KINDS:
        for w, w_ref in zip(attn[kind], ref_attn[kind], strict=True):
            assert w.dtype == torch.float32
            torch.testing.assert_close(w, w_ref, atol=1e-2, rtol=0)
    # the figures' arrays, collected under autocast as the trainer's validation does
    with cpu_bf16():
        maps = collect_attention(model, [5, 6, 7, 8, 9], [12, 13, 14])
    assert maps.keys() == set(KINDS)
    assert maps["cross"][0].dtype.name == "float32" and maps["cross"][0].shape == (4, 4, 6)


# --------------------------------------------------------------------------- training
def _losses(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("train/loss")], acc.Tags()["images"]


def _check_trained_run(run_dir, n_steps):
    """Finite losses that fall, float32 checkpoints that load anywhere (``last.pt``, of the
    last step), translations."""
    losses, images = _losses(run_dir)
    assert len(losses) == n_steps and all(map(torch.isfinite, torch.tensor(losses)))
    k = n_steps // 4
    assert sum(losses[-k:]) / k < sum(losses[:k]) / k - 0.5  # it learned
    state = load_checkpoint(checkpoint_path(run_dir, "last"))
    dtypes = {v.dtype for v in state["model"].values() if v.is_floating_point()}
    assert dtypes == {torch.float32}  # master weights stay float32 under autocast
    assert not any(k.startswith("_orig_mod.") for k in state["model"])  # not compile's names
    run = load_run(str(run_dir), "last", "cpu")
    assert run.state["step"] == n_steps
    # the attention maps of every kind were drawn at validation
    assert {t.split("/")[1] for t in images if t.startswith("attention/")} == set(KINDS)
    return run


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bf16")
    metrics = train(compose_train(tmp, "trainer.precision=bf16", "trainer.device=cpu",
                                  "trainer.max_steps=40", "trainer.valid_every=40",
                                  "trainer.attention_images=true"))
    return tmp / "run", metrics


@pytest.mark.slow
def test_bf16_training_on_cpu(bf16_run, capsys):
    run_dir, metrics = bf16_run
    run = _check_trained_run(run_dir, 40)
    assert run.config["trainer"]["precision"] == "bf16"
    # a bf16-trained run translates (in float32) through the real translate config and
    # function, and draws its attention maps (outside the run: only its own commands write
    # into a run)
    maps = run_dir.parent / "maps"
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
        cfg = compose(config_name="translate", overrides=[
            f"run={run_dir}", "checkpoint=last", "device=cpu", f"attention={maps}",
            "attention_kinds=[encoder_self,decoder_self,cross]"])
    out = translate(cfg, ["我喜欢猫。", "他昨天去了北京。"])
    lines = capsys.readouterr().out.splitlines()
    assert lines == out["translations"] and len(lines) == 2
    assert sorted(p.name for p in maps.iterdir()) == ["line1.png", "line2.png"]


@pytest.mark.slow
def test_compile_on_cpu(tmp_path, monkeypatch):
    """``trainer.compile=true`` trains like eager: the same losses to float rounding,
    finite, falling; its checkpoint loads without compile's parameter names. Over a whole
    epoch (about 35 batches of as many shapes) it compiles two graphs: the first batch's
    shapes, then sizes left dynamic (and a third for a batch of one sentence, where an
    epoch has one: torch specializes a size of 1), never one per batch.

    Dynamo and AOT autograd trace our model, loss and step here (``backend="aot_eager"``);
    inductor's code generation is torch's own and takes a minute or two on a cold CPU
    cache: tests/test_cuda.py compiles with inductor on the GPU."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    # no dropout: compiled code draws its dropout masks from another random stream
    # (a third of the tiny corpus: an epoch of about 35 batches; one data cache for both)
    common = ["trainer.device=cpu", "model.dropout=0.0",
              "data.train_size=1000", f"data.cache_dir={tmp_path / 'cache'}"]
    seconds = {}
    for name, extra in (("eager", ("trainer.max_steps=12", "trainer.valid_every=12")),
                        ("compiled", ("trainer.compile=true", "trainer.max_epochs=1",
                                      "trainer.max_steps=100000", "trainer.valid_every=20",
                                      "trainer.attention_images=true"))):  # (read below)
        counters.clear()
        start = time.perf_counter()
        metrics = train(compose_train(tmp_path / name, *extra, *common))
        seconds[name] = time.perf_counter() - start
    print(f"eager: 12 steps + validation + test {seconds['eager']:.1f} s; compiled: an epoch "
          f"of {metrics['steps']} steps, {seconds['compiled']:.1f} s")
    assert metrics["stop_reason"] == "max_epochs" and metrics["steps"] > 25
    assert counters["stats"]["unique_graphs"] in (2, 3)
    eager, _ = _losses(tmp_path / "eager" / "run")
    compiled, _ = _losses(tmp_path / "compiled" / "run")
    assert compiled[:12] == pytest.approx(eager, rel=1e-4)
    _check_trained_run(tmp_path / "compiled" / "run", metrics["steps"])
