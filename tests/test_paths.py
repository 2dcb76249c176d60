"""Every path-taking option of every script against every hostile target, at the rules
themselves: the schema rule of each option (``tinymt.config``: the check each script runs
right after composition, with its cross rules), the benchmark's ``check_paths``, and
``tinymt.files`` below them (:func:`output_problem`, :func:`name_problem`,
:func:`check_outputs`).

A target that is refused is one ``TinyMTError`` line naming the option; a target that may
be used (a link to replace, a folder to fill, a pipe to read) is let through; nothing is
ever written, nor any pipe opened (a watchdog ends a check that blocks). Each script's
wiring to its check (one line, exit status 2, nothing written, through the real script):
tests/test_cli_errors.py, one row a script, and the benchmark's two rows here. Adding a
script, or a path option to one, without a row here fails
:func:`test_every_path_option_has_a_row`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import functools
import hashlib
import os
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from conftest import REPO_ROOT
from tinymt import config as C
from tinymt.errors import TinyMTError
from tinymt.files import NAME_MAX, check_output, check_outputs, name_problem, output_problem

# script -> its schema (None: argparse) and the check its main runs first
SCRIPTS = {
    "train": (C.TrainConfig, C.check_train),
    "prepare_data": (C.PrepareConfig, lambda c: C.check_data(c.data)),
    "translate": (C.TranslateConfig, C.check_translate),
    "serve": (C.ServeConfig, C.check_serve),
    "export": (C.ExportConfig, C.check_export),
    "analyze_heads": (C.AnalyzeConfig, C.check_analyze),
    "average_checkpoints": (C.AverageConfig, C.check_average),
    "benchmark": (None, None),
}
# (script, option) -> what it names: W a file to write, F a folder to write, R a file or
# folder to read. The option is spelled as on the command line.
OPTIONS = {
    ("train", "run_dir"): "F", ("train", "data.cache_dir"): "F",
    ("train", "trainer.resume"): "R", ("train", "data.path"): "R",
    ("prepare_data", "data.cache_dir"): "F", ("prepare_data", "data.path"): "R",
    ("translate", "output"): "W", ("translate", "attention"): "W",
    ("translate", "input"): "R", ("translate", "ref"): "R", ("translate", "run"): "R",
    ("translate", "checkpoint"): "R", ("translate", "model_dir"): "R",
    ("translate", "outputs_root"): "R",
    ("serve", "run"): "R", ("serve", "checkpoint"): "R", ("serve", "model_dir"): "R",
    ("serve", "api_keys"): "R", ("serve", "outputs_root"): "R",
    ("export", "out"): "F", ("export", "run"): "R", ("export", "checkpoint"): "R",
    ("export", "outputs_root"): "R",
    ("analyze_heads", "prune_output"): "W", ("analyze_heads", "run"): "R",
    ("analyze_heads", "checkpoint"): "R", ("analyze_heads", "outputs_root"): "R",
    ("analyze_heads", "cache_dir"): "F",
    ("average_checkpoints", "output"): "W", ("average_checkpoints", "run"): "R",
    ("average_checkpoints", "outputs_root"): "R",
    ("benchmark", "--out"): "W", ("benchmark", "--json"): "W", ("benchmark", "--merge"): "R",
    ("benchmark", "--run"): "R", ("benchmark", "--checkpoint"): "R",
    ("benchmark", "--data-path"): "R", ("benchmark", "--cache-dir"): "F",
}
# the string options that name no file (names, languages, splits, hosts, lists of values)
NOT_PATHS = {"data.name", "data.src_lang", "data.tgt_lang", "data.train_split",
             "data.valid_split", "data.test_split", "model.name", "optim.name",
             "trainer.name", "host", "--sizes", "--sections", "--serve-clients"}
# the other output of a command with two, for the "same file" target
OTHER_OUTPUT = {("translate", "output"): "attention", ("translate", "attention"): "output",
                ("benchmark", "--out"): "--json", ("benchmark", "--json"): "--out"}
# root may write anywhere a mode allows; sysfs refuses new files even to root
UNWRITABLE = "/sys/tinymt-test" if os.geteuid() == 0 else "{tmp}/ro/x"
READ_ONLY = "/sys" if os.geteuid() == 0 else "{tmp}/ro"  # a folder that exists, read-only

TARGETS = {  # name -> the value given (formatted with {tmp}, {run})
    "run state": "{run}/checkpoints/last.pt",
    "run config": "{run}/config.yaml",
    "run tokenizer": "{run}/tokenizer/spm.model",
    "in a run": "{run}/new.txt",  # a new file in a run: no state of the run is lost
    "link out": "{tmp}/link.html",  # a symbolic link to a file outside
    "pipe": "{tmp}/fifo",
    "socket": "{tmp}/sock",
    "device": "{tmp}/null",  # a private copy of /dev/null (never the machine's own)
    "empty": "",
    "blank": "  ",
    "folder": "{tmp}/adir",
    "a file": "{tmp}/afile",
    "under a file": "{tmp}/afile/x.html",
    "unwritable": UNWRITABLE,
    "read-only folder": READ_ONLY,
    "long name": "{tmp}/" + "n" * 300,
}
# targets that are a fine value: let through (a link is replaced, never written through; an
# existing folder takes a new run, the cache, attention maps; a new name in a run is no
# state of it: train's run_dir= there is refused when the run is claimed, tests/test_rundir.py;
# a read-only folder holds a cache to read: a write there fails when it is made, in one line)
LET_THROUGH = {"W": {"link out", "a file", "in a run"},
               "F": {"folder", "in a run", "read-only folder"}, "R": set()}
LET_THROUGH_OPTION = {("translate", "attention"): {"link out", "folder", "in a run"},
                      ("export", "out"): {"in a run"},  # a new folder: an existing one is refused
                      ("translate", "input"): {"pipe"}, ("translate", "ref"): {"pipe"},
                      ("serve", "api_keys"): {"pipe"}}  # <(command) as a text file
# reading: which targets a reader must refuse (others may be read, or not be there)
READ_REFUSED = {"empty", "blank", "pipe", "socket", "device", "long name"}
# the base values of a check: a run that does not exist, an export folder to make
BASE = {"run": "{tmp}/no-run", "out": "{tmp}/export"}


def _schema_strings(schema, prefix=""):
    """The dotted names of a schema's string fields (those whose rule is no choice)."""
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.default_factory):
            yield from _schema_strings(f.default_factory, f"{prefix}{f.name}.")
        elif "str" in str(f.type) and "list" not in str(f.type):
            allowed = f.metadata.get("allowed")  # words to choose (a tuple), or a device
            if not (isinstance(allowed, tuple) or allowed is C.DEVICE):
                yield prefix + f.name


