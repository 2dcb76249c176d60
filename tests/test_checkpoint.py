"""Checkpoints: atomic writes survive SIGKILL mid-save; damaged files fail with one line."""

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import forked
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from conftest import copy_run, run_script_in_process
from tinymt.checkpoint import average_checkpoints, load_checkpoint, save_checkpoint
from tinymt.config import ModelConfig
from tinymt.errors import TinyMTError
from tinymt.files import TEMP_PREFIX
from tinymt.model import Transformer
from tinymt.rundir import step_checkpoints

# a real (tiny) model's config and weights: load_checkpoint checks one against the other
MC = dataclasses.asdict(ModelConfig(d_model=8, n_heads=2, n_encoder_layers=1,
                                    n_decoder_layers=1, d_ff=16, max_positions=16))


def _state(value: float, step: int) -> dict:
    model = Transformer(OmegaConf.create(MC), 8, 8, shared_vocab=True).state_dict()
    return {"model": {**model, "w": torch.full((4, 4), value), "n": torch.tensor(step)},
            "model_config": dict(MC), "step": step,
            "vocab": {"src_size": 8, "tgt_size": 8, "shared": True}}


def test_roundtrip(tmp_path):
    save_checkpoint(_state(1.5, 7), tmp_path / "last.pt")
    s = load_checkpoint(tmp_path / "last.pt")
    assert s["step"] == 7 and torch.equal(s["model"]["w"], torch.full((4, 4), 1.5))
    assert not list(tmp_path.glob("*.tmp-*"))


def test_a_tensor_must_own_the_bytes_its_shape_needs(tmp_path):
    """A few bytes cannot describe a big model: weights saved as expanded views of one row
    (stride 0), or as views all into one shared storage, are refused in one line before
    any model is built; tied weights (one view under three names) are not."""
    d = MC["d_model"]
    state = _state(1.0, 1)
    state["model_config"] = {**MC, "d_ff": 4096}
    for name in list(state["model"]):
        if name.endswith("ff.linear1.weight"):  # (d_ff, d): one row expanded
            state["model"][name] = torch.ones(1, d).expand(4096, d)
        elif name.endswith("ff.linear1.bias"):
            state["model"][name] = torch.zeros(1).expand(4096)
        elif name.endswith("ff.linear2.weight"):
            state["model"][name] = torch.ones(d, 1).expand(d, 4096)
    save_checkpoint(state, tmp_path / "x.pt")
    assert (tmp_path / "x.pt").stat().st_size < 50_000
    with pytest.raises(TinyMTError, match=r"its tensors describe [\d,]+ bytes, their storages "
                       r"hold 4,432") as e:
        load_checkpoint(tmp_path / "x.pt")
    assert "\n" not in str(e.value) and str(tmp_path / "x.pt") in str(e.value)
    # 64 tensors of 64 KiB, each another view of one 64 KiB storage: 4 MiB described
    shared = torch.zeros((1 << 14) + 64)
    state = _state(1.0, 1)
    state["model"].update({f"w{i}": shared[i:i + (1 << 14)] for i in range(64)})
    save_checkpoint(state, tmp_path / "shared.pt")
    with pytest.raises(TinyMTError, match="their storages hold") as e:
        load_checkpoint(tmp_path / "shared.pt")
    tied = _state(1.0, 1)
    assert tied["model"]["src_embed.weight"].data_ptr() == \
        tied["model"]["output_proj.weight"].data_ptr()  # tied: one view, counted once
    save_checkpoint(tied, tmp_path / "tied.pt")
    assert load_checkpoint(tmp_path / "tied.pt")["step"] == 1


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 63), st.integers(2, 64),
                          st.integers(0, 3)), min_size=1, max_size=6))
