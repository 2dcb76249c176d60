"""The decoding benchmark's CTranslate2 rows: the trained run (``--run``) exported twice
(float32 and int8 weights, :func:`tinymt.ct2.export_run`) into a temporary folder and
decoded by :func:`tinymt.ct2.translate_export_ids`, the engine of ``translate.py engine=ct2``.

They run in a child process (``python -m tinymt.bench.ct2_speed``), pass by pass on the parent's
request, so that they alternate with ours as every method does: CTranslate2's and torch's
thread pools in one process slow each other down (measured: our greedy decoding 14% slower
right after a CTranslate2 pass, CTranslate2 about as much), and a deployed model runs without
torch beside it. The child uses as many threads as torch does in the parent, times a pass as
ours are timed (``timed``: wall time and peak memory beyond what was resident, measured in
the child) and counts the exported weights (``model.bin``) as the rows' static memory, as
ours count the parameters. Protocol: one JSON line each way per request on stdin/stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tinymt.bench.measure import log, timed
from tinymt.bench.memory import MIB, MemoryMeter
from tinymt.bench.targets import CT2_METHODS, SEARCHES
from tinymt.ct2 import export_run, load_export, require_ct2, translate_export_ids
from tinymt.errors import TinyMTError
from tinymt.rundir import load_run

Measured = tuple[list[list[int]], float, float]  # a pass's outputs, seconds, MiB
REPLY = "tinymt-bench-ct2 "  # marks the child's protocol lines on its stdout


class Ct2Rows:
    """The CTranslate2 methods of the trained run, measured in a child process."""

    def __init__(self, job: dict):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tinymt.bench.ct2_speed"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.static_mib: dict[str, float] = self._ask(job)["static_mib"]

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        raise TinyMTError(f"the CTranslate2 measurement failed (exit {self.proc.wait()}; "
                          "its messages are above)")

    def passes(self, search: str) -> dict[str, tuple[Callable[[], Measured], float]]:
        """``{method: (measure one pass, static MiB)}``, as ``_our_passes`` gives ours."""
        def measure(method: str) -> Measured:
            r = self._ask({"search": search, "method": method})
            return r["outputs"], r["seconds"], r["mib"]

        return {m: (lambda m=m: measure(m), self.static_mib[m]) for m in CT2_METHODS}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


@contextlib.contextmanager
def ct2_rows(job: dict | None) -> Iterator[Ct2Rows | None]:
    """The child for ``job`` (``run``, ``checkpoint``, ``device``, ``threads``, ``src_ids``,
    ``max_len_a``, ``max_len_b``, ``batch_tokens``); None without a job or the extra."""
    if job is None:
        yield None
        return
    try:
        require_ct2()
    except TinyMTError as e:
        log(f"decode: no CTranslate2 rows ({e})")
        yield None
        return
    rows = Ct2Rows(job)
    try:
        yield rows
    finally:
        rows.close()


def _reply(message: dict) -> None:
    sys.stdout.write(REPLY + json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> int:
    """The child: export and load, then measure one pass per request until stdin ends."""
    job = json.loads(sys.stdin.readline())
    torch.set_num_threads(job["threads"])
    device = torch.device(job["device"])
    meter = MemoryMeter(device)
    run = load_run(job["run"], job["checkpoint"], "cpu")
    with tempfile.TemporaryDirectory(prefix="tinymt-bench-ct2-") as tmp:
        exports = {m: load_export(export_run(run, Path(tmp) / m, q), device.type,
                                  job["threads"]) for m, q in CT2_METHODS.items()}
        _reply({"static_mib": {m: (e.path / "model.bin").stat().st_size / MIB
                               for m, e in exports.items()}})
        for line in sys.stdin:
            request = json.loads(line)
            export, beam = exports[request["method"]], SEARCHES[request["search"]]

            def one_pass(export=export, beam=beam) -> list[list[int]]:
                hyps = translate_export_ids(export, job["src_ids"], beam=beam,
                                            max_len_a=job["max_len_a"],
                                            max_len_b=job["max_len_b"],
                                            batch_tokens=job["batch_tokens"])
                return [h[0][0] for h in hyps]

            outputs, seconds, mib = timed(one_pass, meter, device)
            _reply({"outputs": outputs, "seconds": seconds, "mib": mib})
    return 0


if __name__ == "__main__":
    sys.exit(main())
