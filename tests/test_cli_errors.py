"""A bad value given to a script is one line ``error: ...`` on stderr, exit status 2, no
traceback, and nothing written: the wiring, a few rows a script (each script runs its
check right after composition; the rules themselves, every key and value, are properties
in tests/test_config.py and tests/test_paths.py).

A row is ``row(script, *overrides, expect=..., make=...)``: ``{tmp}`` in an override is the
row's own empty folder (also the working dir), ``make`` lists files (``name``) and folders
(``name/``) to create there first, ``expect`` is a piece of the error line (the key it names),
so a row cannot pass on some other error. Each script also gets ``BASE`` overrides that make
it fail fast on a missing corpus / run, should the checked value ever be let through. To add
a row that needs a trained run, build the run in ``make``'s place with a fixture and pass
its path (these rows check values before any run is read).

Rows run in this process through the script's own code: Hydra composes the script's config,
and the script's ``main`` (its checks, then its work) is called inside ``run_hydra`` exactly
as ``__main__`` does, so a composition error, a check and a later error each take the real
path. ``SUBPROCESS`` rows (one per script) run the script itself, as a user does: the
process boundary, Hydra's run dir (made and removed again) and the exit status.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import forked
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_script_in_process, script_module

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "他喜欢猫吗？"
BASE = {  # per script: overrides every row starts from (a row's own ones replace them)
    "train": ["hydra.run.dir={tmp}/run", "data=text_files", "data.path={tmp}/no-corpus",
              "data.cache_dir={tmp}/cache"],
    "prepare_data": ["data=text_files", "data.path={tmp}/no-corpus", "data.cache_dir={tmp}/cache"],
    "translate": ["run={tmp}/no-run"],
    "analyze_heads": ["run={tmp}/no-run"],
    "average_checkpoints": ["run={tmp}/no-run"],
    "export": ["run={tmp}/no-run", "out={tmp}/out"],
    "serve": ["run={tmp}/no-run", "port=0"],
}


def row(script: str, *overrides: str, expect: str, make: tuple[str, ...] = ()):
    name = f"{script} {' '.join(overrides)}"
    return pytest.param(script, overrides, expect, make, id=name,
                        marks=[pytest.mark.slow] if name in SUBPROCESS else [])


# the rows run as a real process: one per script (a check error, a composition error, and
# errors found after the checks: no such export folder, no such run); slow (seconds each)
SUBPROCESS = {"train trainer.max_tokens=0", "prepare_data data.cache_dirr={tmp}/c",
              "translate engine=ct2 model_dir={tmp}/m", "export checkpoint=avg",
              "analyze_heads split=train", "average_checkpoints last=0", "serve port=70000"}


ROWS = [
    # each script's wiring to its check (the rules themselves: properties in
    # tests/test_config.py; the path rules: tests/test_paths.py): one rule a script, in this
    # process, besides its SUBPROCESS row
    row("train", "trainer.max_tokens=0", expect="trainer.max_tokens=0"),
    row("train", "optim.lr=nan", expect="optim.lr=nan"),
    row("train", "optim.betas=[2,3]", expect="optim.betas="),  # a list: no property has it
    # a key no schema has, added with +: the run could never be resumed
    row("train", "+foo=1", expect="foo: Key 'foo' not in 'TrainConfig'"),
    row("train", "trainer.resume={tmp}/nothing", expect="nothing/config.yaml"),
    # Hydra's own composition errors, made one line by tinymt.cli.run_hydra
    row("train", "model.n_head=4", expect="n_head"),
    row("train", "model.d_model=wide", expect="model.d_model=wide"),
    row("train", "model=huge", expect="model/huge"),
    row("prepare_data", "data=tatoeba_zh_en", "data.split_seed=-1", expect="data.split_seed=-1"),
    row("prepare_data", "data.cache_dirr={tmp}/c", expect="cache_dirr"),
    row("serve", "port=70000", expect="port=70000"),
    row("serve", "batch_sentences=0", expect="batch_sentences=0"),
    row("serve", "hosts=0.0.0.0", expect="hosts"),
    row("serve", "run={tmp}/no-run", expect="no-run"),  # after the checks: the run
    row("translate", "decode.max_len_a=1e308", expect="decode.max_len_a=1e+308"),
    row("translate", "attention_kinds=[]", expect="attention_kinds=[]"),
    # translation with CTranslate2: a folder that is no export (after the checks)
    row("translate", "engine=ct2", "model_dir={tmp}/m", expect="m is not a tinymt CTranslate2"),
    row("translate", "engine=ct2", "model_dir={tmp}/a_dir", make=("a_dir/",),
        expect="is not a tinymt CTranslate2 export"),
    row("export", "quantization=int4", expect="quantization='int4'"),
    row("export", "out=null", expect="out=None: empty"),
    row("export", "checkpoint=avg", expect="no-run does not exist"),
    row("analyze_heads", "split=train", expect="split='train'"),
    row("analyze_heads", "run={tmp}/nope", expect="nope does not exist"),
    row("average_checkpoints", "last=0", expect="last=0"),
    row("average_checkpoints", "last=-1", expect="last=-1"),
    # a key + adds that the script's schema has not: a typo, which would change nothing
    row("export", "+quantisation=int8", expect="quantisation: no such key in ExportConfig"),
    row("analyze_heads", "+max_sentence=5", expect="max_sentence: no such key in AnalyzeConfig"),
    row("average_checkpoints", "+outptu=x.pt", expect="outptu: no such key in AverageConfig"),
    row("prepare_data", "+data.vocab=500", expect="data.vocab: no such key in DataConfig"),
    row("translate", "+decode.bem=5", expect="decode.bem: no such key in DecodeConfig"),
]


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


def run_script(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return forked.run([sys.executable, str(ROOT / "scripts" / f"{script}.py"), *args],
                      cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def _merge(base: list[str], overrides: tuple[str, ...]) -> list[str]:
    """``base`` with the row's overrides replacing those of the same key (Hydra refuses
    a key given twice)."""
    keys = {o.split("=", 1)[0] for o in overrides}
    return [b for b in base if b.split("=", 1)[0] not in keys] + list(overrides)


@pytest.mark.parametrize("script,overrides,expect,make", ROWS)
def test_bad_value_is_one_line_error(tmp_path, monkeypatch, capsys, script, overrides, expect,
                                     make, request):
    for name in make:
        target = tmp_path / name
        target.mkdir() if name.endswith("/") else target.write_text("x\n")
    before = _files(tmp_path)
    args = [a.format(tmp=tmp_path) for a in _merge(BASE[script], overrides)]
    if script == "translate":
        args.append(SENTENCE)  # something to translate, should the value be let through
    if request.node.callspec.id in SUBPROCESS:
        r = run_script(script, args, cwd=tmp_path)
        status, stderr = r.returncode, r.stderr
    else:
        monkeypatch.chdir(tmp_path)
        status, stderr = run_script_in_process(script, args, capsys)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert status == 2, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert lines and lines[-1].startswith("error: "), stderr[-2000:]
    assert sum(ln.startswith("error:") for ln in lines) == 1, stderr
    assert expect in lines[-1], lines[-1]
    assert _files(tmp_path) == before  # nothing written: no run dir, no cache, no outputs/


@pytest.mark.slow
def test_hydra_flags_in_conflict_are_one_line(tmp_path):
    """Hydra's own flags are parsed before any config: -m with --cfg in conflict is one line."""
    r = run_script("train", ["-m", "model.n_heads=1,2", "--cfg", "hydra"], cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines == ["error: Only one of --run, --multirun, --cfg, --info and "
                     "--shell_completion can be specified"]
    # a sweep of a script that runs once: no multirun/ folder of its jobs
    r = run_script("translate", ["-m", "decode.beam=1,2", "他喜欢猫吗？"], cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: -m: translate.py runs once")
    assert len(r.stderr.splitlines()) == 1 and not any(tmp_path.iterdir())


def test_every_script_has_a_subprocess_row():
    scripts = {r.values[0] for r in ROWS if r.id in SUBPROCESS}
    assert scripts == set(BASE) and len(SUBPROCESS) == len(BASE)
    assert SUBPROCESS <= {r.id for r in ROWS}


def test_a_forked_pool_ends_as_usual_under_the_scripts_handlers():
    """Scripts turn SIGTERM into a stop (cleanup, one line, 143); a pool's forked workers,
    which the pool and its manager end with SIGTERM, still die of it: no traceback, no
    hang."""
    code = ("import multiprocessing, tinymt.cli\n"
            "with multiprocessing.Manager() as m:\n"
            "    barrier = m.Barrier(1)  # (a proxy the workers let go of as they end)\n"
            "    with multiprocessing.get_context('fork').Pool(2) as pool:\n"
            "        print(pool.map(abs, [-1, -2]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "[1, 2]\n", "")


def test_split_args():
    split = script_module("translate").split_args
    assert split(["run=r", "他", "decode.beam=5", "-m"]) == (["run=r", "decode.beam=5", "-m"], ["他"])
    assert split(["run=r", "--", "x=1", "-5 a", "--"]) == (["run=r"], ["x=1", "-5 a", "--"])
    assert split(["--", "a"]) == ([], ["a"]) and split([]) == ([], [])
    assert split(["--cfg", "job", "他", "-cn", "translate", "--info", "config", "猫"]) == (
        ["--cfg", "job", "-cn", "translate", "--info", "config"], ["他", "猫"])
    assert split(["--info", "他"]) == (["--info"], ["他"])  # (its value is optional)


# ----------------------------------------------------------------------------- internal faults
def _made_of_a_message(kind: type) -> bool:
    try:
        kind("x")
    except TypeError:  # UnicodeDecodeError, ExceptionGroup, ...: more arguments
        return False
    return True


# every built-in exception a script could meet that a message alone makes
BUILTIN_ERRORS = sorted((t for t in vars(builtins).values() if isinstance(t, type)
                         and issubclass(t, Exception) and _made_of_a_message(t)),
                        key=lambda t: t.__name__)


@given(kind=st.sampled_from(BUILTIN_ERRORS), message=st.text(max_size=200),
       on_ctrl_c=st.booleans())
def test_any_other_exception_is_one_line(kind, message, on_ctrl_c):
    """Property: not only our own error type: whatever built-in exception a script raises,
    with whatever message (newlines, markup, nothing), ends as one line: an ``OSError`` (the
    machine's: a full disk) ``error: <its first line>``, a closed pipe nothing, any other
    ``error: internal error (...)``, exit status 1 (not the user's input); raised while a
    Ctrl-C was on its way out (a library's cleanup failing), ``interrupted`` and 130.
    ``TINYMT_TRACEBACK=1`` re-raises it."""
    from tinymt.cli import TRACEBACK, one_line_errors
    from tinymt.errors import first_line

    exc = kind(message)

    def fails():
        if not on_ctrl_c:
            raise exc
        try:
            raise KeyboardInterrupt
        finally:
            raise exc

    err = io.StringIO()
    with mock.patch.dict(os.environ, {TRACEBACK: "0"}), contextlib.redirect_stderr(err), \
            pytest.raises(SystemExit) as e:
        one_line_errors(fails)()
    err = err.getvalue()
    if on_ctrl_c:
        assert e.value.code == 130 and err == "interrupted\n"
    elif issubclass(kind, BrokenPipeError):
        assert e.value.code == 1 and err == ""
    elif issubclass(kind, OSError):
        assert e.value.code == 1 and err == f"error: {first_line(exc)}\n", err
    else:
        assert e.value.code == 1 and err.count("\n") == 1, err
        assert err.startswith(f"error: internal error ({kind.__name__}") and TRACEBACK in err
    with mock.patch.dict(os.environ, {TRACEBACK: "1"}), pytest.raises(kind):
        one_line_errors(fails)()


# a Hydra composition whose cleanup failed on a Ctrl-C's way out: Hydra's error, its cause
# OmegaConf's (seen once: "'NoneType' object has no attribute '_invalidate_flags_cache'")
COMPOSING_ON_CTRL_C = """
from tinymt.cli import run_hydra
from hydra.errors import ConfigCompositionException
def main():
    try:
        try:
            raise KeyboardInterrupt
        finally:
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
    except AttributeError as e:
        raise ConfigCompositionException("Error merging overrides") from e
run_hydra(main)
"""


@pytest.mark.slow  # a process of its own (forked)
def test_a_ctrl_c_inside_hydra_s_composition_is_interrupted():
    """A Ctrl-C whose cleanup failed inside Hydra's composition ends as any Ctrl-C does:
    ``interrupted``, exit 130 (not Hydra's error, exit 2)."""
    r = forked.run([sys.executable, "-c", COMPOSING_ON_CTRL_C], capture_output=True, text=True,
                   env=_no_traceback())
    assert (r.returncode, r.stderr) == (130, "interrupted\n")


DEFERRED_CTRL_C = """
import os, signal, sys, time, types
signal.signal(signal.SIGINT, signal.default_int_handler)  # (as a foreground job: not `cmd &`)
import tinymt.cli
probe = types.ModuleType("_probe")  # a library halfway through its import (not torch)
probe.__spec__ = types.SimpleNamespace(_initializing=True)
sys.modules["_probe"] = probe
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.3)
print("deferred", flush=True)
probe.__spec__._initializing = False
time.sleep(10)
print("not interrupted", flush=True)
"""


@pytest.mark.slow  # a process of its own (forked)
def test_a_ctrl_c_while_a_library_imports_waits_for_the_import():
    """A Ctrl-C while a library is being imported could abort Python (a C++ exception through
    pybind11; or, at its teardown, "Fatal Python error": seen about once in a hundred
    Ctrl-Cs in translate.py's first two seconds while torch imported, and once after it,
    amid the compiled modules imported next): it comes once the import is done, as a Ctrl-C
    does (``interrupted``), and not before."""
    r = forked.run([sys.executable, "-c", DEFERRED_CTRL_C], capture_output=True, text=True,
                   env=_no_traceback(), timeout=60)
    assert (r.stdout, r.stderr) == ("deferred\n", "interrupted\n") and r.returncode in (130, -2)


@pytest.mark.slow  # a script in its own process, a few times: ~15 s
@settings(max_examples=8, deadline=None)
@given(after=st.floats(0.0, 2.0))
def test_a_ctrl_c_at_any_moment_is_one_line(tiny_run, after):
    """Property: Ctrl-C at any moment of ``translate.py``'s life, its imports included, ends
    it with ``interrupted`` (exit 130, or Python's own death by SIGINT), or it had ended
    already with its translation: never a traceback (a ``KeyboardInterrupt`` traceback, or
    OmegaConf's ``UnboundLocalError`` raised on the Ctrl-C's way out, without the hook of
    :mod:`tinymt.cli`)."""
    import signal
    import time

    p = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "translate.py"),
                          f"run={tiny_run}", SENTENCE], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=_no_traceback())
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    if p.returncode == 0:
        assert out.count("\n") == 1 and err == ""
    else:
        # (a signal before Python has started ends it as it ends any program: silently)
        assert p.returncode in (130, -signal.SIGINT) and err in ("interrupted\n", ""), err[-2000:]