def test_weights_may_describe_no_more_bytes_than_their_storages_hold(tmp_path_factory, sizes,
                                                                      views):
    """Property: extra weights drawn as views of one to three storages (any offset, length,
    stride, or one value expanded: stride 0) load exactly when the distinct views describe
    no more bytes than the storages they view hold, counted here from how they were made;
    else one line naming the file."""
    storages = [torch.arange(n, dtype=torch.float32) for n in sizes]
    state, described, used = _state(1.0, 1), {}, set()
    for i, (k, offset, length, stride) in enumerate(views):
        k = k % len(storages)
        base = storages[k][offset % sizes[k]:]
        w = base[:1].expand(length) if stride == 0 else base[::stride][:length]
        state["model"][f"extra{i}"] = w
        described[(k, offset % sizes[k], w.numel(), stride)] = 4 * w.numel()
        used.add(k)
    path = tmp_path_factory.mktemp("views") / "x.pt"
    save_checkpoint(state, path)
    if sum(described.values()) > sum(4 * sizes[k] for k in used):
        with pytest.raises(TinyMTError, match=rf"^checkpoint {path} is not one tinymt wrote: "
                                              "model: its tensors describe"):
            load_checkpoint(path)
    else:
        assert torch.equal(load_checkpoint(path)["model"][f"extra{len(views) - 1}"], w)


@pytest.mark.parametrize("labels", [["cross"], {"cross": "aligned"}, {"cross": [["a", 1]]},
                                    {"cross": [[["a"]]]}])
def test_head_labels_are_lists_of_strings_or_refused(tmp_path, labels):
    """The labels a checkpoint carries (the HTML file shows them as text): {kind: [[str per
    head] per layer]}, read back as written; any other shape is refused in one line."""
    good = {"cross": [["aligned 0.73, </s> 0.17 · …", "</s>"]], "encoder_self": []}
    save_checkpoint({**_state(1.0, 1), "labels": good}, tmp_path / "good.pt")
    assert load_checkpoint(tmp_path / "good.pt")["labels"] == good
    save_checkpoint({**_state(1.0, 1), "labels": labels}, tmp_path / "bad.pt")
    with pytest.raises(TinyMTError, match=rf"^checkpoint {tmp_path / 'bad.pt'} is not one tinymt "
                                          r"wrote: labels: expected \{kind"):
        load_checkpoint(tmp_path / "bad.pt")


def test_missing_checkpoint_is_one_line_error(tmp_path):
    with pytest.raises(TinyMTError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")


def test_truncated_checkpoint_is_never_loaded(tmp_path):
    save_checkpoint(_state(2.0, 3), tmp_path / "good.pt")
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "last.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(TinyMTError, match="damaged or truncated"):
        load_checkpoint(tmp_path / "last.pt")


def test_not_a_checkpoint(tmp_path):
    torch.save({"something": 1}, tmp_path / "x.pt")
    with pytest.raises(TinyMTError, match="not a tinymt checkpoint"):
        load_checkpoint(tmp_path / "x.pt")


@pytest.mark.slow
def test_sigkill_during_save_leaves_previous_checkpoint(tmp_path):
    """A real process is killed while it writes the new checkpoint's bytes."""
    save_checkpoint(_state(0.0, 1), tmp_path / "last.pt")
    script = textwrap.dedent(f"""
        import sys, time, torch
        from tinymt import checkpoint
        path = {str(tmp_path / 'last.pt')!r}
        real_save = torch.save
        def slow_save(obj, f):
            real_save(obj, f)
            f.flush()
            print("writing", flush=True)   # bytes are on disk, rename not done yet
            time.sleep(60)
        checkpoint.torch.save = slow_save
        checkpoint.save_checkpoint({{"model": {{"w": torch.ones(3)}}, "step": 2}}, path)
    """)
    proc = forked.popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    temps = [p.name for p in tmp_path.glob(f"{TEMP_PREFIX}*")]
    assert temps, "the kill should have hit the temp file"
    s = load_checkpoint(tmp_path / "last.pt")
    assert s["step"] == 1 and torch.equal(s["model"]["w"], torch.zeros(4, 4))
    save_checkpoint(_state(3.0, 3), tmp_path / "last.pt")  # the temp left is never read
    assert load_checkpoint(tmp_path / "last.pt")["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.pt", *temps])


