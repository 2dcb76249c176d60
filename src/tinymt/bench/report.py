"""The markdown report (``docs/benchmarks.md``), rendered from the results alone -- the
dict that ``--json`` writes -- so that merged runs of other devices render the same way."""

from __future__ import annotations

from tinymt.bench.report_text import INTRO, METHOD_BULLETS, PRECISION_BULLET
from tinymt.bench.scale_report import SCALE_COMMAND, render_scale
from tinymt.bench.targets import (
    BEAM_OVER_GREEDY_TARGET,
    CACHE_VS_PEER_TARGET,
    METHOD_LABELS,
    SEARCHES,
    SERVE_METHOD_LABELS,
    SERVE_TARGET,
    SERVE_TARGET_CLIENTS,
    TRAIN_TARGETS,
    serve_ratios,
)
from tinymt.bench.text import code, fmt, mark, ms, plural
from tinymt.bench.viewer_report import render_viewer


def gpu_command(cpu_json: str | None) -> str:
    merge = f" --merge {cpu_json}" if cpu_json else ""
    return (f"python scripts/benchmark.py --device cuda{merge} --json docs/benchmarks-cuda.json "
            "--out docs/benchmarks.md")


# What a user with a CUDA GPU runs, one command per step.
GPU_STEPS = (
    "# 1. a venv with a CUDA build of torch (a new venv: rm -rf .venv first if there is one;",
    "#    pick the wheel index of your CUDA version at https://pytorch.org/get-started/locally/),",
    "#    then the whole suite, the CUDA tests included",
    "make test TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128'",
    "# 2. the CUDA tests alone: bf16 SDPA against explicit weights, cached decoding, bf16 +",
    "#    fused AdamW + compile training, torchrun --nproc_per_node=1 with NCCL, translate, figures",
    ".venv/bin/python -m pytest -q -rs -m cuda",
    "# 3. training tok/s ours vs peer at base in bf16 (+ MFU), decoding, peak memory, keeping",
    "#    the CPU sections (from a clean working tree: the report names the commit); then compiled",
    gpu_command("docs/benchmarks.json"),
    "python scripts/benchmark.py --device cuda --compile --sizes base",
    "# 4. the GPU recipe: ends with the test_2016 sacreBLEU (cased, detokenized); validation lines",
    "#    print valid BLEU and the training seconds so far (TensorBoard: valid/bleu against",
    "#    valid/train_seconds). Offline: add data.path=<a local copy in the hub layout>",
    "python scripts/train.py experiment=multi30k_de_en",
    "# 5. time to 38 BLEU: the same recipe within 120 s of training, validated every 100 steps",
    "python scripts/train.py experiment=multi30k_de_en trainer.max_minutes=2 "
    "trainer.valid_every=100",
)


CPU_COMMAND = ("python scripts/benchmark.py --device cpu --json docs/benchmarks.json "
               "--out docs/benchmarks.md")
SERVE_COMMAND = ("python scripts/benchmark.py --device cpu --sections serve --run "
                 "outputs/<date>/<time> --merge docs/benchmarks.json --json docs/benchmarks.json "
                 "--out docs/benchmarks.md")
VIEWER_COMMAND = ("python scripts/benchmark.py --device cpu --sections viewer --merge "
                  "docs/benchmarks.json --json docs/benchmarks.json --out docs/benchmarks.md")