def _argparse_strings():
    from tinymt.bench.main import build_parser

    return [a.option_strings[-1] for a in build_parser()._actions
            if a.option_strings and a.type in (None, str, Path) and a.nargs != 0
            and a.choices is None
            and a.dest != "help"]


def test_every_path_option_has_a_row():
    scripts = {p.stem for p in (REPO_ROOT / "scripts").glob("*.py")}
    assert scripts == set(SCRIPTS), "a script without rows here (or rows of no script)"
    for script, (schema, _) in SCRIPTS.items():
        strings = set(_schema_strings(schema) if schema else _argparse_strings())
        paths = {o for (s, o) in OPTIONS if s == script}
        assert strings - NOT_PATHS == paths, f"{script}: options without a row (or gone)"


def _snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file by its bytes' digest, a link by its target, a
    folder, pipe or device by its kind."""
    out = {}
    for p in sorted(root.rglob("*")):
        mode = p.lstat().st_mode
        if stat.S_ISLNK(mode):
            out[str(p)] = "-> " + os.readlink(p)
        elif stat.S_ISREG(mode):
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[str(p)] = stat.filemode(mode)
    return out


@contextlib.contextmanager
def watchdog(seconds: float = 60):
    """A check that opens a pipe blocks: the process ends after ``seconds`` with its stack."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.__stderr__)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """The working folder: a run (its config, tokenizer, checkpoints), a file
    outside it, and the targets."""
    import socket

    tmp = tmp_path_factory.mktemp("paths")
    run = tmp / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "tokenizer").mkdir()
    for name in ("config.yaml", "tokenizer/spm.model", "checkpoints/last.pt",
                 "checkpoints/best.pt", "metrics.json"):
        (run / name).write_text("state\n")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "precious.html").write_text("not to be touched\n")
    (tmp / "link.html").symlink_to(outside / "precious.html")
    os.mkfifo(tmp / "fifo")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp / "sock"))
    try:
        os.mknod(tmp / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        (tmp / "null").symlink_to("/dev/null")  # not root: the device itself is safe
    (tmp / "adir").mkdir()
    (tmp / "afile").write_text("x\n")
    if "{tmp}" in UNWRITABLE:
        (tmp / "ro").mkdir(mode=0o500)
    return tmp, run


def _bench_check(option: str, value: str, tmp: Path, other: str | None = None) -> None:
    """The benchmark's check of its path options (argparse: no schema)."""
    from tinymt.bench.main import check_paths

    args = argparse.Namespace(out=str(tmp / "bench.md"), json=None, merge=None, run=None,
                              checkpoint=None, data_path=None, cache_dir=None)
    setattr(args, option.lstrip("-").replace("-", "_"), value)
    if other:
        setattr(args, other.lstrip("-").replace("-", "_"), value)
    check_paths(args, tmp)


def _check(script: str, option: str, value: str, tmp: Path, same: bool = False) -> None:
    """The script's own check with ``option=value`` (and, ``same``, its other output
    naming the same file), on a config otherwise at its defaults."""
    schema, check = SCRIPTS[script]
    if schema is None:
        return _bench_check(option, value, tmp, OTHER_OUTPUT[(script, option)] if same else None)
    cfg = OmegaConf.create(_defaults(schema, tmp))
    OmegaConf.update(cfg, option, value)
    check(cfg)
    if (script, option) in {("translate", "output"), ("translate", "attention"), ("export", "out"),
                            ("analyze_heads", "prune_output"), ("average_checkpoints", "output")}:
        # an output: the command's own check, before any work (translate: its two outputs)
        check_output(C.attention_file(value) if option == "attention" else value, option,
                     folder=option == "out")
    if same:  # the command's outputs, checked together (tinymt.translate)
        other = OTHER_OUTPUT[(script, option)]
        check_outputs((option, value), (other, C.attention_file(value) if other == "attention"
                                        else value))


