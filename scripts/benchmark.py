"""Benchmark tinymt against the same model built from ``torch.nn.Transformer``.

    python scripts/benchmark.py --quick    # < 2 min on a CPU: a smoke run of the benchmark
    python scripts/benchmark.py --device cpu --json docs/benchmarks.json \\
        --out docs/benchmarks.md                              # the published CPU report
    python scripts/benchmark.py --device cuda --merge docs/benchmarks.json \\
        --json docs/benchmarks-cuda.json --out docs/benchmarks.md   # add the GPU sections
    python scripts/benchmark.py --device cpu --sections serve --run outputs/<date>/<time> \\
        --merge docs/benchmarks.json --json docs/benchmarks.json \\
        --out docs/benchmarks.md             # scripts/serve.py under load, keeping the rest
    python scripts/benchmark.py --device cpu --sections viewer --merge docs/benchmarks.json \\
        --json docs/benchmarks.json --out docs/benchmarks.md   # the Attention tab's server

Without --out the report and its JSON go to outputs/benchmarks/<date>/<time>/; docs/ is
written only when named, from a clean working tree. `--help` lists the options; the
benchmark itself is ``tinymt.bench`` (see docs/benchmarks.md).
"""

import os
import sys

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # before datasets is imported

from tinymt.bench.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
