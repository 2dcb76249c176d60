"""Shared fixtures: the reference corpora, tiny synthetic corpora, data configs in tmp_path.

Tests never touch the network: the Hugging Face libraries are put in offline mode here,
before anything imports them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import types

os.environ["HF_HUB_OFFLINE"] = "1"  # must precede any import of datasets / huggingface_hub
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
# the per-user cache (tinymt.fonts builds the SC font there, matplotlib lists the fonts):
# the session's own, not the user's; one for the xdist workers, made before they start
os.environ["TINYMT_TESTS_CACHE"] = (os.environ.get("TINYMT_TESTS_CACHE")
                                    or tempfile.mkdtemp(prefix="tinymt-tests-cache-"))
os.environ["XDG_CACHE_HOME"] = os.environ["TINYMT_TESTS_CACHE"]

import contextlib
import gc
import importlib.util
import json
import random
import re
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from functools import cache
from pathlib import Path

import forked
import pytest
import torch
from hypothesis import HealthCheck, settings

from tinymt.bench.serve_speed import ServerProcess
from tinymt.corpus.grammar import sample_sentence
from tinymt.corpus.render import render

# The hostile-input properties: a fixed, bounded profile, the same draws on every run (a
# failure found once is found again, and CI's time does not wander). HYPOTHESIS_PROFILE=deep
# draws more, with fresh randomness, for a hunt by hand.
settings.register_profile("tinymt", max_examples=60, deadline=None, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "tinymt"))

if "PYTEST_XDIST_WORKER" not in os.environ:  # the process that made it
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)
REPO_ROOT = Path(__file__).resolve().parents[1]
# `make test` runs the suite in parallel (pytest-xdist): each worker takes its share of the
# cores, so torch's threads do not fight over them
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // WORKERS))

# the servers the tests start are forked from a process that has imported torch and the
# rest (tests/forked.py): a plain start spends 2-3 s of CPU on the imports, ~40 times
ServerProcess.popen = staticmethod(forked.popen)


def pytest_configure(config):
    """Under ``make test`` one fork server for every worker (tests/forked.py), started by
    pytest-xdist's controller before it starts them (not for ``-m "not slow"``: no test
    there starts a script)."""
    if getattr(config.option, "numprocesses", None) and not config.option.collectonly \
            and "not slow" not in config.option.markexpr \
            and "PYTEST_XDIST_WORKER" not in os.environ:
        forked.share()


def pytest_collection_finish(session):
    """What is alive once the suite is collected (torch, the libraries, the test modules)
    lives to the end: frozen out of the cyclic GC, whose full passes would walk it again
    and again (~0.3 s each, ~30 a worker; and a reading deadline counts that CPU too)."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    """The font cutter's pool let go while the interpreter is whole: held to the end of a
    worker, its ``__del__`` writes a traceback once the modules are torn down (a server, whose
    process ends at once, exits quietly)."""
    from tinymt import fonts

    while fonts._pool:
        fonts._pool.pop().terminate()


def shared_data_dir() -> Path:
    """``$TINYMT_SHARED_DATA`` or ``../shared/data`` next to the repository."""
    env = os.environ.get("TINYMT_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The reference corpora folder; tests using it skip (with the reason) when it is absent."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(
            f"reference corpora not found at {path}: put them at ../shared/data beside the "
            "repository or set TINYMT_SHARED_DATA"
        )
    return path


# A toy language pair: "src" words map one-to-one onto "tgt" words, so sentences are
# parallel and sentencepiece has a little structure to learn.
SRC_WORDS = [
    "der",
    "die",
    "das",
    "hund",
    "katze",
    "haus",
    "baum",
    "sieht",
    "läuft",
    "schnell",
    "klein",
    "groß",
    "rot",
    "blau",
    "ein",
]
TGT_WORDS = [
    "the",
    "the",
    "the",
    "dog",
    "cat",
    "house",
    "tree",
    "sees",
    "runs",
    "fast",
    "small",
    "big",
    "red",
    "blue",
    "a",
]


def make_pairs(n: int, seed: int = 0, min_len: int = 2, max_len: int = 8) -> list[tuple[str, str]]:
    """``n`` deterministic parallel (src, tgt) sentences of the toy language pair."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        idx = [rng.randrange(len(SRC_WORDS)) for _ in range(rng.randint(min_len, max_len))]
        pairs.append(
            (" ".join(SRC_WORDS[i] for i in idx) + " .", " ".join(TGT_WORDS[i] for i in idx) + " .")
        )
    return pairs