# --------------------------------------------------------------------------- one device
def render_training(dev: str, tr: dict, where: str) -> list[str]:
    ts = tr["settings"]
    cuda = dev == "cuda"
    L = [f"### Training throughput ({where})", ""]
    compiled = ", torch.compile on every model" if ts["compile"] else ", eager (no torch.compile)"
    L += [(f"Target tokens per second (teacher-forced forward + backward + AdamW step, grad-norm "
          f"clipping), {ts['precision']}{compiled}; "
          f"batches of ≤ {ts['max_tokens']:,} tokens (padding included) from the train split, "
          f"the same {plural(ts['timed_batches'], 'batch')} "
          f"({ts['timed_target_tokens_per_run']:,} target tokens) timed in every run after "
          f"{plural(ts['warmup'], 'warm-up step')}; {plural(ts['repeats'], 'run')} per model "
          "alternating ours, plain, peer, ours, …; median. *Plain* is our model with the "
          "training step before #36: torch's dropout and the loss on the full logits "
          "(ours: `layers.Dropout`, `loss.linear_cross_entropy` on the real targets only)."),
          ""]
    head = ("| size | params | ours tok/s | plain tok/s | ours/plain | peer tok/s | ours/peer "
            "| target | ours % of peak | plain % | peer % | ours peak MiB | peer peak MiB |")
    sep = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"
    if cuda:
        head += " ours MFU | peer MFU |"
        sep += " ---: | ---: |"
    L += [head, sep]
    for size, row in tr["sizes"].items():
        o, pl, p = row["ours"], row.get("plain"), row["peer"]
        tsize, tmin = TRAIN_TARGETS[dev]
        target = f"≥ {tmin:.1f}× peer" if tsize in (None, size) else "—"
        if target != "—":
            target += f" ({'met' if row['ratio'] >= tmin else 'missed'})"
        shares = [f"{e['share_of_peak'] * 100:.0f}%" if e and "share_of_peak" in e else "—"
                  for e in (o, pl, p)]
        plain_tps = fmt(pl["tokens_per_s"]) if pl else "—"
        speedup = f"**{row['speedup']:.2f}×**" if pl else "—"  # results from before #36: none
        line = (f"| {size} | {row['params'] / 1e6:.2f} M | {fmt(o['tokens_per_s'])} | "
                f"{plain_tps} | {speedup} | {fmt(p['tokens_per_s'])} | **{row['ratio']:.2f}×** | {target} | "
                f"{' | '.join(shares)} | {fmt(o['peak_mib'])} | {fmt(p['peak_mib'])} |")
        if cuda:
            line += "".join(f" {e['mfu'] * 100:.1f}% |" if e["mfu"] is not None else " n/a |"
                            for e in (o, p))
        L.append(line)
    if "matmul_peak_flops" in ts:
        per_token = ", ".join(f"{s} {r['flops_per_target_token'] / 1e6:.1f} M"
                              for s, r in tr["sizes"].items() if "flops_per_target_token" in r)
        L += ["", (f"% of peak = the model's FLOP/s ÷ the matmul peak measured in this run: "
                   f"{ts['matmul_peak_flops'] / 1e9:,.0f} GFLOP/s, the median of "
                   f"{len(ts['matmul_peak_runs'])} timed {ts['matmul_peak_size']}² "
                   f"{ts['matmul_peak_dtype']} matmuls, measured before every round. The "
                   "model's FLOPs are its matmuls on the batch's real tokens, forward and "
                   "backward (`tinymt.bench.flops.training_flops`; FLOPs per target token: "
                   f"{per_token}); padding is not counted.")]
    if cuda:
        peak = ts.get("gpu_peak_tflops")
        L += ["", ("MFU = 6 × params × target tokens/s ÷ "
                   + (f"{peak:g} TFLOP/s (the GPU's bf16 dense peak)" if peak else
                      "the GPU's bf16 dense peak (unknown for this GPU: pass --peak-tflops)")
                   + "; it ignores attention FLOPs and the encoder's source tokens.")]
    L += ["", "Final training loss of the last run (sanity: all start from the same weights "
          "and see the same batches): " + ", ".join(
              f"{s} ours {r['ours']['final_loss']:.3f} / peer {r['peer']['final_loss']:.3f}"
              for s, r in tr["sizes"].items()) + ".", ""]
    return L