def test_average_checkpoints(tmp_path):
    paths = []
    for i, v in enumerate([1.0, 2.0, 6.0]):
        p = tmp_path / f"ckpt_{i}.pt"
        save_checkpoint({**_state(v, i), "optimizer": {"x": 1}}, p)
        paths.append(p)
    avg = average_checkpoints(paths)
    assert torch.allclose(avg["model"]["w"], torch.full((4, 4), 3.0))
    assert avg["model"]["n"].item() == 2  # integer buffers come from the last
    assert "optimizer" not in avg


def test_average_is_the_mean_of_every_weight_in_its_own_dtype(tmp_path):
    """Each floating tensor the plain mean of the checkpoints' (computed in float64, stored
    in the tensor's dtype); integer buffers, the step and the trainer state the last one's;
    the optimizer's state and the rest of the training state dropped."""
    states = []
    for i, v in enumerate([1.0, 2.0, 4.5]):
        s = _state(v, 10 * (i + 1))
        s["model"]["h"] = torch.full((3,), v / 3, dtype=torch.float16)
        s["model"]["n"] = torch.tensor([i, 7 * i])
        s.update(optimizer={"x": 1}, scheduler={"y": 2}, trainer_state={"epoch": i})
        states.append(s)
        save_checkpoint(s, tmp_path / f"ckpt_{i}.pt")
    paths = [tmp_path / f"ckpt_{i}.pt" for i in range(3)]
    avg = average_checkpoints(paths)
    assert torch.equal(avg["model"]["w"], torch.full((4, 4), 2.5))  # (1 + 2 + 4.5) / 3
    assert avg["model"]["h"].dtype == torch.float16
    h = sum(s["model"]["h"][0].item() for s in states) / 3  # of the stored half values
    assert torch.equal(avg["model"]["h"], torch.full((3,), h).half())
    assert avg["model"]["n"].tolist() == [2, 14]  # the last one's
    for k, w in states[0]["model"].items():  # every weight, by hand
        if w.is_floating_point():
            mean = sum(s["model"][k].double() for s in states) / 3
            torch.testing.assert_close(avg["model"][k], mean.to(w.dtype), msg=k)
    assert avg["step"] == 30 and avg["trainer_state"] == {"epoch": 2}
    assert "optimizer" not in avg and "scheduler" not in avg
    assert avg["averaged_from"] == [str(p) for p in paths]
    assert avg["model_config"] == MC and avg["vocab"] == states[-1]["vocab"]
    one = average_checkpoints(paths[1:2])  # one checkpoint: itself
    assert torch.equal(one["model"]["w"], torch.full((4, 4), 2.0))


def test_average_names_the_checkpoint_that_differs_from_the_last(tmp_path):
    for name, rows in (("a", 4), ("b", 5), ("c", 4)):  # only b differs from the last
        s = _state(1.0, 1)
        s["model"]["w"] = torch.ones(rows, 4)
        save_checkpoint(s, tmp_path / f"{name}.pt")
    with pytest.raises(TinyMTError, match=rf"^{tmp_path / 'b.pt'} is from a different model "
                                          rf"than {tmp_path / 'c.pt'}: its tensor w is \(5, 4\) "
                                          r"torch.float32 vs \(4, 4\) torch.float32; cannot average"):
        average_checkpoints([tmp_path / f"{n}.pt" for n in "abc"])


def test_average_refuses_other_tensors(tmp_path):
    save_checkpoint(_state(1.0, 1), tmp_path / "a.pt")
    other = _state(1.0, 2)
    other["model"]["extra"] = torch.ones(2)
    save_checkpoint(other, tmp_path / "b.pt")
    with pytest.raises(TinyMTError, match=r"different model.*other tensors \(-extra\)"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])