def write_text_corpus(
    folder: Path,
    splits: dict[str, list[tuple[str, str]]],
    src: str = "de",
    tgt: str = "en",
    suffix: str = "",
) -> Path:
    """``<folder>/<split>.<lang><suffix>`` files, one sentence a line (``.gz`` compresses)."""
    import gzip

    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in splits.items():
        for lang, side in ((src, 0), (tgt, 1)):
            data = "".join(p[side] + "\n" for p in pairs).encode("utf-8")
            path = folder / f"{split}.{lang}{suffix}"
            path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    return folder


@pytest.fixture
def text_corpus(tmp_path) -> Path:
    """A small text-source corpus: 300 / 20 / 20 pairs, de/en toy language."""
    return write_text_corpus(
        tmp_path / "corpus",
        {"train": make_pairs(300, 0), "valid": make_pairs(20, 1), "test": make_pairs(20, 2)},
    )


@pytest.fixture
def data_cfg(tmp_path):
    """``data_cfg(**overrides)`` -> a DataConfig with its cache in tmp_path and a small vocab."""
    from tinymt.config import DataConfig

    def make(**overrides):
        base = {
            "name": "test",
            "source": "text",
            "src_lang": "de",
            "tgt_lang": "en",
            "train_split": "train",
            "valid_split": "valid",
            "test_split": "test",
            "vocab_size": 40,
            "cache_dir": str(tmp_path / "cache"),
        }
        base.update(overrides)
        return DataConfig(**base)

    return make


# A tiny but real training run (built-in corpus, 2 heads, a few dozen steps), shared by
# the tests of everything that reads a run dir: translate, heads, average_checkpoints.
TINY_TRAIN_OVERRIDES = [
    "data.train_size=3000", "data.valid_size=60", "data.test_size=40", "data.vocab_size=800",
    "data.max_len=60",
    "model.d_model=32", "model.n_heads=2", "model.n_encoder_layers=2",
    "model.n_decoder_layers=1", "model.d_ff=64", "model.dropout=0.1", "model.max_positions=64",
    "optim.warmup_steps=10", "optim.lr=3e-3", "optim.schedule=inverse_sqrt",
    "trainer.max_tokens=800", "trainer.max_minutes=0", "trainer.num_threads=1",
    "trainer.valid_sentences=20", "trainer.test_beam=2", "trainer.log_every=1",
    "trainer.n_probes=1",
    # the PNG grids cost seconds per validation: drawn only where a test reads them
    # (the tiny run, test_precision's runs); the view records are logged always
    "trainer.attention_images=false",
]


# the script run with CTranslate2 unimportable, as where the extra is not installed (the
# child's import of it raises ImportError; it imported none before: the check is real)
NO_CT2 = ("import runpy, sys; assert 'ctranslate2' not in sys.modules; "
          "sys.modules['ctranslate2'] = None; sys.argv = sys.argv[1:]; "
          "runpy.run_path(sys.argv[0], run_name='__main__')")


def compose_train(tmp_path, *overrides):
    """The real train config, composed by Hydra, made tiny and pointed into tmp_path: a copy
    of the one composed for these overrides, its data cache and run dir then set where the
    overrides do not set them (a composition costs ~0.2 s of CPU; the suite asks ~100 times,
    for a few dozen distinct ones)."""
    import copy

    cfg = copy.deepcopy(_composed_train(overrides))
    given = {o.split("=", 1)[0] for o in overrides}
    if "data.cache_dir" not in given:
        cfg.data.cache_dir = str(tmp_path / "cache")
    if not given & {"run_dir", "trainer.resume"}:  # a resumed run stays in its folder
        cfg.run_dir = str(tmp_path / "run")
    return cfg


