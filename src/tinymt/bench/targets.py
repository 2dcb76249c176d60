"""What is measured (sizes, decoding methods, searches) and the targets it is held to."""

from __future__ import annotations

CPU_SIZES = ("tiny", "small")
CUDA_SIZES = ("tiny", "small", "base")
# with --run (a trained model) and CTranslate2 installed: the run exported, weights as named
CT2_METHODS = {"ct2_float32": "none", "ct2_int8": "int8"}  # method -> export quantization=
METHOD_LABELS = {
    "ours_cache": "ours, KV cache",
    "ours_nocache": "ours, recompute prefix",
    "peer": "peer (nn.Transformer), recompute prefix",
    "ct2_float32": "CTranslate2, float32",
    "ct2_int8": "CTranslate2, int8",
}
SEARCHES = {"greedy": 1, "beam5": 5}  # name -> beam size
TRAIN_TARGETS = {"cuda": ("base", 1.5), "cpu": (None, 1.0)}  # (size or all, min ours/peer)
CPU_PEAK_SIZE, CPU_PEAK_SHARE, CPU_SPEEDUP = "small", 0.60, 1.3  # #36: share of the matmul
# peak measured in the same run, and tokens/s over the plain step (the step before #36)
CACHE_VS_PEER_TARGET = 3.0  # KV-cache greedy sentences/s over the peer's loop, CPU
BEAM_OVER_GREEDY_TARGET = 2.5  # beam-5 time / greedy time, at most
INT8_BLEU_COST_TARGET = 0.5  # CTranslate2 int8 BLEU below float32's (beam 5), at most
# serving (--sections serve): micro-batching's sentences/s over one-at-a-time's, at least,
# with this many concurrent clients; per engine
SERVE_TARGET, SERVE_TARGET_CLIENTS = 4.0, 64
SERVE_ENGINES = ("torch", "ct2")
SERVE_METHOD_LABELS = {
    "micro_batching": "micro-batching",
    "one_at_a_time": "one at a time",
    "translate_py": "one `translate.py` process per request",
}


def serve_ratios(serve: dict) -> dict[str, dict[int, float]]:
    """``{engine: {clients: micro-batching sentences/s ÷ one-at-a-time's}}`` of a serve
    section."""
    by = {(r["engine"], r["method"], r["clients"]): r for r in serve["rows"]}
    out: dict[str, dict[int, float]] = {}
    for (engine, method, clients), row in by.items():
        alone = by.get((engine, "one_at_a_time", clients))
        if method == "micro_batching" and alone and alone["sentences_per_s"]:
            out.setdefault(engine, {})[clients] = (row["sentences_per_s"]
                                                   / alone["sentences_per_s"])
    return out


def _serve_targets(devices: dict, add) -> None:
    """Micro-batching ≥ 4× one-at-a-time at 64 clients, per engine: on every device with a
    serve section, and on the CPU (the target's home) also when it has none."""
    name = (f"micro-batching ≥ {SERVE_TARGET:g}× one-at-a-time at {SERVE_TARGET_CLIENTS} "
            "clients")
    for dev, res in devices.items():
        serve = (res or {}).get("serve")
        if serve is None and dev != "cpu":
            continue
        ratios = serve_ratios(serve) if serve else {}
        for engine in SERVE_ENGINES:
            r = ratios.get(engine, {}).get(SERVE_TARGET_CLIENTS)
            add(name, f"{dev.upper()}, {engine}", "not measured" if r is None else f"{r:.2f}×",
                None if r is None else r >= SERVE_TARGET)


def evaluate_targets(devices: dict) -> list[dict]:
    """``[{target, where, measured, met}]`` for the results of each device (None: not run)."""
    rows = []

    def add(name, where, measured, ok):
        rows.append({"target": name, "where": where, "measured": measured, "met": ok})

    cuda = devices.get("cuda")
    if cuda and "base" in cuda.get("training", {}).get("sizes", {}):
        ratio = cuda["training"]["sizes"]["base"]["ratio"]
        add("GPU training ≥ 1.5× peer", "CUDA, base", f"{ratio:.2f}×", ratio >= 1.5)
    else:
        add("GPU training ≥ 1.5× peer", "CUDA, base", "not measured", None)
    cpu = devices.get("cpu")
    for size in CPU_SIZES:
        if cpu and size in cpu.get("training", {}).get("sizes", {}):
            ratio = cpu["training"]["sizes"][size]["ratio"]
            add("CPU training ≥ 1.0× peer", f"CPU, {size}", f"{ratio:.2f}×", ratio >= 1.0)
        else:
            add("CPU training ≥ 1.0× peer", f"CPU, {size}", "not measured", None)
    sizes = (cpu or {}).get("training", {}).get("sizes", {})
    row = sizes.get(CPU_PEAK_SIZE, {})
    share, speedup = row.get("ours", {}).get("share_of_peak"), row.get("speedup")
    add(f"CPU training ≥ {CPU_PEAK_SHARE:.0%} of the measured matmul peak",
        f"CPU, {CPU_PEAK_SIZE}", "not measured" if share is None else f"{share:.0%}",
        None if share is None else share >= CPU_PEAK_SHARE)
    add(f"CPU training ≥ {CPU_SPEEDUP:g}× the plain step", f"CPU, {CPU_PEAK_SIZE}",
        "not measured" if speedup is None else f"{speedup:.2f}×",
        None if speedup is None else speedup >= CPU_SPEEDUP)
    if cpu and "decoding" in cpu:
        for label, row in cpu["decoding"]["sizes"].items():
            r = row["ratios"]["greedy_cache_over_peer"]
            add("KV-cache greedy ≥ 3× peer's recompute loop", f"CPU, {label}", f"{r:.2f}×",
                r >= CACHE_VS_PEER_TARGET)
    else:
        add("KV-cache greedy ≥ 3× peer's recompute loop", "CPU", "not measured", None)
    for dev, res in devices.items():
        if not res or "decoding" not in res:
            continue
        for label, row in res["decoding"]["sizes"].items():
            r = row["ratios"]["beam5_over_greedy_time"]
            add("beam 5 within 2.5× of greedy (time)", f"{dev.upper()}, {label}", f"{r:.2f}×",
                r <= BEAM_OVER_GREEDY_TARGET)
            beam = row["beam5"]
            if beam.get("ct2_int8", {}).get("bleu") is not None:
                cost = beam["ct2_float32"]["bleu"] - beam["ct2_int8"]["bleu"]
                add(f"CTranslate2 int8 costs ≤ {INT8_BLEU_COST_TARGET} BLEU (beam 5)",
                    f"{dev.upper()}, {label}", f"{cost:+.2f} BLEU", cost <= INT8_BLEU_COST_TARGET)
    _serve_targets(devices, add)
    return rows
