"""The Markdown report, rendered from the results alone (the dict ``--json`` writes), so
that merged sections of other runs and devices render the same way. Written into a page
between :data:`BEGIN` and :data:`END` when it has them (``docs/benchmarks.md``: the prose
and targets around the figures stay), or as a page of its own."""

from __future__ import annotations

BEGIN = "<!-- benchmark report: written by scripts/benchmark.py from here -->"
END = "<!-- benchmark report: to here -->"
METHODS = {"ours_cache": "ours, KV cache", "ours_nocache": "ours, recompute prefix",
           "peer": "peer (nn.Transformer), recompute prefix",
           "micro_batching": "micro-batching", "one_at_a_time": "one at a time"}


def num(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head),
            *("| " + " | ".join(map(str, r)) + " |" for r in rows), ""]


def measured_by(section: dict) -> str:
    m, data, quick = section["machine"], section.get("data"), section["settings"].get("quick")
    line = (f"Measured by `{m['command']}` on {m['date']} at git {m['git']}"
            + (" with uncommitted changes" if m.get("uncommitted_changes") else "")
            + f"; torch {m['torch']}, {m['cpu']}, {m['cpu_cores']} cores, "
            f"{m['torch_threads']} torch threads" + (f", {m['gpu']}" if m.get("gpu") else ""))
    if data:
        line += (f"; data: {data['name']}, {data['train_pairs']:,} train / "
                 f"{data['test_pairs']:,} test pairs")
    return line + (". **`--quick`: a smoke run, its numbers mean nothing.**" if quick else ".")


def render_training(tr: dict) -> list[str]:
    s = tr["settings"]
    L = ["### Training throughput", "", measured_by(tr), "",
         (f"{s['precision']}; {s['timed_batches']} batches of a size's token budget (padding "
          f"counted) after {s['warmup']} warm-up steps; median of {s['repeats']} rounds; "
          f"matmul peak {s['matmul_peak_flops'] / 1e9:,.0f} GFLOP/s (median of "
          f"{len(s['matmul_peak_runs'])} {s['matmul_peak_size']}² matmuls)."), ""]
    rows = []
    for size, r in tr["sizes"].items():
        o, pl, p = r["ours"], r["plain"], r["peer"]
        # a size's budget and timed target tokens (in settings: one for all, in older results)
        cap, n = (r.get(k, s.get(k)) for k in ("max_tokens", "timed_target_tokens_per_run"))
        rows.append([size, f"{r['params'] / 1e6:.2f} M", f"≤ {cap:,} ({n:,} target)",
                     *(num(e["tokens_per_s"]) for e in (o, pl, p)),
                     f"{o['tokens_per_s'] / pl['tokens_per_s']:.2f}×",
                     f"{o['tokens_per_s'] / p['tokens_per_s']:.2f}×",
                     *(f"{e['share_of_peak']:.0%}" for e in (o, pl, p)),
                     *(num(e["peak_mib"]) for e in (o, pl, p))])
    return L + table(["size", "params", "tokens a batch (timed)", "ours tok/s", "plain tok/s",
                      "peer tok/s", "ours/plain", "ours/peer", "ours % of peak", "plain %",
                      "peer %", "ours peak MiB", "plain MiB", "peer MiB"], rows)


def render_decoding(de: dict) -> list[str]:
    s = de["settings"]
    L = ["### Decoding throughput", "", measured_by(de), "",
         (f"{s['sentences']:,} test sentences, batches of ≤ {s['batch_tokens']:,} source "
          f"tokens, median of {s['repeats']} passes; {s['length_rule']}."), ""]
    rows, ratios = [], []
    for label, row in de["sizes"].items():
        for search in ("greedy", "beam5"):
            peer = row[search].get("peer", {}).get("sentences_per_s")  # greedy only
            for method in (m for m in METHODS if m in row[search]):
                e = row[search][method]
                rows.append([label, search, METHODS[method], num(e["sentences_per_s"], 1),
                             f"{e['sentences_per_s'] / peer:.2f}×" if peer else "—",
                             f"{e['seconds']:.2f}",
                             num(e["output_tokens"]), num(e["peak_mib"]),
                             num(e.get("bleu"), 2), num(e.get("identical_to_ours"))])
        g, b = row["greedy"]["ours_cache"], row["beam5"]["ours_cache"]
        ratios.append(f"{label}: beam 5 takes {b['seconds'] / g['seconds']:.2f}× greedy's time.")
    return L + table(["model", "search", "method", "sentences/s", "× peer", "seconds",
                      "output tokens", "peak MiB", "BLEU", "= ours"], rows) + ratios + [""]