@cache
def _composed_train(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir

    import tinymt.config  # noqa: F401

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
        return compose(config_name="train", overrides=[*TINY_TRAIN_OVERRIDES, *overrides])


def compose_translate(*overrides: str):
    """The real translate config, composed by Hydra, on the CPU: a copy of the one composed
    for these overrides (a composition costs ~0.15 s of CPU; the suite asks ~80 times for
    a few dozen distinct ones)."""
    import copy

    return copy.deepcopy(_composed_translate(overrides))


@cache
def _composed_translate(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
        return compose(config_name="translate", overrides=["device=cpu", *overrides])


TINY_FRAMES = list(range(2, 41, 2))  # the steps tiny_run records its probes at (probe_every=2)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A finished tiny run dir (40 steps, validations at 20 and 40, a frame of the probes
    every 2 steps, step checkpoints kept). Trained once a session, by the first worker to
    ask (the others wait for it: ~11 s of CPU); each worker gets a copy of its own, so
    that a test that checks a refused command changed nothing sees no other worker's."""
    from filelock import FileLock

    from tinymt.trainer import train

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base  # this session's
    with FileLock(shared / "tiny_run.lock", timeout=600):  # (a hung trainer: an error)
        if not (shared / "tiny_run" / "run" / "metrics.json").exists():
            shutil.rmtree(shared / "tiny_run", ignore_errors=True)  # a worker that failed
            train(compose_train(shared / "tiny_run", "trainer.max_steps=40",
                                "trainer.valid_every=20", "trainer.probe_every=2",
                                "trainer.keep_last=2", "trainer.attention_images=true"))
    return copy_run(shared / "tiny_run" / "run", tmp_path_factory.mktemp("tiny_run") / "run")


# A briefly but truly trained run: the built-in corpus, a smaller tiny model (2 encoder + 1
# decoder layers, d_ff 256), TRAINED_STEPS steps of 384-token batches. It translates
# held-out sentences exactly (proved by tests/test_tour.py); the tour runs on it. Measured
# on one thread, as make test trains it (beside another such run): 38 s; 70 of 124 short
# held-out sentences right (56 %), test BLEU 62.3, 22 of the 85 held-out dictionary words;
# seeds 2 and 3: 56 % and 56 %, BLEU 66.6 and 59.9. Smaller batches learn more per token
# here (the same pair of runs: 400 steps of 1,024 tokens, 47.5 s: 49 %, BLEU 59.0; 600 of
# 512: 56 %, 64.4; 500 of 512: 42 %; 600 of 384: 44 %; 900 of 256: 54 %; 400 of 768: 31 %).
# A causal mask that lets a word see the next one: 0 right. The 2,000-piece vocabulary does
# most of it (12 target pieces a sentence, not 19): at 1,000 (an earlier corpus), 2+1
# layers got 36 % at 650 steps of 1,024 tokens. Also tried then (650 steps, 30,000 pairs,
# d_ff 512, cosine, lr 3e-3, 100 warm-up steps unless named; of 128): inverse_sqrt 72 %,
# lr 4e-3 72 %, 50 warm-up steps 62 %, vocab 3,000 67 %, 3+1 layers 475 steps 47 %, 3+2
# layers 450 steps 67 %; lr 6e-3 at vocab 1,000 3 %.
TRAINED_STEPS = 700
TRAINED_OVERRIDES = [
    "data.train_size=20000", "data.valid_size=100", "data.test_size=500",
    "data.vocab_size=2000", "model.n_encoder_layers=2", "model.n_decoder_layers=1",
    "model.d_ff=256", f"trainer.max_steps={TRAINED_STEPS}", "trainer.max_tokens=384",
    "trainer.max_minutes=0", f"trainer.valid_every={TRAINED_STEPS}",
    "trainer.valid_sentences=100", "trainer.test_beam=1", "trainer.n_probes=0",
    # no test reads the probes' frames or the PNG grids
    "trainer.probe_every=0", "trainer.attention_images=false", "trainer.log_every=100",
    "optim.lr=3e-3", "optim.schedule=cosine", "optim.warmup_steps=100",
    # one thread, as make test gives each worker (two beside the other worker's tests wait
    # on each other: 96 s, not 48, beside the browser tests)
    "trainer.device=cpu", "trainer.num_threads=1",
]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """``(run dir, its config, its metrics)``: the briefly trained run of TRAINED_OVERRIDES."""
    from hydra import compose, initialize_config_dir

    from tinymt.trainer import train

    tmp = tmp_path_factory.mktemp("trained_run")
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
        cfg = compose(config_name="train", overrides=[
            *TRAINED_OVERRIDES, f"data.cache_dir={tmp / 'cache'}", f"run_dir={tmp / 'run'}"])
    return tmp / "run", cfg, train(cfg)


# ----------------------------------------------------------------------------- heads
HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture
def host_reads(monkeypatch):
    """Every read of a tensor on the host by tinymt's own code (each a wait for the device on
    a GPU: ``HOST_READS``, ``if tensor:`` included), as ``"<method> in <function>"``, while
    ``reads.on``."""
    import tinymt

    src = str(Path(tinymt.__file__).parent)

    class Reads(list):
        on = True

    reads = Reads()

    def counted(name):
        real = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if reads.on and caller.co_filename.startswith(src):
                reads.append(f"{name} in {caller.co_name}")
            return real(self, *args, **kwargs)
        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    return reads


QUIET = lambda *_: None  # noqa: E731  (a log= that prints nothing)


def analyze_cfg(run, *overrides):
    """The real analyze_heads config, composed by Hydra, on the CPU."""
    from hydra import compose, initialize_config_dir

    import tinymt.config  # noqa: F401

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
        return compose(config_name="analyze_heads",
                       overrides=[f"run={run}", "device=cpu", *overrides])


def copy_run(run: Path, dest: Path) -> Path:
    """A private copy of a shared run (an analysis or a resume writes into its run dir)."""
    shutil.copytree(run, dest)
    return dest


HEAD_ANALYSIS = ("max_sentences=30", "prune=0.5")


@pytest.fixture(scope="session")
def head_analysis(tiny_run, tmp_path_factory):
    """``(run dir, result)``: the one head analysis of the suite, ``analyze()`` exactly as
    scripts/analyze_heads.py calls it (progress and log on), on a copy of the tiny run:
    ``HEAD_ANALYSIS`` (30 validation sentences, half the heads pruned into
    ``checkpoints/pruned.pt``), writing heads.md, heads/*.png and TensorBoard events."""
    from tinymt.heads import analyze

    run_dir = copy_run(tiny_run, tmp_path_factory.mktemp("heads") / "run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_dir, analyze(analyze_cfg(run_dir, *HEAD_ANALYSIS))
    finally:
        torch.set_num_threads(threads)


class FixedAttention(torch.nn.Module):
    """Stands in for a Transformer with 1 layer of 2 heads of each kind whose attention
    weights are given: ``{kind: [head 0 rows, head 1 rows]}``, for one sentence."""

    def __init__(self, weights: dict[str, list]):
        super().__init__()
        self.weights = {k: torch.tensor(w, dtype=torch.float64) for k, w in weights.items()}

    n_heads = 2
    encoder_layers = decoder_layers = [types.SimpleNamespace(self_attn=None, cross_attn=None)]

    def forward(self, src, tgt_in, need_weights=False):
        S, T = src.shape[1], tgt_in.shape[1]
        assert need_weights and src.shape[0] == 1
        for kind, shape in (("encoder_self", (S, S)), ("decoder_self", (T, T)),
                            ("cross", (T, S))):
            assert tuple(self.weights[kind].shape) == (2, *shape), kind
        return None, {k: [w[None]] for k, w in self.weights.items()}  # (B=1, h, T_q, T_k)


# ----------------------------------------------------------------------------- scripts
@cache
def script_module(script: str):
    """``scripts/<script>.py`` imported (its ``__main__`` part not run)."""
    spec = importlib.util.spec_from_file_location(f"{script}_script",
                                                  REPO_ROOT / "scripts" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script_in_process(script: str, args: list[str], capsys) -> tuple[int, str]:
    """``(exit status, stderr)`` of ``scripts/<script>.py`` on ``args``, in this process:
    ``run_hydra`` around Hydra's composition of ``configs/<script>.yaml`` and the script's
    ``main``, as its ``__main__`` does. Hydra's run-dir handling and the process boundary are left
    out; ``capsys`` is the test's."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from tinymt.cli import run_hydra

    module = script_module(script)
    overrides = list(args)
    if script == "translate":  # its __main__ splits off the sentences first
        overrides, module.SENTENCES[:] = module.split_args(list(args))

    def main():
        with initialize_config_dir(version_base="1.3", config_dir=str(REPO_ROOT / "configs")):
            cfg = compose(config_name=script, overrides=overrides, return_hydra_config=True)
        cfg.hydra.runtime.output_dir = cfg.hydra.run.dir  # as Hydra's run would set it
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
        return module.main(cfg)  # hydra.main passes a given config straight through

    capsys.readouterr()
    try:
        run_hydra(main)
        status = 0
    except SystemExit as e:
        status = e.code
    finally:
        HydraConfig.instance().cfg = None
    out, err = capsys.readouterr()
    sys.stdout.write(out)  # still there for the test's own capsys.readouterr()
    return status, err


# ----------------------------------------------------------------------------- TensorBoard
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@contextlib.contextmanager
def tensorboard_process(logdir: Path, ready, *flags: str):
    """``tensorboard --logdir <logdir> [flags]`` as a user starts it (its entry point's
    script, forked: tests/forked.py; the Attention tab found through its entry point), on a
    loopback port; yields ``(base URL, process)`` once ``ready(base)`` is true (within
    120 s, else the test fails with its stderr)."""
    port = free_port()
    tb = Path(sys.executable).with_name("tensorboard")
    with tempfile.TemporaryFile() as err:
        proc = forked.popen([sys.executable, str(tb), "--logdir", str(logdir), "--host",
                             "127.0.0.1", "--port", str(port), *flags],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    if ready(base):
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    pytest.fail(f"tensorboard --logdir {logdir} not ready: "
                                f"{err.read()[-1500:].decode(errors='replace')}")
                time.sleep(0.1)
            yield base, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def tensorboard(tiny_run, tmp_path_factory):
    """``tensorboard --logdir <the tiny run>`` (:func:`tensorboard_process`); yields its
    base URL."""
    def ready(base):
        return http_get(f"{base}/data/plugin/tinymt_attention/steps?run=.&tag=probe_2")[0] == 200

    with tensorboard_process(tiny_run, ready) as (base, _):
        yield base


# ----------------------------------------------------------------------------- hostile records
def small_document() -> dict:
    """A valid view document written by hand (no model): one layer of two cross-attention
    heads, 2 target x 3 source tokens."""
    import numpy as np

    w = np.array([[[[255, 0, 0], [0, 128, 127]], [[85, 85, 85], [0, 0, 255]]]], np.uint8)
    return {"sentence": "猫。", "reference": "Cat", "translation": "Cat",
            "forced": "reference", "step": 1, "scale": 255,
            "kinds": {"cross": {"rows": ["▁Cat", "</s>"], "cols": ["▁猫", "。", "</s>"],
                                "weights": w, "entropy": [[0.0, 1.0986]],
                                "gold": [[0, 0, "aligned"]]}}}


def synthetic_document(layers: int = 2, heads: int = 4, n: int = 12, step: int = 1,
                       seed: int = 0) -> dict:
    """A view document of random (seeded) softmax attention, no model: ``layers`` x
    ``heads`` of each kind over ``n`` tokens a side, built by ``build_document`` as the
    trainer builds its records (uint8 weights, entropy, gold cells on the showcase words)."""
    import numpy as np

    from tinymt.viewer.document import Probe, build_document

    def softmax_rows(rng, shape, causal):
        logits = rng.standard_normal(shape) * 3.0
        if causal:  # a query sees itself and what precedes it
            logits = np.where(np.tril(np.ones(shape[-2:], bool)), logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        return w / w.sum(-1, keepdims=True)

    rng = np.random.default_rng(seed)
    src = ["▁我请" if i % 3 == 0 else f"▁w{i}" for i in range(n - 1)]
    tgt = [f"▁t{i}" for i in range(n - 1)]
    attn = {kind: list(softmax_rows(rng, (layers, heads, n, n), kind == "decoder_self"))
            for kind in ("encoder_self", "decoder_self", "cross")}
    probe = Probe("我请李雷帮我订了去北京的机票。", "I asked Li Lei to book me a ticket.",
                  src_words=[s.strip("▁") for s in src], tgt_words=[t.strip("▁") for t in tgt],
                  alignment=[(i, i) for i in range(0, n - 1, 2)])
    return build_document(attn, src, tgt, probe, "I asked", step, forced_reference=True)


# the tutorials' sentence cut into pieces by hand: 李雷 and 机票 in two, "ticket" in two
SRC_PIECES = ["▁我", "请", "李", "雷", "帮", "我", "订", "了", "去", "北京", "的", "机", "票", "。"]
TGT_PIECES = ["▁I", "▁asked", "▁Li", "▁Lei", "▁to", "▁help", "▁me", "▁book", "▁a", "▁tick",
              "et", "▁to", "▁Beijing", "."]


def random_attention(rng, n_layers, n_heads, t_q, t_k, causal=False):
    """Softmax rows, (layers, heads, T_q, T_k); causal: zero above the diagonal."""
    import numpy as np

    logits = rng.normal(size=(n_layers, n_heads, t_q, t_k)) * 2
    if causal:
        logits = np.where(np.tril(np.ones((t_q, t_k), bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def showcase_document(forced_reference=True, seed=0, step=120):
    """``(float attention, its view document)``: the showcase pair with its gold words, 2 x 3
    encoder heads, 1 x 3 of the others, random (seeded) softmax rows."""
    import numpy as np

    from tinymt.corpus import SHOWCASE
    from tinymt.viewer.document import build_document, probe_from_pair

    rng = np.random.default_rng(seed)
    s, t = len(SRC_PIECES) + 1, len(TGT_PIECES) + 1
    attn = {"encoder_self": list(random_attention(rng, 2, 3, s, s)),
            "decoder_self": list(random_attention(rng, 1, 3, t, t, causal=True)),
            "cross": list(random_attention(rng, 1, 3, t, s))}
    doc = build_document(attn, SRC_PIECES, TGT_PIECES, probe_from_pair(SHOWCASE[0]),
                         "I asked Li Lei to help me book a ticket to Beijing.", step,
                         forced_reference=forced_reference)
    return attn, doc


# ----------------------------------------------------------------------------- the browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium through Playwright (no browser download); skips without
    it, except under CI (``CI`` set), where ``.ci/run`` installs it."""
    if not Path(CHROMIUM).is_file():
        reason = "Debian's chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: .ci/run installs it")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@cache
def view_palette() -> list[tuple[int, int, int]]:
    """The head colours as view.js lists them (PALETTE): the one thing the pixel checks
    take from the code under test."""
    text = (REPO_ROOT / "src/tinymt/viewer/static/view.js").read_text(encoding="utf-8")
    block = re.search(r"const PALETTE = \[(.*?)\];", text, re.S).group(1)
    return [tuple(int(h[i:i + 2], 16) for i in (0, 2, 4)) for h in re.findall(r"#([0-9a-f]{6})", block)]


def expected_pixels(weights, color, background=(255, 255, 255), norm: str = "weight",
                    scale: int = 255):
    """What a canvas of the view must hold for ``weights`` (T_q, T_k): one pixel a weight,
    the colour channel by channel ``round(bg + (colour - bg) * t)`` (halves up), with
    ``t = min(1, w / scale)``, or ``w / (its row's largest)`` for ``norm="row"``."""
    import numpy as np

    w = np.asarray(weights, dtype=np.float64)
    top = np.full((w.shape[0], 1), float(scale))
    if norm == "row":
        m = w.max(1, keepdims=True)
        top = np.where(m > 0, m, scale)
    t = np.minimum(1.0, w / top)[..., None]
    bg, c = np.array(background, float), np.array(color, float)
    return np.floor(bg + (c - bg) * t + 0.5).astype(np.uint8)


def canvas_pixels(page, selector: str) -> list[tuple[dict, object]]:
    """Every canvas matching ``selector``: its data attributes and its RGB pixels
    (T_q, T_k, 3), read back from the canvas itself. (As base64: a JSON array of every
    byte takes Playwright seconds for the 54 canvases of an overview.)"""
    import base64

    import numpy as np

    got = page.locator(selector).evaluate_all("""els => els.map(c => {
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let s = '';
        for (let i = 0; i < px.length; i += 8192)
            s += String.fromCharCode.apply(null, px.subarray(i, i + 8192));
        return [Object.assign({}, c.dataset), c.width, c.height, btoa(s)]; })""")
    return [(data, np.frombuffer(base64.b64decode(px), np.uint8).reshape(h, w, 4)[..., :3])
            for data, w, h, px in got]


def unpack(blob: bytes) -> tuple[dict, bytes]:
    """A record (summary.encode) -> its JSON header and its weight bytes."""
    raw = zlib.decompress(blob)
    (n,) = struct.unpack_from("<I", raw, 5)
    return json.loads(raw[9:9 + n]), raw[9 + n:]


def pack(header: dict | bytes, weights: bytes = b"") -> bytes:
    """summary.encode's format around any header: a dict as JSON (NaN, lone surrogates
    and all), bytes as they are."""
    from tinymt.viewer.summary import MAGIC

    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return zlib.compress(MAGIC + struct.pack("<I", len(head)) + head + weights)


def zlib_bomb(prefix: bytes, mib: int) -> bytes:
    """A valid zlib stream of ``prefix`` and ``mib`` MiB of zeros, about 1 KB a MiB: the
    compressed bytes of a zero MiB repeat once the history is reset (a full flush)."""
    c, zero = zlib.compressobj(9), bytes(1 << 20)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(zero) + c.flush(zlib.Z_FULL_FLUSH)
    end = c.flush()[:-4]  # the final block, without the checksum of what c saw
    adler = zlib.adler32(prefix)
    for _ in range(mib):
        adler = zlib.adler32(zero, adler)
    return head + block * mib + end + struct.pack(">I", adler)


def hostile_records() -> dict[str, tuple[bytes, list]]:
    """``{tag: (its metadata's content, [(step, TensorProto), ...])}``: one way of
    breaking the Attention tab's reader a tag, each record forged byte by byte."""
    import numpy as np
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

    from tinymt.viewer.summary import MAX_CELLS, encode

    good = encode(small_document())
    head, weights = unpack(good)

    def changed(kind: dict | None = None, **top) -> dict:
        return {**head, **top, "kinds": {"cross": {**head["kinds"]["cross"], **(kind or {})}}}

    side = int(MAX_CELLS ** 0.5)  # 4096 tokens a side: one head of MAX_CELLS weights
    toks = ["t"] * side
    big = {"rows": toks, "cols": toks, "entropy": [[0.0]], "gold": [], "shape": [1, 1, side, side]}
    largest = {**small_document(), "kinds": {"cross": {**big, "weights": np.full(
        (1, 1, side, side), 255, np.uint8)}}}  # 3 digits a weight: the longest JSON
    del largest["kinds"]["cross"]["shape"]
    meta = json.dumps({"version": 1, "sentence": "a hostile record", "reference": None}).encode()
    records = {
        "huge_shape": pack(changed({"shape": [1, 1, 100_000, 100_000]}), weights),
        "over_cap": pack({**head, "kinds": {"cross": big, "encoder_self": big}}),
        "largest_allowed": encode(largest),
        "gold_out_of_range": pack(changed({"gold": [[2, 0, "aligned"]]}), weights),
        "scale_markup": pack(changed(scale='<img src=x onerror="window.__pwned=1">'), weights),
        "relations_markup": pack(changed({"relations": [  # read: every other field is text
            ['<img src=x onerror="window.__pwned=1">', "b", "object ←", 0, 0, 0.5],
            {"x": '<img src=x onerror="window.__pwned=1">'}, [1, 2]]}), weights),
        "truncated": good[:-7],
        "zlib_bomb": zlib_bomb(zlib.decompress(good), 1024),  # ~1 MB -> 1 GiB
        "header_deep": pack(b"[" * 100_000 + b"]" * 100_000),
        "surrogate": pack(changed({"rows": ["\ud800", "</s>"]}), weights),
        "meta_list": good, "meta_deep": good,
        "probe_" + "9" * 5000: good,  # a number no int() reads (Python's 4,300 digits)
    }

    def string(blob):
        return tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[blob],
                                      tensor_shape=tensor_shape_pb2.TensorShapeProto())

    out = {tag: (meta, [(1, string(blob))]) for tag, blob in records.items()}
    out["meta_list"] = (b"[1]", out["meta_list"][1])
    out["meta_deep"] = (b"[" * 100_000 + b"]" * 100_000, out["meta_deep"][1])
    nan = json.dumps(changed(scale=float("nan"))).encode()
    out["scale_nan"] = (meta, [(1, string(pack(nan, weights))),
                               (2, string(pack(nan.replace(b"NaN", b"1e999"), weights)))])
    out["not_a_string"] = (meta, [(1, tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, float_val=[1.0],
        tensor_shape=tensor_shape_pb2.TensorShapeProto()))])
    return out


