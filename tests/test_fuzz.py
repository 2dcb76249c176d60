"""Fuzz: every numeric key of every script, given the values users get wrong, and hostile
paths (pipes, devices, endless input) -- one line ``error: ...`` or a clean run, never a
traceback, a hang or an allocation error.

The keys come from the rule tables of :mod:`tinymt.config` (``TRAIN_RULES``, ``DATA_RULES``
(prepare_data), ``TRANSLATE_RULES``, ``EXPORT_RULES``, ``ANALYZE_RULES``, ``AVERAGE_RULES``):
each key whose schema field is an ``int`` or a ``float``. Each gets every value of
``VALUES`` through the real script (:func:`conftest.run_script_in_process`: Hydra's
composition, then the script's ``main`` inside ``run_hydra``). A case passes when it is
refused -- exit status 2, one ``error:`` line naming the key, nothing written (the case's
folder, the shared data cache and the run copies unchanged) -- or accepted and completed
(exit status 0) within ``CASE_LIMIT_S``. An accepted value does real work, so the base
commands are tiny: ``TINY`` trains one step of a 5k-parameter model on 60 pairs.

The fuzz itself is slow (384 cases, about 70 s on 2 CPU cores: ~0.1 s of Hydra composition
a refused case, ~0.4 s a tiny training); the named cases after it take a second or less each.
"""

from __future__ import annotations

import io
import math
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import typing
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from conftest import REPO_ROOT, copy_run, run_script_in_process
from tinymt.config import (
    ANALYZE_RULES,
    AVERAGE_RULES,
    DATA_RULES,
    EXPORT_RULES,
    SERVE_RULES,
    TRAIN_RULES,
    TRANSLATE_RULES,
    AnalyzeConfig,
    AverageConfig,
    ExportConfig,
    PrepareConfig,
    ServeConfig,
    TrainConfig,
    TranslateConfig,
)

VALUES = ("0", "-1", str(10**30), str(2**64), "inf", "nan")
CASE_LIMIT_S = 30  # one case, accepted (a tiny run's whole training included) or refused
SENTENCE = "他喜欢猫吗？"
SCRIPTS = {  # script -> (its rule table, the schema its config is composed on)
    "train": (TRAIN_RULES, TrainConfig),
    "prepare_data": (DATA_RULES, PrepareConfig),
    "translate": (TRANSLATE_RULES, TranslateConfig),
    "export": (EXPORT_RULES, ExportConfig),
    "analyze_heads": (ANALYZE_RULES, AnalyzeConfig),
    "average_checkpoints": (AVERAGE_RULES, AverageConfig),
}
# one step of a tiny model on 60 built-in pairs, on the CPU: what an accepted value runs
TINY = ["data.train_size=60", "data.valid_size=4", "data.test_size=4", "data.vocab_size=400",
        "data.max_len=40", "model.d_model=8", "model.n_heads=2", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "model.d_ff=16", "model.max_positions=64",
        "trainer.max_tokens=400", "trainer.max_minutes=0", "trainer.num_threads=1",
        "trainer.valid_sentences=4", "trainer.test_beam=1", "trainer.log_every=1",
        "trainer.n_probes=0", "trainer.attention_images=false", "trainer.n_text_samples=0",
        "trainer.max_steps=1", "trainer.valid_every=1", "trainer.device=cpu"]
BASE = {  # per script: {tmp} = the case's own (empty) folder, also the working dir
    "train": [*TINY, "data.cache_dir={cache}", "run_dir={tmp}/run", "hydra.run.dir={tmp}/h"],
    "prepare_data": [o for o in TINY if o.startswith("data.")] + ["data.cache_dir={cache}"],
    "translate": ["run={run}", "device=cpu", "decode.beam=2"],
    "export": ["run={run}", "out={tmp}/export"],
    "analyze_heads": ["run={run}", "device=cpu", "max_sentences=4", "pruning=false",
                      "prune_output={tmp}/pruned.pt"],
    "average_checkpoints": ["run={run}", "output={tmp}/avg.pt"],
}