def render_decoding(dev: str, de: dict, where: str) -> list[str]:
    ds = de["settings"]
    L = [f"### Decoding throughput ({where})", ""]
    L += [(f"{ds['sentences']:,} test sentences in {ds['batches']} length-sorted batch(es) of ≤ "
          f"{ds['batch_tokens']:,} source tokens, {ds['precision']}, median of "
          f"{plural(ds['repeats'], 'pass')} per method; time includes the encoder. "
          f"{ds['length_rule'][0].upper() + ds['length_rule'][1:]}."), ""]
    L += [("| model | search | method | sentences/s | seconds | output tokens | peak MiB "
           "| vs peer | BLEU |"),
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, row in de["sizes"].items():
        for search in SEARCHES:
            peer_sps = row[search]["peer"]["sentences_per_s"]
            for m in (m for m in METHOD_LABELS if m in row[search]):
                e = row[search][m]
                bleu = f"{e['bleu']:.2f}" if e.get("bleu") is not None else "—"
                L.append(f"| {label} | {search} | {METHOD_LABELS[m]} | "
                         f"{fmt(e['sentences_per_s'], 1)} | {e['seconds']:.2f} | "
                         f"{e['output_tokens']:,} | {fmt(e['peak_mib'])} | "
                         f"{e['sentences_per_s'] / peer_sps:.2f}× | {bleu} |")
    L += ["", ("| model | KV-cache greedy / peer greedy | target | KV-cache / recompute (greedy) "
               "| KV-cache / peer (beam 5) | beam-5 time / greedy time | target |"),
          "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for label, row in de["sizes"].items():
        r = row["ratios"]
        t1 = (f"≥ {CACHE_VS_PEER_TARGET:g}× ("
              f"{'met' if r['greedy_cache_over_peer'] >= CACHE_VS_PEER_TARGET else 'missed'})"
              if dev != "cuda" else "— (CPU target)")
        t2 = (f"≤ {BEAM_OVER_GREEDY_TARGET:g}× ("
              f"{'met' if r['beam5_over_greedy_time'] <= BEAM_OVER_GREEDY_TARGET else 'missed'})")
        L.append(f"| {label} | **{r['greedy_cache_over_peer']:.2f}×** | {t1} | "
                 f"{r['greedy_cache_over_nocache']:.2f}× | {r['beam5_cache_over_peer']:.2f}× | "
                 f"**{r['beam5_over_greedy_time']:.2f}×** | {t2} |")
    L.append("")
    return L + render_ct2(de)


def render_ct2(de: dict) -> list[str]:
    """The CTranslate2 rows against ours (KV cache): speed, identical outputs, BLEU."""
    rows = [(label, search, row[search]) for label, row in de["sizes"].items()
            for search in SEARCHES if "ct2_float32" in row[search]]
    if not rows:
        return []
    threads = de["settings"].get("ct2_threads")
    L = [(f"CTranslate2 rows: the same checkpoint exported by `scripts/export.py` "
          f"(float32, and int8 weights), decoded by `translate.py engine=ct2`'s code "
          f"(`tinymt.ct2.translate_export_ids`) with {plural(threads or 0, 'thread')}, in a process "
          "of their own, alternating with ours (the two thread pools in one process slow each "
          "other down); peak MiB counts the exported weights (`model.bin`). Greedy is the same "
          "search as ours; CTranslate2's beam search keeps the beam full where ours (the "
          "default rule, `shrink`) lets it shrink, so it is compared both with ours and with "
          "ours by its rule (`decode.beam_rule=full`, run untimed; docs/architecture.md)."), "",
         ("| model | search | float32 / ours | int8 / ours | float32 = ours (sentences) "
          "| float32 = ours, `beam_rule=full` | int8 = float32 (sentences) | BLEU ours "
          "| BLEU float32 | BLEU int8 |"),
         "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, search, r in rows:
        o, f, q = r["ours_cache"], r["ct2_float32"], r["ct2_int8"]
        n = de["settings"]["sentences"]
        full_rule = (f"{f['identical_to_ours_full_rule']:,} of {n:,}"
                     if "identical_to_ours_full_rule" in f else "not measured")
        L.append(f"| {label} | {search} | **{f['sentences_per_s'] / o['sentences_per_s']:.2f}×** | "
                 f"**{q['sentences_per_s'] / o['sentences_per_s']:.2f}×** | "
                 f"{f['identical_to_ours']:,} of {n:,} | {full_rule} | "
                 f"{q['identical_to_ct2_float32']:,} of {n:,} | {o['bleu']:.2f} | "
                 f"{f['bleu']:.2f} | {q['bleu']:.2f} |")
    L.append("")
    return L


def _serve_row(row: dict) -> str:
    label = SERVE_METHOD_LABELS.get(row["method"], row["method"])
    head = f"| {row['engine']} | {label} | {row['clients']} |"
    if "not_run" in row:
        return head + f" {row['not_run']} | | | | | | |"
    rss = (fmt(row["server_rss_mib"]) if row.get("server_rss_mib") is not None else
           f"— (each process: {fmt(row['process_peak_rss_mib'])} peak)")
    batch = f"{row['mean_batch']:.1f}" if row.get("mean_batch") else "—"
    sps = row["sentences_per_s"]
    return (head + f" {fmt(sps, 1 if sps >= 10 else 2)} | {ms(row['p50_ms'])} | "
            f"{ms(row['p99_ms'])} | {row['errors']} | {row['equal_to_one_at_a_time']:,} of "
            f"{row['requests']:,} | {batch} | {rss} |")


def _serve_ratio_lines(serve: dict) -> list[str]:
    """Micro-batching over one-at-a-time at every level, per engine, and the target."""
    L = []
    for engine, by_clients in serve_ratios(serve).items():
        parts = [f"{'**' if c == SERVE_TARGET_CLIENTS else ''}{r:.2f}×"
                 f"{'**' if c == SERVE_TARGET_CLIENTS else ''} at {plural(c, 'client')}"
                 for c, r in sorted(by_clients.items())]
        r = by_clients.get(SERVE_TARGET_CLIENTS)
        target = (f"target ≥ {SERVE_TARGET:g}× at {SERVE_TARGET_CLIENTS} clients: "
                  + ("not measured" if r is None else ("met" if r >= SERVE_TARGET else "missed")))
        L.append(f"- {engine}: {', '.join(parts)} ({target}).")
    return L


def render_serving(serve: dict, where: str) -> list[str]:
    """``### Serving``: the server under load, its table, the micro-batching ratios."""
    st, m = serve["settings"], serve["machine"]
    levels = ", ".join(f"{n} at {plural(int(c), 'client')}" for c, n in st["requests"].items())
    search = "greedy" if st["beam"] == 1 else f"beam {st['beam']}"
    L = ["### Serving", "",
         (f"`scripts/serve.py` under load on {where}, measured by `{m['command']}` ({m['date']}, git "
          f"{code(m)}): LibreTranslate's `POST /translate`, one sentence a request, "
          f"{st['sentence_source']}; run `{st['run']}` (`{st['checkpoint']}`, "
          f"{st['pair']['source']}→{st['pair']['target']}, {search}); {plural(st['threads'], 'thread')} per server; timed requests per level: "
          f"{levels}, after one untimed request per client. The clients run closed loops "
          "(the next request when the answer arrives), each on its own keep-alive "
          "connection, all in one asyncio loop of the benchmark process on the same cores. "
          f"Micro-batching: the server's defaults (`batch_sentences={st['batch_sentences']}` "
          f"`batch_wait_ms={st['batch_wait_ms']:g}`); one at a time: `batch_sentences=1 "
          "batch_wait_ms=0`. The two servers of an engine run side by side and take the "
          "levels in turn. The ct2 engine serves the run's checkpoint exported (float32, "
          "`tinymt.ct2.export_run`) into a temporary folder. Sentences/s = answered requests ÷ wall time of the level; latency "
          "from writing a request to reading its answer; *equal* counts answers identical to "
          "the one-at-a-time server's answer to the same sentence sent alone (the "
          "`translate.py` rows: the torch engine's); mean batch = sentences ÷ batches the "
          "server decoded during the level (its warm-up included); server RSS after the level."), "",
         ("| engine | method | clients | sentences/s | p50 ms | p99 ms | errors "
          "| equal to one-at-a-time | mean batch | server RSS MiB |"),
         "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    L += [_serve_row(row) for row in serve["rows"]]
    L += ["", "Micro-batching's sentences/s over one-at-a-time's:", "",
          *_serve_ratio_lines(serve), ""]
    if serve.get("ct2_equal_to_torch") is not None:
        L += [(f"CTranslate2's one-at-a-time answers equal torch's for "
               f"{serve['ct2_equal_to_torch']:,} of {st['sentences']:,} sentences (greedy is "
               "the same search on both)."), ""]
    for engine, why in serve.get("skipped", {}).items():
        L += [f"{engine}: not measured ({why}).", ""]
    return L


def render_device(dev: str, res: dict) -> list[str]:
    machine = res.get("machine") or \
        (res.get("serve") or res.get("viewer") or res["scale"])["machine"]
    where = machine["gpu"] if dev == "cuda" else \
        f"{machine['cpu']}, {plural(machine['torch_threads'], 'thread')}"
    L = []
    if "training" in res:
        L += render_training(dev, res["training"], where)
    if "decoding" in res:
        L += render_decoding(dev, res["decoding"], where)
    if "serve" in res:
        sm = res["serve"]["machine"]
        L += render_serving(res["serve"], sm["gpu"] if dev == "cuda" else
                            f"{sm['cpu']}, {sm['cpu_cores']} cores")
    elif dev == "cpu":
        L += ["### Serving", "", ("Not measured in this run. With a trained run (keeps the "
                                  "other sections):"), "", "```", SERVE_COMMAND, "```", ""]
    if "viewer" in res:
        vm = res["viewer"]["machine"]
        L += render_viewer(res["viewer"], f"{vm['cpu']}, {vm['cpu_cores']} cores")  # no GPU
    elif dev == "cpu":
        L += ["### The Attention tab's server", "",
              "Not measured in this run (TensorBoard on 100 steps × 10 probes; keeps the other "
              "sections):", "", "```", VIEWER_COMMAND, "```", ""]
    if "scale" in res:
        sm = res["scale"]["machine"]
        L += render_scale(res["scale"], f"{sm['cpu']}, {sm['cpu_cores']} cores")
    elif dev == "cpu":
        L += ["### Memory and time against corpus size", "", "Not measured in this run "
              "(Multi30k repeated to 0.3 M and 3 M pairs; keeps the other sections):", "",
              "```", SCALE_COMMAND, "```", ""]
    return L


# --------------------------------------------------------------------------- the report
def render_machines(devices: dict) -> list[str]:
    L = ["## Machine and command", "", "| | |", "| --- | --- |"]
    for dev in ("cpu", "cuda"):
        res = devices.get(dev)
        if not res:
            continue
        D = dev.upper()
        if "serve" in res:
            sm = res["serve"]["machine"]
            L += [f"| {D} serving: date | {sm['date']} |",
                  f"| {D} serving: command | `{sm['command']}` |",
                  f"| {D} serving: code | git {code(sm)} |"]
        for key, what in (("viewer", "Attention tab"), ("scale", "corpus size")):
            if key in res:
                vm = res[key]["machine"]
                L += [f"| {D} {what}: date | {vm['date']} |",
                      f"| {D} {what}: command | `{vm['command']}` |",
                      f"| {D} {what}: code | git {code(vm)} |"]
        if "machine" not in res:
            continue
        m = res["machine"]
        L += [f"| {D} run: date | {m['date']} |",
              f"| {D} run: command | `{m['command']}` |",
              f"| {D} run: code | git {code(m)} |",
              f"| {D} run: software | torch {m['torch']}"
              + (f" (CUDA {m['cuda']})" if m.get("cuda") else "")
              + f", Python {m['python']}, {m['platform']} |",
              (f"| {D} run: CPU | {m['cpu']}, {m['cpu_cores']} cores, "
               f"{m['torch_threads']} torch threads |")]
        if m.get("gpu"):
            L.append(f"| {D} run: GPU | {m['gpu']} |")
        if res.get("data"):
            L.append(f"| {D} run: data | {res['data']['name']}; "
                     f"{res['data']['train_pairs']:,} train / {res['data']['test_pairs']:,} "
                     "test pairs |")
    L.append("")
    return L


def render_targets(results: dict) -> list[str]:
    L = ["## Targets", "", "Measured ratios beside the targets, met or not.", "",
         "| target | where | measured | met |", "| --- | --- | ---: | --- |"]
    for t in results["targets"]:
        L.append(f"| {t['target']} | {t['where']} | {t['measured']} | {mark(t['met'])} |")
    L.append("")
    return L


def render_sections(meta: dict, devices: dict) -> list[str]:
    """``## CPU`` and ``## CUDA``: the measurements, or how to get them."""
    L = []
    for dev, title in (("cpu", "CPU"), ("cuda", "CUDA")):
        L += [f"## {title}", ""]
        res = devices.get(dev)
        if res:
            L += render_device(dev, res)
        elif dev == "cuda":
            why = ("no GPU on this machine" if not meta.get("cuda_available")
                   else "this run used --device cpu")
            L += [(f"Not measured: {why}. On a machine with a CUDA GPU run (`--merge` keeps "
                   "the CPU sections; add `--data-path <dir>/multi30k-hub-layout` where "
                   "`../shared/data` is not beside the repo):"), "", "```",
                  gpu_command(meta.get("json")), "```", "",
                  "### On a CUDA GPU, step by step", "", "```", *GPU_STEPS, "```", ""]
        else:
            L += ["Not measured in this run. On a CPU run:", "", "```",
                  CPU_COMMAND, "```", ""]
    return L


def render_method(meta: dict) -> list[str]:
    meter = meta.get("memory_method", {})
    memory = meter.get("cpu", meter.get("cuda", "see the JSON"))
    if "cpu" in meter and "cuda" in meter:
        memory += "; on CUDA: " + meter["cuda"]
    return ["## Method", "", *METHOD_BULLETS, f"- **Peak memory**: {memory}.",
            PRECISION_BULLET]


def render_markdown(results: dict) -> str:
    meta, devices = results["meta"], results["devices"]
    L = ["# Benchmarks", "", INTRO, ""]
    L += render_machines(devices)
    notes = [res["data"]["note"] for res in devices.values()
             if res and res.get("data") and res["data"]["note"]]
    if meta.get("quick"):
        notes.append("`--quick` run: a smoke test of the benchmark itself (few steps, few "
                     "sentences); its numbers are not meaningful")
    for note in notes:
        L += [f"> **Note:** {note}.", ""]
    L += render_targets(results)
    L += render_sections(meta, devices)
    L += render_method(meta)
    L += ["", "## Commands", "", "```",
          "# a < 2 min smoke run of the benchmark itself (its numbers mean nothing); like",
          "# every run without --out it writes outputs/benchmarks/<date>/<time>/benchmarks.{md,json}",
          "python scripts/benchmark.py --quick",
          "# decoding with a trained model instead of random weights (+ BLEU, and the",
          "# CTranslate2 float32 / int8 rows when the ct2 extra is installed)",
          "python scripts/benchmark.py --run outputs/<date>/<time>",
          "# this report and its raw numbers (docs/ is written from a clean working tree only)",
          CPU_COMMAND,
          "# the serving section alone (scripts/serve.py under load, both engines), keeping the",
          "# others: a trained run, and a quiet machine (the clients share its cores)",
          SERVE_COMMAND,
          "# the Attention tab's server (TensorBoard on 100 steps x 10 probes, and 10 x 1),",
          "# keeping the others",
          VIEWER_COMMAND,
          "# memory and time of prepare_data.py and the training start-up against the corpus's",
          "# size (Multi30k repeated to 0.3 M and 3 M pairs; ~10 min on 2 cores), keeping the others",
          SCALE_COMMAND,
          "# GPU sections, keeping the CPU ones",
          gpu_command("docs/benchmarks.json"),
          "```", ""]
    return "\n".join(L)