def render_serving(sv: dict) -> list[str]:
    s = sv["settings"]
    L = ["### Serving", "", measured_by(sv), "",
         (f"Run `{s['run']}` (`{s['checkpoint']}`, {s['pair']['source']}→{s['pair']['target']}, "
          f"beam {s['beam']}), {s['threads']} threads a server, {s['sentences']:,} test "
          "sentences; requests per level: " + ", ".join(
              f"{n} at {c} client{'s' * (c != '1')}" for c, n in s["requests"].items()) + "."), ""]
    rows, by = [], {}
    for r in sv["rows"]:
        by[r["engine"], r["method"], r["clients"]] = r["sentences_per_s"]
        rows.append([r["engine"], METHODS[r["method"]], str(r["clients"]),
                     num(r["sentences_per_s"], 1), num(r["p50_ms"], 1), num(r["p99_ms"], 1),
                     str(r["errors"]),
                     num(r.get("mean_batch"), 1), num(r.get("server_rss_mib"))])
    L += table(["engine", "method", "clients", "sentences/s", "p50 ms", "p99 ms", "errors",
                "mean batch", "server RSS MiB"], rows)
    for (engine, method, clients), sps in by.items():
        alone = by.get((engine, "one_at_a_time", clients))
        if method == "micro_batching" and alone:
            L.append(f"- {engine}, {clients} client{'s' * (clients != 1)}: micro-batching "
                     f"{sps / alone:.2f}× one at a time.")
    L += [f"- {engine}: not measured ({why})." for engine, why in sv.get("skipped", {}).items()]
    if h := sv.get("hostile"):
        ms = sorted(p for p in h["probes_ms"] if p is not None)
        L += ["", f"Hostile load ({h['seconds']:g} s: 40 clients that POST the largest "
              "/attention and never read, 200 slowloris, 8 sending costly or malformed text; a "
              "/translate probe a second), then SIGTERM:", ""] + table(
            ["probes answered", "median ms", "slowest ms", "over 1 s (/health)",
             "texts answered (by status)", "server MiB before / peak", "exit after SIGTERM",
             "stderr lines"],
            [[f"{len(ms)} of {len(h['probes_ms'])}", num(ms[len(ms) // 2] if ms else None),
              num(ms[-1] if ms else None),
              f"{sum(p > 1000 for p in ms)} ({sum(not p or p > 1000 for p in h.get('health_ms', []))})",
              ", ".join(f"{n:,} × {k}" for k, n in sorted(h.get("texts", {}).items())),
              f"{num(h['rss_start_mib'])} / {num(h['rss_peak_mib'])}",
              f"{h['exit']} in {h['stop_s']:.1f} s", f"{h['stderr_lines']}"
              + (" (a traceback)" if h["traceback"] else "")]])
    return L + [""]


def render(results: dict) -> str:
    """The report: per device, each section measured (or how to measure it)."""
    L = []
    for dev, title in (("cpu", "CPU"), ("cuda", "CUDA")):
        res = results["devices"].get(dev) or {}
        L += [f"## {title}", ""]
        if not res:
            L += [f"Not measured: `python scripts/benchmark.py --device {dev}`.", ""]
        for key, section in (("training", render_training), ("decoding", render_decoding),
                             ("serve", render_serving)):
            if key in res:
                L += section(res[key])
    return "\n".join(L)


def into_page(page: str | None, report: str) -> str:
    """``report`` between the markers of ``page``, or a page of its own."""
    if page and BEGIN in page and END in page.split(BEGIN, 1)[1]:
        head, rest = page.split(BEGIN, 1)
        return f"{head}{BEGIN}\n\n{report}\n{END}{rest.split(END, 1)[1]}"
    return f"# Benchmarks\n\n{report}"