def _is_numeric(annotation) -> bool:
    """``int``, ``float`` or either or None (not a list of them: ``optim.betas``)."""
    if typing.get_origin(annotation) in (list, dict):
        return False
    kinds = typing.get_args(annotation) or (annotation,)
    return any(k in (int, float) for k in kinds)


def numeric_keys(schema, rules) -> list[str]:
    """The keys of ``rules`` whose field in ``schema`` (groups followed) is a number."""
    def field_type(cls, key: str):
        head, _, rest = key.partition(".")
        f = next(f for f in fields(cls) if f.name == head)
        if rest:
            return field_type(f.default_factory, rest)
        return typing.get_type_hints(cls)[head]

    assert is_dataclass(schema)
    return [k for k in rules if _is_numeric(field_type(schema, k))]


CASES = [pytest.param(script, key, value, id=f"{script} {key}={value}")
         for script, (rules, schema) in SCRIPTS.items()
         for key in numeric_keys(schema, rules) for value in VALUES]


def test_every_numeric_rule_is_bounded():
    """No numeric key takes a huge or non-finite value (the cheap half of the fuzz; the
    server's too, whose accepted values would serve until stopped: tests/test_serve.py)."""
    for rules, schema in [*SCRIPTS.values(), (SERVE_RULES, ServeConfig)]:
        for key in numeric_keys(schema, rules):
            check = rules[key][0]
            for value in (10**30, -10**30, 2**64, 1e300, math.inf, -math.inf, math.nan):
                assert check(value) is not True, f"{key}={value!r} is allowed"


def test_the_fuzz_covers_every_script_and_numeric_key():
    keys = {tuple(c.values[:2]) for c in CASES}  # (script, key)
    assert {s for s, _ in keys} == set(SCRIPTS) - {"export"}  # export has no numeric key
    assert ("train", "trainer.seed") in keys and ("prepare_data", "data.vocab_size") in keys
    assert ("translate", "decode.len_penalty") in keys and ("train", "optim.lr") in keys
    assert ("train", "trainer.resume") not in keys  # a path, not a number
    assert ("train", "optim.betas") not in keys  # a list
    assert len(CASES) == len(VALUES) * len(keys)


# ----------------------------------------------------------------------------- harness
class CaseTimeout(BaseException):  # not an Exception: no `except Exception` swallows it
    pass


CASE_MEMORY = 2 * 2**30  # address space a case may add: memory without bound fails, early


