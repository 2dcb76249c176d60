"""The benchmark behind ``scripts/benchmark.py`` (``main``): docs/benchmarks.md."""
