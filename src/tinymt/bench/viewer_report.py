"""``### The Attention tab's server`` of ``docs/benchmarks.md``: TensorBoard on synthetic
logdirs (:mod:`tinymt.bench.viewer_speed`), its latency, bytes and memory in two tables."""

from __future__ import annotations

from tinymt.bench.text import code, fmt, ms


def _kb(n: float) -> str:
    return fmt(n / 1e3, 1)


def _lat(entry: dict | None) -> str:
    """``median (p90)`` ms of one route, or a dash where it was not measured."""
    if not entry:
        return "—"
    return f"{ms(entry['p50_ms'])} ({ms(entry['p90_ms'])})"


def render_viewer(viewer: dict, where: str) -> list[str]:
    """``### The Attention tab's server``: TensorBoard on synthetic logdirs, two tables."""
    st, m, rows = viewer["settings"], viewer["machine"], viewer["rows"]
    load_fast = ("its default `--load_fast`" if st["load_fast"] == "default"
                 else f"`--load_fast={st['load_fast']}`")
    sizes = "; ".join(sorted({f"{r['size']}: {r['encoder_layers']}+{r['decoder_layers']} "
                              f"layers × {r['heads']} heads" for r in rows}))
    checked = sum(r["step_answers_checked"] for r in rows)
    equal = sum(r["step_answers_equal"] for r in rows)
    skipped = sorted({r["trend_skipped"] for r in rows if r.get("trend_skipped")})
    n = st["requests"]
    L = ["### The Attention tab's server", "",
         (f"`tensorboard --logdir` (TensorBoard {st['tensorboard']}, data server "
          f"{st['data_server'] or 'not installed'}, {load_fast}) on {where}, measured by "
          f"`{m['command']}` ({m['date']}, git {code(m)}), on a synthetic logdir written as "
          "the trainer writes it (`build_document`, `probe_summary`, TensorBoard's "
          f"`EventFileWriter`): one run, a record per probe every {st['step_every']} steps; "
          f"each probe a sentence of {st['source_tokens']} source pieces and "
          f"{st['target_tokens'][0]}–{st['target_tokens'][1]} target pieces, every head of "
          f"the size's model ({sizes}); seeded random softmax weights (logits N(0, "
          f"{st['sigma']:g}²), about 1.5 nats a row, as peaked as a trained model's), causal "
          "in the decoder's self-attention; no gold cells. *Ready*: from starting TensorBoard "
          "until `/runs` lists every probe and `/steps` every step. Latency: one request at a "
          "time, each on a new connection asking for gzip as a browser does, from sending it "
          f"to the last byte; median (p90) ms of {n} requests: `/runs`; `/steps` probe after "
          f"probe; `/step` on {n} random (probe, step) pairs, each once (*cold*), then the same "
          "again; `/trend` each probe once (*cold*: its records decoded), then "
          f"{n} more (*again*). Every `/step` answer was compared with the document written "
          f"for its probe and step: {equal:,} of {checked:,} equal."), "",
         ("| model | steps × probes | ready s | /runs ms | /steps ms | /step cold ms "
          "| /step again ms | /trend cold ms | /trend again ms |"),
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lat = r["latency"]
        L.append(f"| {r['size']} | {r['steps']} × {r['probes']} | {r['ready_seconds']:.1f} | "
                 f"{_lat(lat.get('runs'))} | {_lat(lat.get('steps'))} | "
                 f"{_lat(lat.get('step_cold'))} | {_lat(lat.get('step_again'))} | "
                 f"{_lat(lat.get('trend_cold'))} | {_lat(lat.get('trend_again'))} |")
    L += ["", ("Bytes: a frame (one probe at one step) as the record (the packed document) and "
               "as stored in the event file (the event, its tag's metadata and TFRecord "
               "framing), means; the event file; a `/step` and a `/trend` answer, JSON and as "
               "sent gzipped (medians). Memory (MiB): `VmRSS` and `VmHWM` summed over "
               "TensorBoard and its data server: resident 1 s after the load and the peak of "
               "the load; resident after the requests and their peak (the peak reset after "
               "the load)."), "",
          ("| model | steps × probes | weights a frame | record KB a frame | event KB a frame "
           "| event file MB | /step JSON KB | /step gzip KB | /trend JSON KB | /trend gzip KB "
           "| RSS loaded | load peak | RSS after requests | requests peak |"),
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: |"]
    for r in rows:
        lat, mem = r["latency"], r.get("memory_mib") or {}
        step, trend = lat["step_cold"], lat.get("trend_again")
        mib = [fmt(mem[k]) if mem.get(k) is not None else "—"
               for k in ("idle_after_load_rss", "load_peak", "after_requests_rss",
                         "requests_peak")]
        L.append(f"| {r['size']} | {r['steps']} × {r['probes']} | "
                 f"{fmt(r['weights_per_frame'])} | {_kb(r['record_bytes_per_frame'])} | "
                 f"{_kb(r['event_bytes_per_frame'])} | {r['event_file_bytes'] / 1e6:.2f} | "
                 f"{_kb(step['json_bytes'])} | {_kb(step['gzip_bytes'])} | "
                 + (f"{_kb(trend['json_bytes'])} | {_kb(trend['gzip_bytes'])} | " if trend
                    else "— | — | ") + " | ".join(mib) + " |")
    L.append("")
    for why in skipped:
        L += [f"`/trend`: not measured (the plugin has no such route: {why}).", ""]
    return L