def test_average_takes_only_one_run_s_checkpoints(tiny_run, tmp_path):
    """Each checkpoint carries its run's id (the trainer's: one for every checkpoint of a
    run); averaging refuses a checkpoint of another run than the last (or than ``run``,
    the run's last.pt), naming it; one without an id is taken."""
    ckpts = tiny_run / "checkpoints"
    ids = {load_checkpoint(p)["trainer_state"]["run"] for p in sorted(ckpts.glob("*.pt"))}
    assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", ids.pop())
    for name, run in (("a", "A"), ("b", "B"), ("c", "A"), ("d", None), ("e", "B")):
        save_checkpoint({**_state(1.0, 1), "trainer_state": {"run": run}}, tmp_path / f"{name}.pt")
    path = {n: tmp_path / f"{n}.pt" for n in "abcde"}
    with pytest.raises(TinyMTError, match=rf"^{path['b']} is a checkpoint of another run than "
                                          rf"{path['c']} \(its run id\): cannot average"):
        average_checkpoints([path[n] for n in "abc"])
    with pytest.raises(TinyMTError, match=rf"^{path['a']} is a checkpoint of another run than "
                                          rf"{path['e']}"):
        average_checkpoints([path["a"], path["c"]], path["e"])
    assert average_checkpoints([path[n] for n in "acd"], path["a"])["trainer_state"] == {"run": None}


def test_step_checkpoints_ignore_other_files(tmp_path):
    """A user's ckpt_best.pt, temp files and folders are not step checkpoints."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for name in ("ckpt_100.pt", "ckpt_20.pt", "ckpt_best.pt", "ckpt_3.pt.tmp-1", "ckpt_x7.pt",
                 "best.pt"):
        (ckpts / name).write_bytes(b"")
    assert [p.name for p in step_checkpoints(tmp_path)] == ["ckpt_20.pt", "ckpt_100.pt"]


# ----------------------------------------------------------------------------- averaging a run
def _forge_step(run, edit) -> Path:
    """``ckpt_40.pt`` of ``run`` replaced by ``edit(its state)``, published as tinymt does."""
    path = run / "checkpoints" / "ckpt_40.pt"
    state = load_checkpoint(path)
    edit(state)
    save_checkpoint(state, path)
    return path


def _average_refused(run, capsys) -> str:
    """scripts/average_checkpoints.py on ``run``: its one error line; nothing was written."""
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    status, err = run_script_in_process("average_checkpoints", [f"run={run}", "last=2"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # no avg.pt
    return lines[0]


def test_average_refuses_another_vocabulary_size(tiny_run, tmp_path, capsys):
    """A step checkpoint of another vocabulary size (its embeddings and vocab say so) ended
    in a traceback from adding tensors of different shapes."""
    run = copy_run(tiny_run, tmp_path / "run")
    size = load_checkpoint(run / "checkpoints" / "ckpt_20.pt")["vocab"]["src_size"]

    def grow(state):
        for k, v in state["model"].items():
            if v.shape[:1] == (size,):
                state["model"][k] = torch.cat([v, torch.zeros(8, *v.shape[1:])])
        state["vocab"].update(src_size=size + 8, tgt_size=size + 8)

    forged = _forge_step(run, grow)
    line = _average_refused(run, capsys)
    assert str(forged) in line and "embed.weight is (" in line and f"vs ({size + 8}, " in line


def test_average_never_writes_into_another_run(tiny_run, tmp_path, capsys):
    """``run=A output=<B>/checkpoints/avg.pt``: B's translate.py would refuse that avg.pt
    (another run's tokenizer) after it replaced B's own; refused in one line, B unchanged."""
    a, b = copy_run(tiny_run, tmp_path / "a"), copy_run(tiny_run, tmp_path / "b")
    before = {p: p.read_bytes() for p in sorted(b.rglob("*")) if p.is_file()}
    out = b / "checkpoints" / "avg.pt"
    status, err = run_script_in_process("average_checkpoints",
                                        [f"run={a}", "last=2", f"output={out}"], capsys)
    assert status == 2 and err.strip() == (
        f"error: output={out} is in another run's checkpoints/: a run's average goes in its "
        f"own ({a / 'checkpoints'}) or outside any run"), err
    assert {p: p.read_bytes() for p in sorted(b.rglob("*")) if p.is_file()} == before
    status, _ = run_script_in_process("average_checkpoints", [f"run={a}", "last=2"], capsys)
    assert status == 0 and (a / "checkpoints" / "avg.pt").is_file()  # its own: as before