@contextmanager
def case_limits(seconds: float = CASE_LIMIT_S):
    """Interrupt the case (in this process) when it runs past ``seconds``, and let it map
    at most ``CASE_MEMORY`` more bytes: a hang or an endless read fails the test instead of
    stalling or swapping the machine."""
    def alarm(*_):
        raise CaseTimeout(f"ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _mapped_bytes()
    if mapped is not None and soft == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_AS, (mapped + CASE_MEMORY, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _mapped_bytes() -> int | None:
    """This process's address space (Linux), or None."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kb = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmSize:")),
              None)
    return None if kb is None else kb * 1024


def snapshot(*folders: Path) -> dict:
    """Every file and folder under ``folders`` with its size and modification time (a
    pipe's time is left out: the test's own writer changes it)."""
    out = {}
    for folder in folders:
        for p in folder.rglob("*"):
            st = p.lstat()
            out[str(p)] = (st.st_size, None if stat.S_ISFIFO(st.st_mode) else st.st_mtime_ns)
    return out


def _merge(base: list[str], overrides: list[str]) -> list[str]:
    keys = {o.split("=", 1)[0] for o in overrides}
    return [b for b in base if b.split("=", 1)[0] not in keys] + overrides


@pytest.fixture(scope="module")
def places(tiny_run, tmp_path_factory) -> dict[str, Path]:
    """The shared data cache and private copies of the tiny run (analysis writes into it)."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "cache").mkdir()
    return {"cache": root / "cache", "run": copy_run(tiny_run, root / "run")}


def run_case(script: str, overrides: list[str], places: dict, tmp: Path, capsys, monkeypatch,
             sentences: tuple[str, ...] = (SENTENCE,)) -> tuple[int, list[str]]:
    """``(exit status, non-empty stderr lines)`` of the script on its BASE plus ``overrides``;
    a refusal is checked here: one ``error:`` line last, nothing written."""
    monkeypatch.chdir(tmp)
    values = {"tmp": tmp, **places}
    args = [a.format(**values) for a in _merge(BASE[script], overrides)]
    if script == "translate" and sentences:
        args += ["--", *sentences]
    watched = (tmp, *places.values())
    before = snapshot(*watched)
    with case_limits():
        status, stderr = run_script_in_process(script, args, capsys)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert status in (0, 2), stderr[-3000:]
    if status == 2:
        assert lines and lines[-1].startswith("error: "), stderr[-3000:]
        assert sum(ln.startswith("error:") for ln in lines) == 1, stderr[-3000:]
        assert snapshot(*watched) == before, "a refused command wrote files"
    return status, lines


# ----------------------------------------------------------------------------- the fuzz
@pytest.mark.slow
@pytest.mark.parametrize("script,key,value", CASES)
def test_numeric_key_fuzz(script, key, value, places, tmp_path, capsys, monkeypatch):
    status, lines = run_case(script, [f"{key}={value}"], places, tmp_path, capsys, monkeypatch)
    if status == 2:
        assert key in lines[-1], lines[-1]  # the error names the key it is about


# ----------------------------------------------------------------------------- named cases
def _refused(script, overrides, expect, places, tmp_path, capsys, monkeypatch, **kw):
    status, lines = run_case(script, overrides, places, tmp_path, capsys, monkeypatch, **kw)
    assert status == 2, lines
    assert expect in lines[-1], lines[-1]
    return lines[-1]


@pytest.mark.parametrize("script,overrides,expect", [
    ("train", ["trainer.num_threads=1099511627776"], "trainer.num_threads="),  # 2**40
    ("train", ["trainer.seed=18446744073709551616"], "trainer.seed="),  # 2**64: torch's limit
    ("train", ["data.split_seed=4294967296"], "data.split_seed="),  # 2**32: numpy's limit
    ("train", ["model.d_model=16384", "model.d_ff=65536", "model.n_encoder_layers=64"],
     "parameters"),  # each size allowed, together far beyond memory
    ("train", ["optim.lr=1e30"], "optim.lr="),
    ("train", ["trainer.accumulate=1000000"], "trainer.accumulate="),
    ("train", ["trainer.test_beam=100000"], "trainer.test_beam="),
    ("translate", ["decode.len_penalty=1e308"], "decode.len_penalty="),  # n ** 1e308: overflow
    ("translate", ["decode.beam=100000"], "decode.beam="),
    ("translate", ["decode.batch_tokens=1000000000"], "decode.batch_tokens="),
    ("translate", ["decode.beam=256", "decode.batch_tokens=262144"], "decode.batch_tokens="),
    ("train", ["trainer.test_beam=256", "trainer.max_tokens=262144"], "trainer.max_tokens="),
])
def test_sizes_beyond_the_machine(script, overrides, expect, places, tmp_path, capsys,
                                  monkeypatch):
    _refused(script, overrides, expect, places, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("overrides", [
    ["decode.beam=4", "decode.len_penalty=10"], ["decode.beam=4", "decode.len_penalty=-10"],
    ["decode.beam=256", "decode.nbest=256", "decode.batch_tokens=4096"],
    ["decode.beam=1", "decode.batch_tokens=262144"],
])
def test_extreme_but_allowed_decoding_runs(overrides, places, tmp_path, capsys, monkeypatch):
    """The bounds themselves are values that work: a real translation of the tiny run."""
    status, lines = run_case("translate", overrides, places, tmp_path, capsys, monkeypatch)
    assert status == 0, lines


def test_resume_from_a_file(places, tmp_path, capsys, monkeypatch):
    (tmp_path / "a_file").write_text("x\n")
    _refused("train", ["trainer.resume={tmp}/a_file"], "a_file is not a folder", places, tmp_path,
             capsys, monkeypatch)


def _unwritable_folder() -> str | None:
    """An existing folder where even root cannot make a file (sysfs), or None."""
    import tempfile

    for folder in ("/sys", "/proc"):
        if not Path(folder).is_dir():
            continue
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError:
            return folder
    return None


def test_attention_into_an_unwritable_folder(places, tmp_path, capsys, monkeypatch):
    folder = _unwritable_folder()
    if folder is None:
        pytest.skip("no folder here refuses new files to this user (/sys, /proc)")
    _refused("translate", [f"attention={folder}"], "attention=", places, tmp_path, capsys,
             monkeypatch)


def test_attention_under_a_file(places, tmp_path, capsys, monkeypatch):
    (tmp_path / "a_file").write_text("x\n")
    line = _refused("translate", ["attention={tmp}/a_file/maps"], "attention=", places,
                    tmp_path, capsys, monkeypatch)
    assert "a_file is a file" in line


# ----------------------------------------------------------------------------- hostile paths
def _special(tmp: Path, kind: str) -> Path:
    """A pipe, a socket or a device at ``tmp/<kind>``, which no file we write may be. The
    device is a private copy of /dev/null: code that replaced it (as output= once did)
    must not take the machine's own."""
    path = tmp / kind
    if kind.startswith("fifo"):
        os.mkfifo(path)
    elif kind.startswith("sock"):
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    else:
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
        except OSError as e:
            pytest.skip(f"cannot make a device node here ({e.strerror})")
    return path


@pytest.mark.parametrize("script,key,kind", [
    ("translate", "output", "fifo"),
    ("translate", "output", "sock"),
    ("translate", "output", "null"),  # a device: os.replace swapped it for a file
    ("translate", "attention", "fifo.png"),
    ("translate", "attention", "fifo.html"),
    ("analyze_heads", "prune_output", "fifo"),
    ("average_checkpoints", "output", "fifo.pt"),
])
def test_no_file_we_write_is_a_pipe_socket_or_device(script, key, kind, places, tmp_path,
                                                     capsys, monkeypatch):
    """Opening a pipe to check it can be written hangs until a reader comes; replacing a
    device (output=/dev/null as root) would remove it: both are refused, unopened."""
    path = _special(tmp_path, kind)
    line = _refused(script, [f"{key}={path}"], f"{key}=", places, tmp_path, capsys,
                    monkeypatch)
    assert "not a regular file" in line


def _long_line_file(path: Path, line_no: int, n_chars: int) -> Path:
    lines = [SENTENCE] * (line_no - 1) + ["猫" * n_chars, SENTENCE]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("key", ["input", "ref"])
def test_endless_devices_are_refused_as_input(key, places, tmp_path, capsys, monkeypatch):
    """/dev/zero: one endless line (it used to be read whole: memory without bound)."""
    (tmp_path / "in.txt").write_text(f"{SENTENCE}\n", encoding="utf-8")
    files = {"input": "{tmp}/in.txt", key: "/dev/zero"}
    line = _refused("translate", [f"{k}={v}" for k, v in files.items()], f"{key}=", places,
                    tmp_path, capsys, monkeypatch, sentences=())
    assert "not a regular file or a pipe" in line


@pytest.mark.parametrize("key", ["input", "ref"])
def test_an_overlong_line_is_named(key, places, tmp_path, capsys, monkeypatch):
    from tinymt.data import MAX_LINE_CHARS

    path = _long_line_file(tmp_path / "long.txt", 3, MAX_LINE_CHARS + 1)
    (tmp_path / "in.txt").write_text(f"{SENTENCE}\n" * 4, encoding="utf-8")
    files = {"input": "{tmp}/in.txt", key: str(path)}
    _refused("translate", [f"{k}={v}" for k, v in files.items()], f"error: {path}: line 3 is "
             f"longer than {MAX_LINE_CHARS:,} characters", places, tmp_path, capsys,
             monkeypatch, sentences=())


def test_a_line_at_the_limit_is_read(places, tmp_path, capsys, monkeypatch):
    from tinymt.data import MAX_LINE_CHARS

    _long_line_file(tmp_path / "long.txt", 2, MAX_LINE_CHARS)
    status, lines = run_case("translate", ["input={tmp}/long.txt", "decode.beam=1"], places,
                             tmp_path, capsys, monkeypatch, sentences=())
    assert status == 0, lines


def _endless_writer(path: Path, deadline: float) -> threading.Thread:
    """A thread writing one endless line into the pipe at ``path`` once a reader opens it."""
    def write():
        while time.monotonic() < deadline:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader yet
                break
            except OSError:
                time.sleep(0.01)
        else:
            return
        os.set_blocking(fd, True)
        try:
            while time.monotonic() < deadline:
                os.write(fd, b"x" * 65536)
        except OSError:  # the reader gave up: a broken pipe
            pass
        finally:
            os.close(fd)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_an_endless_pipe_is_read_with_the_cap(places, tmp_path, capsys, monkeypatch):
    """input=<a pipe> (``input=<(command)`` in bash) is read, a line at most the cap."""
    from tinymt.data import MAX_LINE_CHARS

    fifo = _special(tmp_path, "fifo")
    writer = _endless_writer(fifo, time.monotonic() + CASE_LIMIT_S)
    try:
        _refused("translate", [f"input={fifo}"], f"{fifo}: line 1 is longer than "
                 f"{MAX_LINE_CHARS:,} characters", places, tmp_path, capsys, monkeypatch,
                 sentences=())
    finally:
        writer.join(timeout=CASE_LIMIT_S)
    assert not writer.is_alive()


class _ZeroBytes(io.RawIOBase):
    def readable(self):
        return True

    def readinto(self, b):
        b[:] = bytes(len(b))
        return len(b)


class _Zeros:
    """An endless stdin of NUL bytes with no line end (``< /dev/zero``), not a terminal."""

    def __init__(self):
        self.buffer = io.BufferedReader(_ZeroBytes())

    def isatty(self):
        return False

    def __iter__(self):
        raise AssertionError("stdin read without a cap")


def test_endless_stdin_is_read_with_the_cap(places, tmp_path, capsys, monkeypatch):
    from tinymt.data import MAX_LINE_CHARS

    monkeypatch.setattr(sys, "stdin", _Zeros())
    _refused("translate", [], f"error: stdin: line 1 is longer than {MAX_LINE_CHARS:,} "
             "characters", places, tmp_path, capsys, monkeypatch, sentences=())


@pytest.mark.slow
def test_a_pipe_as_output_does_not_hang_the_real_script(tmp_path):
    """The script itself, as a user runs it: ``output=<a pipe nobody reads>`` hung in the
    check that opened it."""
    fifo = _special(tmp_path, "fifo")
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    r = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "translate.py"),
                        f"run={tmp_path}/no-run", f"output={fifo}", SENTENCE], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == [
        f"error: output='{fifo}': must be a file to write (not a regular file (a pipe, "
        "socket or device): name a file to write)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_parameter_estimate_bounds_the_model():
    """The cross rule's estimate is the real count plus exactly what it counts on purpose:
    the tables tied away after they were made, sinusoidal positions (buffers as large) and
    the final norms of pre-LN (counted for post-LN too)."""
    from omegaconf import OmegaConf

    from tinymt.config import estimated_parameters
    from tinymt.model import Transformer, count_parameters

    for overrides in ({}, {"model": {"tie_embeddings": False, "positional": "learned"}},
                      {"data": {"joint_vocab": False}},
                      {"model": {"d_model": 64, "n_heads": 8, "d_ff": 32, "norm_first": False,
                                 "n_encoder_layers": 3, "n_decoder_layers": 1}}):
        cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), overrides)
        m, v = cfg.model, cfg.data.vocab_size
        model = Transformer(m, v, v, shared_vocab=cfg.data.joint_vocab)
        tables = {id(t.weight) for t in (model.src_embed, model.tgt_embed, model.output_proj)}
        extra = ((3 - len(tables)) * v * m.d_model
                 + (2 * m.max_positions * m.d_model if m.positional == "sinusoidal" else 0)
                 + (0 if m.norm_first else 4 * m.d_model))
        assert estimated_parameters(cfg) == count_parameters(model) + extra, overrides
