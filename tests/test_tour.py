"""The briefly trained model (the suite's ``trained_run``, trained once: make test runs a
file's tests on one worker) and the guided tour that runs on it.

The whole pipeline learns, not just runs: the tiny model, trained briefly on the built-in
corpus, translates held-out sentences exactly right.

The sentences come from the run's test split, which the corpus keeps disjoint from the
training split by source and by target (checked here again); they go through the real
``translate`` (normalisation, tokenizer, beam search, detokenisation), and the answer must
equal the grammar's own English sentence, character for character.

The guided tour (notebooks/tour.py) runs top to bottom on the same model.

The jupytext script is turned into a notebook in memory and executed by nbclient in a real
ipykernel (a subprocess) of this very Python, with ``TINYMT_TOUR_RUN`` naming the run; any
cell error fails the test, and so does the notebook's own hand-written == module assertion.
"""

from __future__ import annotations

import html
import io
import json
import re
import sys

import jupytext
import nbformat
import pytest
from ipykernel.kernelspec import install as install_kernelspec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from conftest import REPO_ROOT, TRAINED_STEPS, compose_translate
from tinymt import KINDS
from tinymt.corpus.dictionary import HELD_OUT, WORDS
from tinymt.data import prepare
from tinymt.errors import TinyMTError
from tinymt.translate import translate

NOTEBOOK = REPO_ROOT / "notebooks" / "tour.py"
KERNEL = "tinymt-tour-test"


