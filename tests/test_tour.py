"""The guided tour (notebooks/tour.py) runs top to bottom on a briefly trained model.

The jupytext script is turned into a notebook in memory and executed by nbclient in a real
ipykernel (a subprocess) of this very Python, with ``TINYMT_TOUR_RUN`` naming the run; any
cell error fails the test, and so does the notebook's own hand-written == module assertion.
"""

from __future__ import annotations

import sys

import jupytext
import nbformat
import pytest
from ipykernel.kernelspec import install as install_kernelspec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from conftest import REPO_ROOT, compose_train

NOTEBOOK = REPO_ROOT / "notebooks" / "tour.py"
KERNEL = "tinymt-tour-test"


def _outputs_text(nb) -> str:
    """Everything the executed cells printed (streams and text results)."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _kernel_manager(tmp_path) -> KernelManager:
    """A kernel spec of *this* interpreter in tmp_path (argv = sys.executable -m
    ipykernel_launcher), so no user or system kernel named python3 can stand in for it."""
    install_kernelspec(kernel_name=KERNEL, prefix=str(tmp_path / "jupyter"))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "jupyter" / "share" / "jupyter" /
                                               "kernels")])
    assert specs.get_kernel_spec(KERNEL).argv[0] == sys.executable
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


@pytest.mark.slow
def test_tour_executes_on_a_trained_model(tmp_path, monkeypatch):
    from tinymt.trainer import train

    # a briefly trained tiny model with 4 heads (about 15 s on 2 CPU cores)
    train(compose_train(tmp_path, "model.n_heads=4", "trainer.max_steps=150",
                        "trainer.valid_every=150"))
    monkeypatch.setenv("TINYMT_TOUR_RUN", str(tmp_path / "run"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the kernel's torch: one core of two
    nb = jupytext.read(NOTEBOOK)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print('kernel python:', sys.executable)"))
    client = NotebookClient(nb, km=_kernel_manager(tmp_path), timeout=300,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    try:
        client.execute()  # raises CellExecutionError on the first failing cell
    finally:
        nbformat.write(nb, tmp_path / "tour.ipynb")  # executed copy, for a look after a failure
    text = _outputs_text(nb)
    source = NOTEBOOK.read_text(encoding="utf-8")  # the check itself is part of the tour
    assert "torch.testing.assert_close(out, module_out, rtol=1e-5, atol=1e-5)" in source
    assert f"kernel python: {sys.executable}" in text
    assert f"run: {tmp_path / 'run'}" in text  # the run TINYMT_TOUR_RUN named
    assert "hand-written == module" in text  # printed only after the assert_close calls
    assert "No trained run" not in text  # it did not train a model of its own
    images = [out for cell in nb.cells for out in cell.get("outputs", [])
              if "image/png" in out.get("data", {})]
    assert len(images) == 2 + 1 + 1  # encoder 2 layers, decoder self 1, cross 1


@pytest.mark.slow
def test_tour_names_a_bad_run_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYMT_TOUR_RUN", str(tmp_path / "no-such-run"))
    nb = jupytext.read(NOTEBOOK)
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells = nb.cells[: first_code + 1]  # the set-up cell picks the run
    client = NotebookClient(nb, km=_kernel_manager(tmp_path), timeout=120,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    with pytest.raises(CellExecutionError) as err:
        client.execute()
    assert err.value.ename == "TinyMTError"
    assert err.value.evalue == (f"TINYMT_TOUR_RUN={tmp_path / 'no-such-run'}: no "
                                "checkpoints/best.pt or last.pt there; name a run dir written "
                                "by scripts/train.py")