@functools.cache
def _defaults(schema, tmp: Path) -> dict:
    out = OmegaConf.to_container(OmegaConf.structured(schema))
    return {**out, **{k: v.format(tmp=tmp) for k, v in BASE.items() if k in out}}


CASES = [(s, o, k, t) for (s, o), k in OPTIONS.items() for t in TARGETS]


def test_every_option_against_every_target(place, monkeypatch):
    """The whole matrix (every option of every script x every target, ~500 checks, each
    a few stat calls): a refusal is one line naming its option; a usable target passes;
    nothing in the working folder changes, no pipe is opened."""
    tmp, run = place
    monkeypatch.chdir(tmp)
    before = _snapshot(tmp)
    seen = {"refused": 0, "let through": 0}
    with watchdog():
        for script, option, kind, target in CASES:
            value = TARGETS[target].format(tmp=tmp, run=run)
            case = f"{script} {option}={target}"
            try:
                _check(script, option, value, tmp)
                refused = None
            except TinyMTError as e:
                refused = str(e)
                assert "\n" not in refused and refused.startswith(
                    (f"{option}=", f"{option} ")), (case, refused)
            if target in LET_THROUGH_OPTION.get((script, option), LET_THROUGH[kind]):
                assert refused is None, (case, refused)
                seen["let through"] += 1
            elif kind != "R" or target in READ_REFUSED:
                assert refused is not None, f"{case}: let through"
                seen["refused"] += 1
    assert _snapshot(tmp) == before
    assert seen["refused"] >= 200 and seen["let through"] >= 10, seen


@pytest.mark.parametrize("script,option", list(OTHER_OUTPUT))
def test_two_outputs_naming_one_file_are_refused(place, monkeypatch, script, option):
    tmp, _ = place
    monkeypatch.chdir(tmp)
    before = _snapshot(tmp)
    with pytest.raises(TinyMTError, match="name the same file") as e:
        _check(script, option, str(tmp / "same.html"), tmp, same=True)
    assert "\n" not in str(e.value) and _snapshot(tmp) == before


NAME_CHARS = st.sampled_from(["a", "é", "猫", " ", "/", ".", "..", "\t", "-", "~", "x" * 40])


@given(st.lists(NAME_CHARS, max_size=80).map("".join))
@example("")
@example("   ")
@example("/" + "n" * 300)
@example("a/" * 2100)
@example("猫" * 86)  # 258 bytes in one name
@example("~nosuchuser-tinymt/x.txt")  # expanduser raises RuntimeError on an unknown user
def test_any_name_is_judged_in_one_line_and_nothing_is_made(place, text):
    """Whatever string names an output (blank, a name over 255 bytes, a path over 4096,
    any characters): :func:`output_problem` answers None or one line, never raises, and
    leaves the folder as it was; a blank one and an over-long name are always refused."""
    tmp, _ = place
    with contextlib.chdir(tmp / "adir"):
        why = output_problem(text)
    assert why is None or (isinstance(why, str) and "\n" not in why)
    if not text.strip():
        assert why.startswith("empty")
    elif text.startswith("~nosuchuser"):
        assert why == "~nosuchuser-tinymt: no such user, so no such home folder", why
    elif any(len(p.encode()) > NAME_MAX for p in Path(text).parts):
        assert why == name_problem(text) and "too long" in why
    assert not any((tmp / "adir").iterdir())


@given(st.sampled_from(["--out", "--json"]), st.sampled_from(["pipe", "run state", "folder"]))
def test_benchmark_outputs_follow_the_same_rules(place, option, target):
    """The benchmark's outputs go through the same :func:`check_outputs` (cheap: it is
    argparse, not a schema rule)."""
    tmp, run = place
    with contextlib.chdir(tmp), pytest.raises(TinyMTError) as e:
        _bench_check(option, TARGETS[target].format(tmp=tmp, run=run), tmp)
    assert str(e.value).startswith(f"{option}=") and "\n" not in str(e.value)


@pytest.mark.parametrize("args,words", [
    (["--out", "{tmp}/fifo"], "--out={tmp}/fifo: not a regular file"),
    (["--out", "{tmp}/same.md", "--json", "{tmp}/same.md"], "name the same file"),
])
def test_the_benchmark_s_paths_through_its_main(place, capsys, monkeypatch, args, words):
    """The benchmark's wiring (its main, in this process): one line, exit status 2."""
    from tinymt.bench.main import main

    tmp, _ = place
    monkeypatch.chdir(tmp)
    before = _snapshot(tmp)
    capsys.readouterr()
    with watchdog(), pytest.raises(SystemExit) as e:
        main(["--quick", "--sections", "serve", *(a.format(tmp=tmp) for a in args)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    assert words.format(tmp=tmp) in err and _snapshot(tmp) == before
