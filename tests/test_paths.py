"""Every path-taking option of every script against a matrix of hostile targets.

Each case runs the script in this process (Hydra's composition and the script's ``main``;
the benchmark's ``main``) from a working folder holding a copy of a trained run, a file
"outside" and the targets. Every case must end with exit status 2 and exactly one
``error:`` line, no traceback, and every file of the working folder as it was (hashed;
links by their target, pipes and devices by kind). A target that is refused names its
option; a target that may be used is let through, and the command then stops at the error
its base arguments are built to reach (a corpus, run or export that does not exist), so
no case does real work. Adding a script, or a path option to one, without a row here
fails :func:`test_every_path_option_has_a_row`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from pathlib import Path

import pytest

from conftest import REPO_ROOT, copy_run, run_script_in_process
from tinymt import config as C

# script -> (its schema (None: argparse), base arguments, the error they reach when every
# path given is let through)
SCRIPTS = {
    "train": (C.TrainConfig, ["data=text_files", "data.path={tmp}/no-corpus",
                              "data.cache_dir={tmp}/cache"], "no-corpus"),
    "prepare_data": (C.PrepareConfig, ["data=text_files", "data.path={tmp}/no-corpus",
                                       "data.cache_dir={tmp}/cache"], "no-corpus"),
    "translate": (C.TranslateConfig, ["run={tmp}/no-run"], "no-run"),
    "serve": (C.ServeConfig, ["run={tmp}/no-run", "port=0"], "no-run"),
    "export": (C.ExportConfig, ["run={tmp}/no-run", "out={tmp}/export"], "no-run"),
    "analyze_heads": (C.AnalyzeConfig, ["run={tmp}/no-run"], "no-run"),
    "average_checkpoints": (C.AverageConfig, ["run={tmp}/no-run"], "no-run"),
    "benchmark": (None, ["--quick", "--sections", "serve", "--out", "{tmp}/bench.md"],
                  "--sections serve needs --run"),
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

TARGETS = {  # name -> the value given (formatted with {tmp}, {run})
    "run state": "{run}/checkpoints/last.pt",
    "in a run": "{run}/new.txt",
    "same file": None,  # the command's other output, given the same value
    "link out": "{tmp}/link.html",  # a symbolic link to a file outside
    "pipe": "{tmp}/fifo",
    "device": "{tmp}/null",  # a private copy of /dev/null (never the machine's own)
    "empty": "",
    "blank": "  ",
    "folder": "{tmp}/adir",
    "unwritable": UNWRITABLE,
    "long name": "{tmp}/" + "n" * 300,
}
# targets that are a fine value: let through, the base error follows (a link is replaced,
# never written through; an existing folder takes a new run, the cache, attention maps)
LET_THROUGH = {"W": {"link out"}, "F": {"folder"}, "R": set()}
LET_THROUGH_OPTION = {("translate", "attention"): {"link out", "folder"},
                      ("export", "out"): set(),  # a new folder: an existing one is refused
                      ("translate", "input"): {"pipe"}, ("translate", "ref"): {"pipe"},
                      ("serve", "api_keys"): {"pipe"}}  # <(command) as a text file
# reading: which targets a reader must refuse (others may be read, or not be there)
READ_REFUSED = {"empty", "blank", "pipe", "device", "long name"}


def _cases():
    for (script, option), kind in OPTIONS.items():
        for target in TARGETS:
            if target == "same file" and (script, option) not in OTHER_OUTPUT:
                continue
            if kind == "R" and target in ("in a run", "unwritable", "same file"):
                continue  # nothing is written: the reads' own matrix
            yield pytest.param(script, option, kind, target, id=f"{script} {option} {target}")


def _schema_strings(schema, prefix=""):
    """The dotted names of a schema's string fields (those whose rule is no choice)."""
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.default_factory):
            yield from _schema_strings(f.default_factory, f"{prefix}{f.name}.")
        elif "str" in str(f.type) and "list" not in str(f.type):
            rule = f.metadata.get("rule")
            if not (rule and rule[1].startswith("choose one of")):
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
    for script, (schema, _, _) in SCRIPTS.items():
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


@pytest.fixture(scope="module")
def shared_place(tiny_run, tmp_path_factory):
    """The working folder: a run, a file outside it, and the targets (one for all the cases:
    each checks that it changed nothing)."""
    tmp_path = tmp_path_factory.mktemp("paths")
    run = copy_run(tiny_run, tmp_path / "run")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.html").write_text("not to be touched\n")
    (tmp_path / "link.html").symlink_to(outside / "precious.html")
    os.mkfifo(tmp_path / "fifo")
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except OSError:
        (tmp_path / "null").symlink_to("/dev/null")  # not root: the device itself is safe
    (tmp_path / "adir").mkdir()
    if "{tmp}" in UNWRITABLE:
        (tmp_path / "ro").mkdir(mode=0o500)
    return tmp_path, run


@pytest.fixture
def place(shared_place, monkeypatch):
    monkeypatch.chdir(shared_place[0])
    return shared_place


@pytest.mark.parametrize("script,option,kind,target", list(_cases()))
def test_a_hostile_path_is_one_line_and_changes_nothing(place, capsys, monkeypatch, script,
                                                        option, kind, target):
    tmp, run = place
    schema, base, later = SCRIPTS[script]
    value = TARGETS[target]
    value = ("{tmp}/same.html" if target == "same file" else value).format(tmp=tmp, run=run)
    given = [(option, value)]
    if target == "same file":
        given.append((OTHER_OUTPUT[(script, option)], value))
    args = [a.format(tmp=tmp) for a in base]
    for opt, v in given:
        args = _with(args, opt, v, argparse=schema is None)
    before = _snapshot(tmp)
    status, err = _run(script, args, capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert status == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    if target in LET_THROUGH_OPTION.get((script, option), LET_THROUGH[kind]):
        assert later in lines[0], lines[0]
    elif kind != "R" or target in READ_REFUSED:
        assert option.lstrip("-") in lines[0] and later not in lines[0], lines[0]
    assert _snapshot(tmp) == before


def _with(args: list[str], option: str, value: str, argparse: bool) -> list[str]:
    """``args`` with ``option`` set to ``value`` (replacing the base's own)."""
    if argparse:
        if option in args:
            i = args.index(option)
            return args[:i] + [option, value] + args[i + 2:]
        return [*args, option, value]
    return [a for a in args if not a.startswith(f"{option}=")] + [f"{option}={value}"]


def _run(script: str, args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    if script == "translate":
        args = [*args, "--", "他喜欢猫吗？"]  # something to translate, if it gets that far
    if script != "benchmark":
        return run_script_in_process(script, args, capsys)
    from tinymt.bench.main import main

    monkeypatch.chdir(Path.cwd())  # the benchmark moves to the repository; put it back
    capsys.readouterr()
    try:
        status = main(args)
    except SystemExit as e:
        status = e.code
    return status, capsys.readouterr().err
