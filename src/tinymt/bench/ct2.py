"""The decoding benchmark's CTranslate2 rows: the trained run (``--run``) exported twice
(float32 and int8 weights, :func:`tinymt.ct2.export_run`) into a temporary folder and
decoded by :func:`tinymt.ct2.translate_ids`, the engine of ``translate.py engine=ct2``.

They are measured in a child process (``python -m tinymt.bench.ct2 <in.json> <out.json>``),
after our rows: CTranslate2's and torch's thread pools in one process slow each other down
(measured: our greedy decoding 14% slower right after a CTranslate2 pass, CTranslate2 about
as much), and a deployed model runs without torch beside it. The child uses as many threads
as torch does in the parent, times each method like ours (``timed``: wall time and peak
memory beyond what was resident), alternating float32 and int8, and counts the exported
weights (``model.bin``) as the rows' static memory, as ours count the parameters.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from tinymt.bench.measure import log, timed
from tinymt.bench.memory import MIB, MemoryMeter
from tinymt.bench.targets import CT2_METHODS, SEARCHES
from tinymt.ct2 import export_run, load_export, require_ct2, translate_ids
from tinymt.errors import TinyMTError
from tinymt.rundir import load_run


def measure_ct2(job: dict) -> dict:
    """``{search: {method: entry}}`` of the CTranslate2 rows (entries as ours, with their
    last pass's ``outputs``), measured in a child process; ``{}`` without the extra.

    ``job``: ``run``, ``checkpoint``, ``device`` (cpu | cuda), ``threads``, ``src_ids``,
    ``max_len_a``, ``max_len_b``, ``batch_tokens``, ``repeats``, ``label``."""
    try:
        require_ct2()
    except TinyMTError as e:
        log(f"decode: no CTranslate2 rows ({e})")
        return {}
    with tempfile.TemporaryDirectory(prefix="tinymt-bench-ct2-") as tmp:
        job_file, out_file = Path(tmp) / "job.json", Path(tmp) / "rows.json"
        job_file.write_text(json.dumps(job))
        r = subprocess.run([sys.executable, "-m", "tinymt.bench.ct2", str(job_file),
                            str(out_file)], env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if r.returncode != 0 or not out_file.is_file():
            raise TinyMTError(f"the CTranslate2 measurement failed (exit {r.returncode}; its "
                              "messages are above)")
        return json.loads(out_file.read_text())


def _child(job: dict, tmp: Path) -> dict:
    """In the child process: export, load and time every CTranslate2 method."""
    torch.set_num_threads(job["threads"])
    run = load_run(job["run"], job["checkpoint"], "cpu")
    exports = {m: load_export(export_run(run, tmp / m, q), job["device"], job["threads"])
               for m, q in CT2_METHODS.items()}
    device, meter = torch.device(job["device"]), MemoryMeter(torch.device(job["device"]))
    src_ids, n = job["src_ids"], len(job["src_ids"])
    rows: dict = {}
    for search, beam in SEARCHES.items():
        times: dict[str, list[float]] = {m: [] for m in exports}
        mems: dict[str, list[float]] = {m: [] for m in exports}
        outputs = {}
        for r in range(job["repeats"]):
            for method, export in exports.items():
                def one_pass(export=export, beam=beam) -> list[list[int]]:
                    hyps = translate_ids(export, src_ids, beam=beam, max_len_a=job["max_len_a"],
                                         max_len_b=job["max_len_b"],
                                         batch_tokens=job["batch_tokens"])
                    return [h[0][0] for h in hyps]

                outputs[method], dt, mib = timed(one_pass, meter, device)
                times[method].append(dt)
                mems[method].append(mib)
                log(f"[decode {device.type} {job['label']}] {search} {method} pass {r + 1}/"
                    f"{job['repeats']}: {n / dt:,.1f} sentences/s ({dt:.2f}s)")
        rows[search] = {m: {"seconds": statistics.median(times[m]),
                            "sentences_per_s": n / statistics.median(times[m]),
                            "runs_seconds": times[m],
                            "output_tokens": sum(len(o) for o in outputs[m]),
                            "peak_mib": weights_mib(e) + statistics.median(mems[m]),
                            "outputs": outputs[m]}
                        for m, e in exports.items()}
    return rows


def weights_mib(export) -> float:
    """The exported weights' size (``model.bin``), the CTranslate2 rows' static memory."""
    return (export.path / "model.bin").stat().st_size / MIB


def main(argv: list[str]) -> int:
    job_file, out_file = map(Path, argv)
    with tempfile.TemporaryDirectory(prefix="tinymt-ct2-export-") as tmp:
        rows = _child(json.loads(job_file.read_text()), Path(tmp))
    out_file.write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
