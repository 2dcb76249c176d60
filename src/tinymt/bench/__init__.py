"""The benchmark behind ``scripts/benchmark.py`` and ``docs/benchmarks.md``.

tinymt's ``Transformer`` against the same model built from ``torch.nn.Transformer``
(:mod:`tinymt.bench.peer`), in one process:

* :mod:`~tinymt.bench.main` -- arguments and the run (``main(argv)``),
* :mod:`~tinymt.bench.workload` -- the data, the model sizes, the pair (ours, peer) with the
  same weights,
* :mod:`~tinymt.bench.training` / :mod:`~tinymt.bench.decode_speed` -- the two measurements,
* :mod:`~tinymt.bench.serve_speed` -- ``scripts/serve.py`` under load (``--sections serve``):
  the servers, the load of :mod:`~tinymt.bench.serve_load`, the one-``translate.py``-process-
  per-request baseline of :mod:`~tinymt.bench.serve_baseline`,
* :mod:`~tinymt.bench.viewer_speed` -- the Attention tab's server (``--sections viewer``):
  TensorBoard on synthetic logdirs of many steps and probes, its latency, bytes and memory,
* :mod:`~tinymt.bench.measure` -- timing a measurement; :mod:`~tinymt.bench.memory` -- its
  peak memory; :mod:`~tinymt.bench.machine` -- what it ran on,
* :mod:`~tinymt.bench.targets` -- the targets and what is measured against them,
* :mod:`~tinymt.bench.report` -- the markdown report, rendered from the results (the JSON);
  its Attention tab section in :mod:`~tinymt.bench.viewer_report`, the text helpers they
  share in :mod:`~tinymt.bench.text`.
"""
