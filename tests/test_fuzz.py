"""Hostile inputs that only a real command meets: values at the very bounds that must
still work (a real translation), and hostile files to read (devices, endless pipes and
stdin, over-long lines) -- one line ``error: ...`` or a clean run, never a traceback, a
hang or an allocation error.

The numeric rules themselves (every key of every script, 0 / -1 / huge / inf / nan / the
other type) are properties of the rule tables in tests/test_config.py; the path rules
(pipes, sockets, devices, unwritable and run folders as outputs) properties in
tests/test_paths.py; each script's wiring to its check, one row a script in
tests/test_cli_errors.py. A case here runs the real script in this process
(:func:`conftest.run_script_in_process`) and is refused -- exit status 2, one ``error:``
line, nothing written -- or completes (exit status 0) within ``CASE_LIMIT_S``.
"""

from __future__ import annotations

import io
import os
import resource
import signal
import socket
import stat
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import forked
import pytest

from conftest import REPO_ROOT, copy_run, run_script_in_process

CASE_LIMIT_S = 30  # one case, accepted (a real translation) or refused
SENTENCE = "他喜欢猫吗？"
BASE = {  # per script: {tmp} = the case's own (empty) folder, also the working dir
    "translate": ["run={run}", "device=cpu", "decode.beam=2"],
}


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
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)  # (the suite's own: pytest-timeout)
    start = time.monotonic()
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
        if outer:  # the suite's alarm goes on from where it was
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


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


# ----------------------------------------------------------------------------- bounds that work
def _refused(script, overrides, expect, places, tmp_path, capsys, monkeypatch, **kw):
    status, lines = run_case(script, overrides, places, tmp_path, capsys, monkeypatch, **kw)
    assert status == 2, lines
    assert expect in lines[-1], lines[-1]
    return lines[-1]


@pytest.mark.parametrize("overrides", [
    ["decode.beam=4", "decode.len_penalty=10"], ["decode.beam=4", "decode.len_penalty=-10"],
    ["decode.beam=256", "decode.nbest=256", "decode.batch_tokens=4096"],
    ["decode.beam=1", "decode.batch_tokens=262144"],
])
def test_extreme_but_allowed_decoding_runs(overrides, places, tmp_path, capsys, monkeypatch):
    """The bounds themselves are values that work: a real translation of the tiny run."""
    status, lines = run_case("translate", overrides, places, tmp_path, capsys, monkeypatch)
    assert status == 0, lines


# ----------------------------------------------------------------------------- hostile paths
def _zero_keys(schema, skip=()) -> list[str]:
    """The number keys of ``schema`` whose check takes 0 ("0 = off", "0 = all", a seed)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    from tinymt.config import allowed_values

    def takes_zero(key, allowed) -> bool:  # a number field (a string one holds "0")
        cfg = OmegaConf.structured(schema)
        try:
            OmegaConf.update(cfg, key, 0)
        except ValidationError:  # a list
            return False
        return type(OmegaConf.select(cfg, key)) in (int, float) and allowed(0) is None

    return [k for k, allowed in allowed_values(schema).items()
            if k not in skip and takes_zero(k, allowed)]


@pytest.mark.slow  # a tiny training, a translation and a head analysis: ~6 s
def test_zero_where_allowed_is_a_value_that_works(places, tmp_path, capsys, monkeypatch):
    """Every number key a rule lets take 0 takes it for real (what the fuzz's accepted
    "0" rows ran): one tiny training with all of them 0 at once, one translation, one head
    analysis. The keys come from the schemas: a new one joins by itself."""
    from tinymt.config import AnalyzeConfig, TrainConfig, TranslateConfig

    train_zeros = _zero_keys(TrainConfig, skip=("trainer.num_threads",))  # 0 = every core
    assert {"trainer.seed", "optim.warmup_steps", "data.max_len", "trainer.patience"} <= set(
        train_zeros)
    monkeypatch.chdir(tmp_path)
    tiny = ["data.train_size=60", "data.valid_size=4", "data.test_size=4",
            "data.vocab_size=400", "model.d_model=8", "model.n_heads=2",
            "model.n_encoder_layers=1", "model.n_decoder_layers=1", "model.d_ff=16",
            "model.max_positions=128", "trainer.max_tokens=400", "trainer.num_threads=1",
            "trainer.test_beam=1", "trainer.attention_images=false", "trainer.max_steps=1",
            "trainer.valid_every=1", "trainer.device=cpu", f"data.cache_dir={places['cache']}",
            f"run_dir={tmp_path}/run", f"hydra.run.dir={tmp_path}/h"]
    with case_limits(120):
        status, err = run_script_in_process(
            "train", [*(o for o in tiny if o.split("=")[0] not in train_zeros),
                      *(f"{k}=0" for k in train_zeros)], capsys)
    assert status == 0 and "Traceback" not in err, err[-3000:]
    decode_zeros = _zero_keys(TranslateConfig, skip=("decode.max_len_b",))  # a with b: no room
    status, lines = run_case("translate", [f"{k}=0" for k in decode_zeros], places, tmp_path,
                             capsys, monkeypatch)
    assert status == 0 and decode_zeros, lines
    analyze_zeros = _zero_keys(AnalyzeConfig)
    with case_limits(120):
        status, err = run_script_in_process("analyze_heads", [
            f"run={places['run']}", "device=cpu", f"prune_output={tmp_path}/pruned.pt",
            *(f"{k}=0" for k in analyze_zeros)], capsys)
    assert status == 0 and "Traceback" not in err and analyze_zeros, err[-3000:]


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
    r = forked.run([sys.executable, str(REPO_ROOT / "scripts" / "translate.py"),
                    f"run={tmp_path}/no-run", f"output={fifo}", SENTENCE], cwd=tmp_path,
                   env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("error: output=") and line.endswith(
        ": not a regular file (a pipe, socket or device): name a file to write (nothing was "
        "written)"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]