@pytest.mark.slow  # scripts in their own processes: ~3 s
def test_a_full_or_closed_stdout_is_one_line_or_quiet(tiny_run):
    """Output to a full disk (``/dev/full``): one ``error:`` line naming it, exit 1, from
    the translation, from Hydra's ``--help`` and from argparse's (the benchmark's); to a
    pipe closed before the answer (``| head`` done): nothing on stderr, exit 1. Not Python's
    own end: a last flush of stdout that fails, ``Exception ignored ...`` and exit status
    120 (forked children end so too), nor argparse's: the help dropped, exit 0."""
    translate = [sys.executable, str(ROOT / "scripts" / "translate.py")]
    benchmark = [sys.executable, str(ROOT / "scripts" / "benchmark.py")]  # argparse, not Hydra
    # stdout buffered, as in a user's shell (-u or PYTHONUNBUFFERED would write at once)
    buffered = {k: v for k, v in _no_traceback().items() if k != "PYTHONUNBUFFERED"}
    for cmd in (translate + [f"run={tiny_run}", SENTENCE], translate + ["--help"],
                benchmark + ["--help"]):
        with open("/dev/full", "w") as full:
            r = forked.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, env=buffered)
        assert r.returncode == 1 and r.stderr == "error: [Errno 28] No space left on device\n", \
            r.stderr[-2000:]
    p = forked.popen(translate + [f"run={tiny_run}", SENTENCE],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=buffered)
    p.stdout.close()  # the reader is gone before the first line
    assert p.wait(timeout=120) == 1 and p.stderr.read() == b""


def _no_traceback() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TINYMT_TRACEBACK"}


@pytest.mark.slow  # the script in its own process: ~3 s
def test_a_bad_merge_is_one_line_before_any_measuring_through_the_real_script(tmp_path):
    """benchmark.py --merge of a JSON whose sections are not what it wrote: one line naming
    the file and the field, exit 2, before the measuring starts (which logs first)."""
    bad = tmp_path / "m.json"
    bad.write_text('{"devices": {"cpu": {"training": 5}}}')
    r = forked.run([sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--device", "cpu",
                    "--quick", "--sections", "decoding", "--sizes", "tiny", "--sentences", "4",
                    "--merge", str(bad), "--out", "x.md", "--json", "x.json"],
                   cwd=tmp_path, capture_output=True, text=True,
                   env={k: v for k, v in os.environ.items() if k != "TINYMT_TRACEBACK"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert r.stderr.startswith(f"error: --merge {bad}: devices is not what ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
