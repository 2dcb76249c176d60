"""Benchmark tinymt against the same model built from ``torch.nn.Transformer``.

    python scripts/benchmark.py --quick                    # a smoke run of the benchmark
    python scripts/benchmark.py --run outputs/<date>/<time> # decode a trained model
    python scripts/benchmark.py --help                      # every option

Without --out the report and its JSON go to outputs/benchmarks/<date>/<time>/. The
benchmark itself is ``tinymt.bench``; docs/benchmarks.md holds the figures, what they
mean, the targets and the commands that wrote them.
"""

import tinymt.cli  # noqa: F401  # isort: skip  (first: every way a script ends is one line)
import os
import sys

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # before datasets is imported

from tinymt.bench.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
