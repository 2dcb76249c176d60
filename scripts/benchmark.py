"""Benchmark tinymt against the same model built from ``torch.nn.Transformer``.

    python scripts/benchmark.py --quick                      # < 2 min on a CPU: structure check
    python scripts/benchmark.py --device cpu --json docs/benchmarks.json    # the CPU report
    python scripts/benchmark.py --device cuda --merge docs/benchmarks.json \\
        --json docs/benchmarks-cuda.json                      # add the GPU sections

`--help` lists the options; the benchmark itself is ``tinymt.bench`` (see docs/benchmarks.md).
"""

import os
import sys

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # before datasets is imported

from tinymt.bench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