def _outputs_text(nb) -> str:
    """Everything the executed cells printed (streams and text results). A stream's
    pieces are joined as written: the kernel may cut one print into several outputs."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", "") and
                         "\n" + out["data"]["text/plain"] + "\n")
    return "".join(parts)


def _kernel_manager(tmp_path) -> KernelManager:
    """A kernel spec of *this* interpreter in tmp_path (argv = sys.executable -m
    ipykernel_launcher), so no user or system kernel named python3 can stand in for it."""
    install_kernelspec(kernel_name=KERNEL, prefix=str(tmp_path / "jupyter"))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "jupyter" / "share" / "jupyter" /
                                               "kernels")])
    assert specs.get_kernel_spec(KERNEL).argv[0] == sys.executable
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


@pytest.mark.slow
def test_tour_executes_on_a_trained_model(trained_run, tmp_path, monkeypatch):
    run_dir, cfg, _ = trained_run
    m = cfg.model
    monkeypatch.setenv("TINYMT_TOUR_RUN", str(run_dir))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel's torch: one core of two
    nb = jupytext.read(NOTEBOOK)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('kernel python:', sys.executable)"))
    client = NotebookClient(nb, km=_kernel_manager(tmp_path), timeout=300,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}},
                            shutdown_kernel="immediate")
    try:
        client.execute(cleanup_kc=True)  # CellExecutionError on the first failing cell
    finally:
        nbformat.write(nb, tmp_path / "tour.ipynb")  # executed copy, for a look after a failure
    text = _outputs_text(nb)
    assert f"kernel python: {sys.executable}" in text
    assert f"run: {run_dir}" in text  # the run TINYMT_TOUR_RUN named
    assert "No trained run" not in text  # it did not train a model of its own
    # the hand-written attention's check, printed only after its assert_close calls: the
    # shapes of this model's layer 0 and a difference that is rounding only
    check = re.search(r"hand-written == module: output \((\d+), (\d+), (\d+)\), weights "
                      r"\((\d+), (\d+), (\d+), (\d+)\), max \|difference\| (\S+)", text)
    assert check, text[-3000:]
    B, S, d, B2, h, S2, S3 = map(int, check.groups()[:7])
    assert (d, h) == (m.d_model, m.n_heads) and B2 == B and S2 == S3 == S
    assert float(check.group(8)) <= 1e-5
    images = [out for cell in nb.cells for out in cell.get("outputs", [])
              if "image/png" in out.get("data", {})]
    # one figure per layer: encoder self-attention, decoder self-attention, cross-attention
    assert len(images) == m.n_encoder_layers + 2 * m.n_decoder_layers
    # the interactive view: one self-contained page in an iframe, its data the same maps
    pages = [out["data"]["text/html"] for cell in nb.cells for out in cell.get("outputs", [])
             if "text/html" in out.get("data", {}) and "<iframe srcdoc=" in
             "".join(out["data"]["text/html"])]
    assert len(pages) == 1
    page = html.unescape("".join(pages[0]))
    assert "mountView(" in page and "data:font/otf;base64," in page
    data = json.loads(re.search(r'id="tinymt-data">(.*?)</script>', page, re.S).group(1))
    doc = next(iter(data["docs"].values()))
    assert doc["sentence"] == "我请李雷帮我订了去北京的机票。"
    assert [len(doc["kinds"][k]["weights"]) for k in KINDS] == [  # layers
        m.n_encoder_layers, m.n_decoder_layers, m.n_decoder_layers]


def test_tour_names_a_bad_run_in_one_line(tmp_path, monkeypatch):
    """The set-up cell (plain Python: run here, the kernel is the test above's) stops at a
    bad TINYMT_TOUR_RUN with one line naming it."""
    monkeypatch.setenv("TINYMT_TOUR_RUN", str(tmp_path / "no-such-run"))
    monkeypatch.chdir(NOTEBOOK.parent)  # (where Jupyter starts it; the cell moves to the root)
    setup = next(c for c in jupytext.read(NOTEBOOK).cells if c.cell_type == "code")
    with pytest.raises(TinyMTError) as err:
        exec(compile(setup.source, str(NOTEBOOK), "exec"), {"__name__": "tour"})
    assert str(err.value) == (f"TINYMT_TOUR_RUN={tmp_path / 'no-such-run'}: no "
                              "checkpoints/best.pt or last.pt there; name a run dir written by "
                              "scripts/train.py")


# ----------------------------------------------------------------------------- the model
SHORT = 7  # English words, final punctuation included


@pytest.mark.slow
def test_trained_model_translates_held_out_sentences(trained_run):
    run_dir, cfg, metrics = trained_run
    tcfg = compose_translate(f"run={run_dir}", "decode.beam=5")

    # the splits the run trained and was tested on, from its data cache
    splits = prepare(cfg.data, log=lambda _: None).splits
    train, test = splits["train"], splits["test"]
    seen = set(train["src"]) | set(train["tgt"])
    rows = list(zip(test["src"], test["tgt"], test["tgt_words"], strict=True))
    assert not [zh for zh, en, _ in rows if zh in seen or en in seen]  # neither side trained on
    short = [(zh, en) for zh, en, words in rows if len(words) <= SHORT]
    assert len(short) >= 100

    out = io.StringIO()
    hyps = translate(tcfg, [zh for zh, _ in short], stdout=out)["translations"]
    assert out.getvalue().splitlines() == hyps
    wrong = [(zh, en, h) for (zh, en), h in zip(short, hyps, strict=True) if h != en]
    print(f"{len(short) - len(wrong)} of {len(short)} short held-out sentences exactly right; "
          f"test BLEU {metrics['test_bleu']:.1f} after {TRAINED_STEPS} steps")
    # measured: 70 of 124 right (56 %; seeds 2 and 3: 56 %, 56 %); 30 % leaves room for
    # other CPUs' rounding (an untrained model gets none right, nor does one whose causal
    # mask lets a word see the next)
    assert len(wrong) <= 0.7 * len(short), (
        f"{len(wrong)} of {len(short)} short held-out sentences wrong, e.g. {wrong[:5]}")
    # and the longer ones are partly right too: corpus BLEU of the test split (greedy;
    # measured 62.3; seeds 2 and 3: 66.6, 59.9)
    assert metrics["test_bleu"] >= 45, metrics


def test_the_trainer_s_words_alone_figure_is_what_translate_py_gives(trained_run):
    """``metrics.json``'s ``held_out_words``: the share of the dictionary's held-out words
    (never a training pair) that ``translate.py``, at the trainer's test beam, turns into
    the lexicon's form: another path to the same figure (the script's reading of the text,
    its search, the text it prints)."""
    run_dir, cfg, metrics = trained_run
    words = sorted(HELD_OUT)
    tcfg = compose_translate(f"run={run_dir}", f"decode.beam={cfg.trainer.test_beam}")
    hyps = translate(tcfg, words, stdout=io.StringIO(), warn=lambda _: None)["translations"]
    right = sum(h == " ".join(WORDS[w]) for w, h in zip(words, hyps, strict=True))
    print(f"{right} of {len(words)} held-out words right after {TRAINED_STEPS} steps")
    assert right > 0 and metrics["held_out_words"] == right / len(words)