def write_records(folder: Path, records: dict[str, tuple[bytes, list]]) -> None:
    """An event file in ``folder`` holding ``records`` (:func:`hostile_records`' form)
    under our plugin's name, as TensorBoard's own writer writes it."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from tinymt.viewer.summary import PLUGIN_NAME

    writer = EventFileWriter(str(folder))
    for tag, (content, steps) in records.items():
        meta = summary_pb2.SummaryMetadata(
            data_class=summary_pb2.DATA_CLASS_TENSOR,
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME,
                                                               content=content))
        for step, tensor in steps:
            value = summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)
            writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                              summary=summary_pb2.Summary(value=[value])))
    writer.close()


@pytest.fixture(scope="session")
def hostile_tensorboard(tiny_run, tmp_path_factory):
    """``(base URL, process)`` of one TensorBoard on a logdir of two runs: ``good`` (the
    tiny run's events) and ``bad`` (:func:`hostile_records`, steps as written)."""
    logdir = tmp_path_factory.mktemp("hostile_logdir")
    (logdir / "good").mkdir()
    for events in tiny_run.glob("events.out.tfevents.*"):
        shutil.copy(events, logdir / "good" / events.name)
    records = hostile_records()
    (logdir / "bad").mkdir()
    write_records(logdir / "bad", records)
    route = "data/plugin/tinymt_attention"
    want = {("good", "probe_2"): TINY_FRAMES,
            **{("bad", tag): [s for s, _ in steps] for tag, (_, steps) in records.items()}}

    def ready(base):  # every step of every tag loaded
        answers = (http_get(f"{base}/{route}/steps?run={run}&tag={tag}")
                   for run, tag in want)
        return all(status == 200 and json.loads(body)["steps"] == steps
                   for (status, body), steps in zip(answers, want.values()))

    with tensorboard_process(logdir, ready) as server:
        yield server


# ----------------------------------------------------------------------------- server
def post_json(url: str, body, timeout: float = 60, raw: bytes | None = None,
              content_type: str = "application/json") -> tuple[int, object]:
    """``(status, parsed JSON answer)`` of a POST (``raw``: these bytes as the body)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def inline_data(page: str) -> dict:
    """The view data a self-contained attention page (tinymt.viewer.html) carries."""
    match = re.search(r'<script type="application/json" id="tinymt-data">(.*?)</script>',
                      page, re.S)
    return json.loads(match.group(1))


# ----------------------------------------------------------------------------- faults
def run_script_with_fault(script: str, args: list[str], fault: str, cwd=REPO_ROOT,
                          timeout: float = 300) -> subprocess.CompletedProcess:
    """``python scripts/<script>.py args`` as a user runs it, with ``fault`` (Python source)
    run first in the same process: it patches a function to fail, or kill the process,
    at a chosen moment (a kill between two writes, an out-of-memory while reading)."""
    code = (f"{fault}\nimport runpy, sys\n"
            f"sys.argv = [{str(REPO_ROOT / 'scripts' / f'{script}.py')!r}, *{list(args)!r}]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    return forked.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                      timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


# ----------------------------------------------------------------------------- order
# the longest files first, longest to shortest (make test keeps this order:
# --no-loadscope-reorder), so none of them runs alone at the end while the other workers wait
FIRST = ("test_tour.py", "test_viewer_overview.py", "test_serve.py", "test_resume.py",
         "test_viewer_browser.py", "test_precision.py", "test_benchmark.py",
         "test_cli_errors.py", "test_viewer.py", "test_export.py", "test_config.py",
         "test_loaders.py", "test_sampling.py", "test_distributed.py",
         "test_libretranslate_page.py", "test_trainer.py", "test_viewer_fonts.py",
         "test_decoding.py", "test_data.py", "test_translate.py", "test_head_relations.py",
         "test_heads.py", "test_rundir.py", "test_fuzz.py")


# a test that reads a trained run is end to end: it waits for the training (`-m "not slow"`
# leaves it out with the rest of the end-to-end tests)
TRAINED = {"tiny_run", "trained_run", "head_analysis", "tensorboard"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    """A test on a trained run (``TRAINED``) is ``slow``. Under ``make test`` (one worker
    per core, a file per worker) the longest files start first (``FIRST``), the rest
    follow in their usual order."""
    for item in items:
        if TRAINED & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    if WORKERS > 1:
        rank = {name: i for i, name in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable


@torch.no_grad()
def load_from_torch(ours, ref: torch.nn.MultiheadAttention):
    """``ours`` (a :class:`tinymt.attention.MultiHeadAttention`) holding the weights of
    ``ref``, an ``nn.MultiheadAttention`` of the same d_model and heads: the reference."""
    ours.in_proj.weight.copy_(ref.in_proj_weight)
    ours.out_proj.weight.copy_(ref.out_proj.weight)
    if ours.in_proj.bias is not None:
        ours.in_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.bias.copy_(ref.out_proj.bias)
    return ours


def sample_pairs(seed: int, n: int) -> list:
    """``n`` raw samples of the built-in grammar, ``(structure, pair)``: no length filter,
    no deduplication."""
    r = random.Random(seed)
    structures = [sample_sentence(r) for _ in range(n)]
    return [(s, render(s)) for s in structures]


def pruned_heads(model) -> list[tuple[str, int, int]]:
    """Heads whose ``W_O`` columns are all zero: switched off (a pruned checkpoint's)."""
    from tinymt.heads.gates import attention_modules

    found = []
    for kind, mods in attention_modules(model).items():
        for layer, mha in enumerate(mods):
            cols = mha.out_proj.weight.view(mha.d_model, model.n_heads, -1)  # (d, h, d_head)
            found += [(kind, layer, int(h)) for h in cols.eq(0).all(2).all(0).nonzero()]
    return found
