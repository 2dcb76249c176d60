"""The one write path (tinymt.files), directly."""

from __future__ import annotations

import errno
import stat

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tinymt.errors import TinyMTError
from tinymt.files import (
    TEMP_PREFIX,
    check_output,
    check_outputs,
    output_problem,
    read_bytes,
    write_file,
    write_folder,
    write_text,
)


@pytest.fixture
def run(tmp_path):
    """A folder that is a run: its checkpoints and a last.pt."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"state")
    return run


def test_a_link_is_replaced_never_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    link = tmp_path / "out.txt"
    link.symlink_to(outside)
    write_text("new\n", check_output(link, "output"))
    assert not link.is_symlink() and link.read_text() == "new\n"
    assert outside.read_text() == "precious\n"


def test_a_folder_on_the_way_is_followed_to_where_it_really_is(tmp_path, run):
    """A link to a run's checkpoints folder is its checkpoints folder: its last.pt is
    refused, a new file there is written into the run."""
    (tmp_path / "ckpts").symlink_to(run / "checkpoints")
    with pytest.raises(TinyMTError, match="checkpoint last.pt of the run"):
        check_output(tmp_path / "ckpts" / "last.pt", "output")
    write_text("x", check_output(tmp_path / "ckpts" / "mine.pt", "output"))
    assert (run / "checkpoints" / "mine.pt").read_text() == "x"


def test_a_published_file_has_the_usual_mode(tmp_path, monkeypatch):
    """The temp file is private (0600); what is published gets 0666 (a folder 0777) less
    the process's umask."""
    import tinymt.files

    monkeypatch.setattr(tinymt.files, "UMASK", 0o027)
    write_text("x", tmp_path / "out.txt")
    write_folder(lambda f: (f / "a").write_text("a"), tmp_path / "folder")
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "folder").stat().st_mode) == 0o750


def test_two_outputs_naming_one_file_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(TinyMTError, match="name the same file"):
        check_outputs(("output", tmp_path / "a" / "x.html"),
                      ("attention", tmp_path / "b" / "x.html"))
    assert not any((tmp_path / "a").iterdir())


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old\n")

    def half(f):
        f.write(b"half")
        raise OSError(errno.EIO, "Input/output error")

    with pytest.raises(TinyMTError, match="the previous version is intact"):
        from tinymt.files import write_file
        write_file(path, half)
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    assert path.read_text() == "old\n"


def test_two_publishers_of_one_folder_both_succeed(tmp_path):
    """Two processes build the same cache entry: the second finds the first's (ENOTEMPTY
    when renaming onto it) and uses it, instead of failing."""
    target = tmp_path / "entry"

    def build(folder):
        (folder / "data").write_text("one")
        write_folder(lambda inner: (inner / "data").write_text("two"), target)

    assert write_folder(build, target) is False  # the inner one published first
    assert (target / "data").read_text() == "two"
    assert not list(tmp_path.glob(f"{TEMP_PREFIX}*"))


# ----------------------------------------------------------------------------- properties
FAULTS = [OSError(errno.EIO, "Input/output error"), OSError(errno.ENOSPC, "No space left on device"),
          RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"),
          OSError(errno.EACCES, "Permission denied")]


@given(st.lists(st.binary(max_size=2000), max_size=6), st.none() | st.integers(0, 6),
       st.sampled_from(FAULTS), st.none() | st.binary(max_size=100))
@example([b"a" * 2000] * 3, 2, FAULTS[1], b"old")
def test_a_write_is_whole_or_leaves_the_old_file(tmp_path_factory, chunks, fail_at, fault, old):
    """write_file publishes all the bytes written, or -- a fault at any point of the writing
    (an I/O error, a full disk, torch's writer failing) -- leaves the old file exactly as it
    was (or none, if there was none), says so in one line, and leaves no temp file."""
    folder = tmp_path_factory.mktemp("write")
    path = folder / "out.bin"
    if old is not None:
        path.write_bytes(old)

    def write(f):
        for n, chunk in enumerate(chunks):
            if n == fail_at:
                raise fault
            f.write(chunk)
        if fail_at is not None and fail_at >= len(chunks):
            raise fault

    if fail_at is None:
        write_file(path, write)
        assert path.read_bytes() == b"".join(chunks)
    else:
        with pytest.raises(TinyMTError) as e:
            write_file(path, write)
        message = str(e.value)
        assert "\n" not in message and str(path) in message, message
        assert message.endswith("; the previous version is intact" if old is not None
                                else "; nothing was left there"), message
        assert ("no space left on device" in message) == (fault.args[:1] == (errno.ENOSPC,)), message
        assert (path.read_bytes() if path.exists() else None) == old
    assert [p.name for p in folder.iterdir()] == (["out.bin"] if path.exists() else [])


RUN_FILES = ["checkpoints/last.pt", "checkpoints/best.pt", "checkpoints/ckpt_{n}.pt",
             "checkpoints/../checkpoints/last.pt", "config.yaml", "tokenizer/spm.model",
             "tokenizer/{name}", ".tinymt-run", "metrics.json", "events.out.tfevents.{n}",
             "{name}", "heads/{name}.png", "checkpoints/avg.pt", "checkpoints/{name}.pt"]


@pytest.fixture(scope="module")
def a_run(tmp_path_factory):
    """A run's folder as training leaves it (config, tokenizer, checkpoints)."""
    run = tmp_path_factory.mktemp("a_run") / "run"
    for name in ("checkpoints/last.pt", "checkpoints/best.pt", "checkpoints/ckpt_20.pt",
                 "config.yaml", "tokenizer/spm.model", "metrics.json"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(b"state")
    return run


@given(st.sampled_from(RUN_FILES), st.integers(0, 10**6),
       st.text("abcxyz_-", min_size=1, max_size=12), st.booleans())
def test_a_run_s_own_state_is_never_an_output(a_run, tmp_path_factory, pattern, n, name,
                                              through_link):
    """Into a run (directly or through a link to it), an output is refused exactly when it
    is the run's own state (config, tokenizer, last / best / step checkpoints: a
    typo would lose the run); any other file passes. Nothing is written by asking."""
    run, rel = a_run, pattern.format(n=n, name=name)
    base = run
    if through_link:
        link = tmp_path_factory.mktemp("link") / "to-run"
        link.symlink_to(run)
        base = link
    before = sorted(p.relative_to(run).as_posix() for p in run.rglob("*"))
    why = output_problem(base / rel)
    state = rel.startswith(("checkpoints/last.pt", "checkpoints/best.pt", "checkpoints/ckpt_",
                            "checkpoints/../", "config.yaml", "tokenizer/"))
    assert (why is None) == (not state), (rel, why)
    if why is not None:
        assert "\n" not in why and str(run) in why, why
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == before


@given(st.integers(0, 5000), st.integers(0, 5000))
def test_a_read_is_capped(tmp_path_factory, size, cap):
    """read_bytes returns the file's bytes when they are at most the cap, else one line
    saying so: never more than cap + 1 bytes read."""
    path = tmp_path_factory.mktemp("read") / "f.bin"
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    if size <= cap:
        assert read_bytes(path, "the file", cap) == path.read_bytes()
    else:
        with pytest.raises(TinyMTError, match=f"the file {path} is larger than {cap:,} bytes"):
            read_bytes(path, "the file", cap)
