"""The benchmark script (structure only, never a speed) and its nn.Transformer peer."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import unicodedata

import pyarrow as pa
import pytest
import torch

from conftest import REPO_ROOT
from tinymt.batching import collate
from tinymt.bench import machine
from tinymt.bench import main as bench_main
from tinymt.bench.decode_speed import bench_decoding, decode_once
from tinymt.bench.flops import training_flops
from tinymt.bench.memory import MemoryMeter
from tinymt.bench.peer import PeerTransformer
from tinymt.bench.report import render_decoding, render_markdown
from tinymt.bench.scale import measure_prepare, parse_pairs, write_corpus
from tinymt.bench.scale_process import Run, phases
from tinymt.bench.scale_report import scale_targets
from tinymt.bench.serve_load import HttpError, percentile, read_response
from tinymt.bench.targets import evaluate_targets
from tinymt.bench.viewer_speed import Shape, steps_of, synthetic_document
from tinymt.bench.workload import load_data
from tinymt.config import ModelConfig
from tinymt.decoding import beam_search, greedy_decode
from tinymt.errors import TinyMTError
from tinymt.model import Transformer, count_parameters
from tinymt.viewer import plugin
from tinymt.viewer.summary import encode

METHODS = ("ours_cache", "ours_nocache", "peer")


# --------------------------------------------------------------------------- the script
@pytest.mark.slow
def test_quick_benchmark_writes_report_and_json(tmp_path):
    """With no --out the report and its JSON go to outputs/benchmarks/<date>/<time>/ under
    the current directory, and the project's docs/ stay as they were."""
    docs = {p: p.read_bytes() for p in (REPO_ROOT / "docs").glob("benchmarks*")}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"), "--quick",
           "--device", "cpu", "--threads", "1", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p: p.read_bytes() for p in (REPO_ROOT / "docs").glob("benchmarks*")} == docs
    folders = list((tmp_path / "outputs" / "benchmarks").glob("*/*"))
    assert len(folders) == 1 and re.fullmatch(r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d",
                                               folders[0].relative_to(folders[0].parents[1]).as_posix())
    out, js = folders[0] / "benchmarks.md", folders[0] / "benchmarks.json"

    md = out.read_text()
    assert re.search(r"^\| CPU run: code \| git [0-9a-f]{7,}( and uncommitted changes)? \|$",
                     md, flags=re.M)
    for heading in ("# Benchmarks", "## Machine and command", "## Targets", "## CPU",
                    "### Training throughput", "### Decoding throughput", "## CUDA",
                    "## Method", "## Commands"):
        assert f"\n{heading}" in "\n" + md, heading
    assert "torch " + torch.__version__ in md
    assert "python scripts/benchmark.py --quick" in md  # the command line
    # training table: a row for tiny with ours, peer and the ratio columns
    assert ("| size | params | ours tok/s | plain tok/s | ours/plain | peer tok/s | ours/peer "
            "| target | ours % of peak | plain % | peer % |") in md
    train_rows = [ln for ln in md.splitlines() if ln.startswith("| tiny |")]
    assert train_rows and train_rows[0].count("×") >= 2
    # decoding table: every method, greedy and beam 5
    for search in ("greedy", "beam5"):
        for label in ("ours, KV cache", "ours, recompute prefix", "peer (nn.Transformer)"):
            assert any(ln.startswith(f"| tiny | {search} | {label}") for ln in md.splitlines())
    assert "KV-cache greedy / peer greedy" in md and "beam-5 time / greedy time" in md
    for target in ("GPU training ≥ 1.5× peer", "CPU training ≥ 1.0× peer",
                   "CPU training ≥ 60% of the measured matmul peak",
                   "CPU training ≥ 1.3× the plain step",
                   "KV-cache greedy ≥ 3× peer's recompute loop",
                   "beam 5 within 2.5× of greedy"):
        assert target in md
    if not torch.cuda.is_available():
        assert "Not measured: no GPU on this machine" in md
        assert "--device cuda" in md  # the command to run on a GPU

    res = json.loads(js.read_text())
    assert set(res) >= {"schema", "meta", "devices", "targets"}
    assert res["devices"]["cuda"] is None  # --device cpu, nothing merged
    cpu = res["devices"]["cpu"]
    assert set(cpu) >= {"machine", "data", "training", "decoding", "memory_method"}
    assert cpu["machine"]["torch"] == torch.__version__
    tiny = cpu["training"]["sizes"]["tiny"]
    assert set(tiny) >= {"params", "ours", "plain", "peer", "ratio", "speedup"}
    peak = cpu["training"]["settings"]["matmul_peak_flops"]
    assert peak == pytest.approx(statistics.median(
        cpu["training"]["settings"]["matmul_peak_runs"]))
    for name in ("ours", "plain", "peer"):
        entry = tiny[name]
        assert set(entry) >= {"tokens_per_s", "runs", "peak_mib", "final_loss", "mfu",
                              "share_of_peak"}
        assert entry["tokens_per_s"] > 0 and entry["peak_mib"] > 0
        assert math.isfinite(entry["final_loss"])
        assert entry["share_of_peak"] == pytest.approx(
            entry["tokens_per_s"] * tiny["flops_per_target_token"] / peak)
    assert tiny["ratio"] == pytest.approx(tiny["ours"]["tokens_per_s"]
                                          / tiny["peer"]["tokens_per_s"])
    assert tiny["speedup"] == pytest.approx(tiny["ours"]["tokens_per_s"]
                                            / tiny["plain"]["tokens_per_s"])
    dec = cpu["decoding"]
    assert dec["settings"]["sentences"] == 50
    row = dec["sizes"]["tiny"]
    for search in ("greedy", "beam5"):
        for m in METHODS:
            e = row[search][m]
            assert set(e) >= {"seconds", "sentences_per_s", "output_tokens", "peak_mib"}
            # the rate is the sentences over the median of the timed passes
            assert e["seconds"] == pytest.approx(statistics.median(e["runs_seconds"]))
            assert e["sentences_per_s"] == pytest.approx(50 / e["seconds"])
        # every method decoded the same sentences to the same number of tokens (greedy)
        assert len({row["greedy"][m]["output_tokens"] for m in METHODS}) == 1
    assert set(row["ratios"]) == {"greedy_cache_over_peer", "greedy_cache_over_nocache",
                                  "beam5_cache_over_peer", "beam5_over_greedy_time"}
    assert all({"target", "where", "measured", "met"} <= set(t) for t in res["targets"])


def test_docs_are_written_from_a_clean_working_tree_only(monkeypatch, tmp_path, capsys):
    """--out or --json into docs/ with uncommitted changes: one line, exit 2, before any
    measuring, docs/ untouched; a report outside docs/ is not held to it."""
    monkeypatch.chdir(tmp_path)  # main() moves to the repo root; this moves back after
    monkeypatch.setattr(bench_main, "uncommitted_changes", lambda: ["src/tinymt/model.py"])
    monkeypatch.setattr(bench_main, "measure", lambda *a: pytest.fail("measured before refusing"))
    docs = {p: p.read_bytes() for p in (REPO_ROOT / "docs").glob("benchmarks*")}
    for argv in (["--out", str(REPO_ROOT / "docs" / "benchmarks.md")],
                 ["--out", str(tmp_path / "x.md"), "--json", str(REPO_ROOT / "docs" / "x.json")]):
        with pytest.raises(SystemExit) as exit_:
            bench_main.main(["--quick", "--device", "cpu", *argv])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: docs/")
        assert "uncommitted changes (src/tinymt/model.py)" in err
        monkeypatch.chdir(tmp_path)
    assert {p: p.read_bytes() for p in (REPO_ROOT / "docs").glob("benchmarks*")} == docs
    bench_main.check_docs_output([str(tmp_path / "x.md"), None])  # elsewhere: no question asked
    monkeypatch.setattr(bench_main, "uncommitted_changes", lambda: [])
    bench_main.check_docs_output([str(REPO_ROOT / "docs" / "benchmarks.md")])  # clean: allowed


def test_uncommitted_changes_reads_git_status(monkeypatch):
    monkeypatch.setattr(machine, "_git", lambda *a: " M src/a.py\nA  b.py\n?? new dir/\n")
    assert machine.uncommitted_changes() == ["src/a.py", "b.py", "new dir/"]
    monkeypatch.setattr(machine, "_git", lambda *a: None)  # not a git checkout
    assert machine.uncommitted_changes() == [] and machine.git_revision() == "unknown"


def test_help_lists_the_options():
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"), "--help"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0
    for option in ("--quick", "--device", "--sizes", "--steps", "--repeats", "--sentences",
                   "--out", "--json", "--run", "--compile", "--merge", "--sections",
                   "--serve-clients", "--serve-requests", "--serve-process-requests",
                   "--viewer-sizes", "--viewer-logs", "--viewer-requests", "--viewer-load-fast",
                   "--scale-pairs", "--scale-steps", "--scale-vocab", "--scale-dir"):
        assert option in proc.stdout


# --------------------------------------------------------------------------- serving
@pytest.mark.slow
def test_serve_section_measures_the_server_and_keeps_the_merged_sections(tiny_run, tmp_path):
    """``--sections serve`` on a trained run: both servers of each engine at every level,
    every answer equal to the one-at-a-time answer, the translate.py baseline, the table
    and the target; the training and decoding sections come from --merge unchanged."""
    merged = REPO_ROOT / "docs" / "benchmarks.json"
    out, js = tmp_path / "b.md", tmp_path / "b.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"), "--device", "cpu",
           "--threads", "1", "--sections", "serve", "--run", str(tiny_run),
           "--serve-clients", "2", "--serve-requests", "6", "--serve-process-requests", "1",
           "--merge", str(merged), "--out", str(out), "--json", str(js)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(js.read_text())
    cpu, before = res["devices"]["cpu"], json.loads(merged.read_text())["devices"]["cpu"]
    assert cpu["training"] == before["training"] and cpu["decoding"] == before["decoding"]
    assert cpu["machine"] == before["machine"]  # the command that measured those
    serve = cpu["serve"]
    assert serve["machine"]["command"].startswith("python scripts/benchmark.py --device cpu")
    assert serve["settings"]["requests"] == {"2": 6}
    assert serve["settings"]["sentences"] == 6 and serve["settings"]["threads"] == 1
    engines = ["torch"] + (["ct2"] if importlib.util.find_spec("ctranslate2") else [])
    rows = {(r["engine"], r["method"], r["clients"]): r for r in serve["rows"]}
    expected = {(e, m, c) for e in engines for m in ("micro_batching", "one_at_a_time")
                for c in (2,)} | {("torch", "translate_py", 2)}
    assert set(rows) == expected and len(serve["rows"]) == len(expected)
    for key, row in rows.items():
        n = key[2] if key[1] == "translate_py" else 6  # one process per client
        assert row["requests"] == n and row["errors"] == 0, key
        assert row["equal_to_one_at_a_time"] == n, key  # batching changes no translation
        assert row["sentences_per_s"] == pytest.approx(n / row["seconds"])
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["seconds"] * 1000 * (1 + 1e-9)
        if key[1] != "translate_py":
            assert row["server_rss_mib"] > 50 and row["mean_batch"] >= 1
    md = out.read_text()
    assert "\n### Serving\n" in md and "\n### Training throughput" in md
    assert ("| engine | method | clients | sentences/s | p50 ms | p99 ms | errors "
            "| equal to one-at-a-time |") in md
    sps = rows[("torch", "micro_batching", 2)]["sentences_per_s"]
    assert f"| torch | micro-batching | 2 | {sps:,.{1 if sps >= 10 else 2}f} |" in md
    for engine in ("torch", "ct2"):
        assert (f"| micro-batching ≥ 4× one-at-a-time at 64 clients | CPU, {engine} | "
                "not measured | n/a |") in md
    assert "| CPU serving: command | `python scripts/benchmark.py --device cpu" in md


def test_serve_section_needs_a_run(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)  # main() moves to the repo root; this moves back after
    with pytest.raises(SystemExit) as exit_:
        bench_main.main(["--device", "cpu", "--sections", "serve", "--out", str(tmp_path / "x.md")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --sections serve needs --run")
    for bad in (["--sections", "training,serving"], ["--serve-clients", "1,x"],
                ["--serve-clients", "0"]):
        with pytest.raises(SystemExit):
            bench_main.parse_args(bad)
    args = bench_main.parse_args(["--sections", "serve", "--serve-clients", "64, 1,8"])
    assert args.section_set == {"serve"} and args.serve_client_list == [1, 8, 64]
    assert bench_main.parse_args([]).section_set == {"training", "decoding"}


def test_serve_load_percentiles_and_responses():
    values = [float(x) for x in torch.randperm(101).tolist()]
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert percentile(values, q) == pytest.approx(100 * q)
    assert percentile([5.0], 0.99) == 5.0 and math.isnan(percentile([], 0.5))

    def read(raw: bytes):
        async def go():
            reader = asyncio.StreamReader()
            reader.feed_data(raw)
            reader.feed_eof()
            return await read_response(reader)
        return asyncio.run(go())

    body = b'{"translatedText": "a"}'
    assert read(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-A: b\r\n\r\n%s" % (len(body), body)
                ) == (200, {"content-length": str(len(body)), "x-a": "b"}, body)
    with pytest.raises(HttpError, match="Content-Length"):
        read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n")
    with pytest.raises(HttpError, match="status line"):
        read(b"garbage\r\n\r\n")
    with pytest.raises(asyncio.IncompleteReadError):
        read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")


# --------------------------------------------------------------------------- the viewer
def _sha256(doc: dict) -> dict[str, str]:
    return {kind: hashlib.sha256(view["weights"].tobytes()).hexdigest()
            for kind, view in doc["kinds"].items()}


@pytest.mark.slow  # a real TensorBoard: 7 s
def test_viewer_section_measures_tensorboard_on_the_records_it_wrote(tmp_path):
    """``--sections viewer`` at its smallest (3 steps x 2 probes of the tiny model): a real
    TensorBoard serves the records written, each /step answer equal to the document of its
    probe and step; the sizes are those of the records; latency, bytes and memory are there
    and sane; the report has the section and its command."""
    out, js = tmp_path / "b.md", tmp_path / "b.json"
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"), "--device", "cpu",
           "--sections", "viewer", "--viewer-sizes", "tiny", "--viewer-logs", "3x2",
           "--viewer-requests", "4", "--out", str(out), "--json", str(js)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    viewer = json.loads(js.read_text())["devices"]["cpu"]["viewer"]
    assert viewer["machine"]["command"].startswith("python scripts/benchmark.py --device cpu")
    assert viewer["settings"]["requests"] == 4 and viewer["settings"]["logs"] == ["3x2"]
    (row,) = viewer["rows"]
    assert (row["size"], row["steps"], row["probes"], row["frames"]) == ("tiny", 3, 2, 6)
    assert (row["encoder_layers"], row["decoder_layers"], row["heads"]) == (2, 2, 4)

    # what was written: the documents of every probe at every step, as the test makes them
    shape = Shape.of("tiny")
    docs = {(p, s): synthetic_document(shape, p, s) for p in range(2) for s in steps_of(3)}
    assert steps_of(3) == [50, 100, 150]
    assert row["weights_per_frame"] == pytest.approx(statistics.mean(
        sum(v["weights"].size for v in d["kinds"].values()) for d in docs.values()))
    assert row["record_bytes_per_frame"] == pytest.approx(statistics.mean(
        len(encode(d)) for d in docs.values()))
    assert row["record_bytes_per_frame"] < row["event_bytes_per_frame"] \
        < row["record_bytes_per_frame"] + 1000  # + the tag's metadata and framing
    assert 6 * row["event_bytes_per_frame"] <= row["event_file_bytes"] \
        < 6 * row["event_bytes_per_frame"] + 200  # + the file's version event

    # the answer served for the sample step is the document written for it, weight by weight
    sample = row["sample"]
    written = docs[(sample["probe"], sample["step"])]
    assert sample["weights_sha256"] == _sha256(written)
    other = docs[(sample["probe"], 100 if sample["step"] != 100 else 50)]
    assert set(_sha256(other).values()).isdisjoint(sample["weights_sha256"].values())
    assert row["step_answers_checked"] == row["step_answers_equal"] == 4

    lat = row["latency"]
    has_trend = hasattr(plugin.AttentionPlugin, "_trend")  # the route, where it is there
    assert (row["trend_skipped"] is None) == has_trend, row["trend_skipped"]
    want = {"runs": 4, "steps": 4, "step_cold": 4, "step_again": 4,
            **({"trend_cold": 2, "trend_again": 4} if has_trend else {})}
    assert {k: v["requests"] for k, v in lat.items()} == want
    for name, entry in lat.items():
        assert 0 < entry["p50_ms"] <= entry["p90_ms"] <= entry["max_ms"] < 30_000, name
        assert 0 < entry["gzip_bytes"], name
    step = lat["step_cold"]
    smallest = min(sum(v["weights"].size for v in d["kinds"].values()) for d in docs.values())
    assert step["json_bytes"] >= 4 * smallest  # 4 bytes a weight, and the text around them
    assert step["gzip_bytes"] < step["json_bytes"] / 2
    assert lat["step_again"]["json_bytes"] == step["json_bytes"]  # the same answers
    mem = row["memory_mib"]
    assert 30 < mem["idle_after_load_rss"] <= mem["load_peak"] < 2000
    assert 30 < mem["after_requests_rss"] <= mem["requests_peak"] < 2000

    md = out.read_text()
    assert "\n### The Attention tab's server\n" in md
    assert "| CPU Attention tab: command | `python scripts/benchmark.py --device cpu" in md
    p50 = lat["step_cold"]["p50_ms"]
    assert re.search(rf"^\| tiny \| 3 × 2 \| [0-9.]+ \| [^|]+ \| [^|]+ \| "
                     rf"{re.escape(f'{p50:,.1f}' if p50 < 100 else f'{p50:,.0f}')} \(", md,
                     flags=re.M)
    assert "4 of 4 equal" in md


def test_viewer_options(monkeypatch, tmp_path, capsys):
    """The viewer's options: defaults (quick ones with --quick), steps x probes parsed, a
    bad one refused before any work."""
    args = bench_main.parse_args(["--sections", "viewer"])
    bench_main.resolve_defaults(args, "cpu")
    assert args.viewer_size_list == ["tiny", "small"]
    assert args.viewer_log_list == [(10, 1), (100, 10)] and args.viewer_requests == 20
    args = bench_main.parse_args(["--quick", "--viewer-logs", "2x1, 5×3"])
    bench_main.resolve_defaults(args, "cpu")
    assert args.viewer_log_list == [(2, 1), (5, 3)] and args.viewer_size_list == ["tiny"]
    assert "viewer" not in bench_main.parse_args([]).section_set  # never by default
    for bad in (["--viewer-logs", "100"], ["--viewer-logs", "0x3"], ["--viewer-requests", "0"]):
        with pytest.raises(SystemExit):
            bench_main.parse_args(bad)
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench_main, "measure", lambda *a: pytest.fail("measured a bad size"))
    with pytest.raises(SystemExit) as exit_:
        bench_main.main(["--sections", "viewer", "--viewer-sizes", "huge",
                         "--out", str(tmp_path / "x.md")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --viewer-sizes: no model size 'huge'")


# --------------------------------------------------------------------------- scale
def _gz_lines(path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _expected_train(shared_data, lang: str, pairs: int) -> list[str]:
    """The train side the section should write: Multi30k's, copy k >= 1 marked ``r<k>``."""
    base = _gz_lines(shared_data / "multi30k" / f"train.{lang}.gz")
    return [base[i % len(base)] + (f" r{i // len(base)}" if i >= len(base) else "")
            for i in range(pairs)]


def _kept_by_the_filters(folder, cache_entry, pairs: int) -> dict[str, int]:
    """What the data config's filters leave of the written train split, counted here with
    sentencepiece itself on the cache's model: NFKC + whitespace, no empty side, at most
    128 pieces a side, the longer side at most 3x the shorter."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(cache_entry / "tokenizer" / "spm.model"))

    def norm(text: str) -> str:
        return " ".join(unicodedata.normalize("NFKC", text).split())

    src = [norm(x) for x in (folder / "train.de").read_text(encoding="utf-8").splitlines()]
    tgt = [norm(x) for x in (folder / "train.en").read_text(encoding="utf-8").splitlines()]
    assert len(src) == len(tgt) == pairs
    keep = [(s, t) for s, t in zip(src, tgt) if s and t]
    counts = {"empty": pairs - len(keep)}
    lens = [(len(a), len(b)) for a, b in zip(sp.encode([s for s, _ in keep]),
                                             sp.encode([t for _, t in keep]))]
    short = [(a, b) for a, b in lens if a <= 128 and b <= 128]
    counts["max_len"] = len(lens) - len(short)
    ratio = [(a, b) for a, b in short if max(a, b) <= 3.0 * max(1, min(a, b))]
    counts["max_len_ratio"] = len(short) - len(ratio)
    counts["kept"] = len(ratio)
    return counts


@pytest.mark.slow  # two prepare_data.py and two train.py processes, and one more prepare: ~90 s
def test_scale_section_prepares_and_trains_on_repeated_multi30k(shared_data, tmp_path):
    """``--sections scale`` at 2,000 and 20,000 pairs end to end; and, for the independent
    count, the 20,000-pair corpus prepared again here, kept: its files are Multi30k repeated
    with the marker, and the pairs its cache holds are those the filters leave, counted
    with sentencepiece on the cache's model, not by the pipeline."""
    out, js = tmp_path / "b.md", tmp_path / "b.json"
    env = {**os.environ, "TINYMT_SHARED_DATA": str(shared_data)}
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"), "--device", "cpu",
           "--sections", "scale", "--scale-pairs", "20000,2000", "--scale-vocab", "1000",
           "--scale-steps", "8", "--scale-dir", str(tmp_path / "work"),
           "--out", str(out), "--json", str(js)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "work").iterdir()) == []  # corpora and caches removed
    res = json.loads(js.read_text())
    scale = res["devices"]["cpu"]["scale"]
    assert scale["settings"]["pairs"] == [2000, 20000] and scale["settings"]["steps"] == 8
    assert scale["settings"]["base_pairs"] == 29000
    small, big = scale["rows"]
    valid_n = len(_gz_lines(shared_data / "multi30k" / "val.de.gz"))
    test_n = len(_gz_lines(shared_data / "multi30k" / "test_2016_flickr.de.gz"))
    for row, n in ((small, 2000), (big, 20000)):
        assert row["pairs"] == n and row["written"] == {"train": n, "valid": valid_n,
                                                        "test": test_n}
        prep, train = row["prepare"], row["train"]
        stats = prep["stats"]
        assert stats["pairs"]["valid"] == valid_n and stats["pairs"]["test"] == test_n
        assert stats["pairs"]["train"] + sum(stats["dropped"]["train"].values()) == n
        assert 0 < prep["seconds"] < 600 and prep["build_seconds"] < prep["seconds"]
        assert 100 < prep["peak_anon_mib"] <= prep["peak_rss_mib"] < 4000
        assert prep["sampled_peak_rss_mib"] <= prep["peak_rss_mib"] + 1
        assert {"sentencepiece", "tokenize"} <= set(prep["phases"])
        assert prep["peak_rss_phase"] in prep["phases"]
        assert train["cache_hit"] and train["steps"] == 8 and train["timed_steps"] == 3
        assert 100 < train["peak_anon_mib"] <= train["peak_rss_mib"] < 4000
        assert 100 < train["before_steps_anon_mib"] <= train["before_steps_rss_mib"] \
            <= train["peak_rss_mib"] + 1
        assert 0 < train["batch_setup_seconds"] < train["seconds_to_first_step"] \
            < train["seconds_to_first_step_done"] < 600
        assert train["tokens_per_s"] == pytest.approx(train["timed_target_tokens"]
                                                      / train["timed_seconds"])
        # a step's target tokens: at most the budget's 2,048, and at least a sentence's
        assert 3 * 5 <= train["timed_target_tokens"] <= 3 * 2048
    assert big["prepare"]["cache_bytes"] > 2 * small["prepare"]["cache_bytes"]
    assert big["prepare"]["cache_disk_bytes"] > 2 * small["prepare"]["cache_disk_bytes"]
    assert big["train_bytes"] > 9 * small["train_bytes"]

    # the 20,000-pair corpus again, kept: written as the test expects, counted independently
    folder, cache = tmp_path / "corpus", tmp_path / "cache"
    written = write_corpus(shared_data / "multi30k", folder, 20000)
    assert written["pairs"] == big["written"] and written["train_bytes"] == big["train_bytes"]
    for lang in ("de", "en"):
        assert (folder / f"train.{lang}").read_text(encoding="utf-8").splitlines() \
            == _expected_train(shared_data, lang, 20000)
    cache.mkdir()
    prep = measure_prepare(folder, cache, 1000)
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    counts = _kept_by_the_filters(folder, entry, 20000)
    assert prep["stats"] == big["prepare"]["stats"]  # the same corpus, the same cache
    assert prep["stats"]["pairs"]["train"] == counts["kept"]
    assert prep["stats"]["dropped"]["train"] == {k: counts[k] for k in
                                                 ("empty", "max_len", "max_len_ratio")}
    files = sorted((entry / "splits" / "train").glob("*.arrow"))
    assert files and sum(pa.ipc.open_stream(pa.memory_map(str(f))).read_all().num_rows
                         for f in files) == counts["kept"]

    md = out.read_text()
    assert "\n### Memory and time against corpus size\n" in md
    assert "| CPU corpus size: command | `python scripts/benchmark.py --device cpu" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| 20,000 |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[2] == f"{big['prepare']['peak_rss_mib']:,.0f}"
    assert cells[11] == f"{big['train']['tokens_per_s']:,.0f}"
    assert cells[12] == big["prepare"]["peak_rss_phase"]
    assert any(ln.startswith("| growth 10.0× |") for ln in md.splitlines())
    names = [t["target"] for t in res["targets"]]
    assert "prepare_data.py peak RSS ≤ 2 GB at 3 M pairs" in names
    assert all(t["met"] is None for t in res["targets"] if "at 3 M pairs" in t["target"])


def test_scale_pairs_corpus_and_phases(shared_data, tmp_path):
    """--scale-pairs parsed; a corpus one copy and a bit: the second copy marked; samples
    go to the innermost step open at their time."""
    assert parse_pairs("3000000, 300_000") == [300000, 3000000]
    for bad in ("", "12", "3e6", "1,x"):
        with pytest.raises(ValueError):
            parse_pairs(bad)
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--scale-pairs", "10"])
    args = bench_main.parse_args(["--sections", "scale"])
    assert args.scale_pair_list == [300000, 3000000] and args.scale_vocab == 8000
    written = write_corpus(shared_data / "multi30k", tmp_path / "c", 29003)
    assert written["pairs"]["train"] == 29003
    for lang in ("de", "en"):
        assert (tmp_path / "c" / f"train.{lang}").read_text(encoding="utf-8").splitlines() \
            == _expected_train(shared_data, lang, 29003)
    run = Run(marks=[(1.0, ["begin", "a"]), (2.0, ["begin", "b"]), (3.0, ["end", "b"]),
                     (4.0, ["end", "a"]), (5.0, ["begin", "a"]), (5.5, ["end", "a"])],
              samples=[(0.5, 100 * 1024, 50 * 1024), (1.5, 200 * 1024, 60 * 1024),
                       (2.5, 300 * 1024, 70 * 1024), (5.2, 250 * 1024, 90 * 1024)])
    ph = phases(run)
    assert ph["a"] == {"seconds": 3.5, "peak_rss_mib": 250, "peak_anon_mib": 90}
    assert ph["b"] == {"seconds": 1.0, "peak_rss_mib": 300, "peak_anon_mib": 70}
    assert ph["other"]["peak_rss_mib"] == 100


def test_scale_targets_hold_at_3m_pairs_and_growth():
    def row(pairs, prep_s, prep_mib, train_mib):
        return {"pairs": pairs, "prepare": {"seconds": prep_s, "peak_rss_mib": prep_mib},
                "train": {"peak_rss_mib": train_mib}}
    scale = {"rows": [row(300000, 30, 1000, 900), row(3000000, 320, 1600, 1400)]}
    got = scale_targets({"cpu": {"scale": scale}, "cuda": None})
    assert [(t["measured"], t["met"]) for t in got] == [
        ("1,600 MiB", True), ("1,400 MiB", True), ("1.60×", False), ("1.56×", False),
        ("10.67×", True)]
    assert got[0]["where"] == "CPU, 3,000,000 pairs"
    assert got[-1]["target"].endswith("(≤ 11.0× for 10.0× the pairs)")
    scale["rows"][1]["prepare"]["seconds"] = 340  # 11.3x the time for 10x the data
    assert scale_targets({"cpu": {"scale": scale}})[-1]["met"] is False


# --------------------------------------------------------------------------- the peer
def cfg(**kw):
    base = {"d_model": 32, "n_heads": 4, "n_encoder_layers": 2, "n_decoder_layers": 2,
            "d_ff": 64, "dropout": 0.0, "max_positions": 64}
    return ModelConfig(**{**base, **kw})


def pair(seed=0, vocab=(40, 40), shared=True, dtype=torch.float64, **kw):
    torch.manual_seed(seed)
    ours = Transformer(cfg(**kw), vocab[0], vocab[1], shared).to(dtype).eval()
    peer = PeerTransformer(cfg(**kw), vocab[0], vocab[1], shared).to(dtype).eval()
    return ours, peer


def batch(B=3, S=7, T=6, vocab=40):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (B, S), generator=g)
    src[1, 5:] = 0
    src[2, 2:] = 0
    tgt = torch.randint(4, vocab, (B, T), generator=g)
    tgt[:, 0] = 2
    tgt[2, 4:] = 0
    return src, tgt


@pytest.mark.parametrize("options", [
    {},
    {"norm_first": False},
    {"shared": False, "vocab": (40, 30)},
    {"tie_embeddings": False, "activation": "gelu", "positional": "learned"},
])
def test_peer_has_our_parameters_and_computes_our_function(options):
    options = dict(options)
    shared, vocab = options.pop("shared", True), options.pop("vocab", (40, 40))
    ours, peer = pair(vocab=vocab, shared=shared, **options)
    n_ours, n_peer = count_parameters(ours), count_parameters(peer)
    assert n_ours == n_peer  # the same architecture, parameter for parameter
    peer.load_from_ours(ours)
    src, tgt = batch(vocab=min(vocab))
    logits, attn = peer(src, tgt)
    assert attn is None
    assert logits.shape == (3, 6, vocab[1])
    expected, _ = ours(src, tgt)
    torch.testing.assert_close(logits, expected, atol=1e-9, rtol=0)
    memory, _ = peer.encode(src)
    step_logits, _ = peer.decode(tgt, memory, src.eq(0))
    torch.testing.assert_close(step_logits, expected, atol=1e-9, rtol=0)


def test_training_flops_match_torchs_flop_counter():
    """The benchmark's FLOP count (share of peak) against torch's own FlopCounterMode on a
    forward pass of our model: equal on an unpadded batch (x3 for forward + backward); on a
    padded one the count is smaller (padding is not counted), and equals the sum of its
    sentences counted one by one."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = ModelConfig(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=3, d_ff=24,
                      dropout=0.0, max_positions=32)
    torch.manual_seed(0)
    model = Transformer(cfg, 50, 50, shared_vocab=True)
    src, tgt = torch.randint(4, 50, (3, 7)), torch.randint(4, 50, (3, 6))
    b = collate(src.tolist(), tgt.tolist())
    with FlopCounterMode(display=False) as counter:  # the weights' path: attention as matmuls
        model(b.src, b.tgt_in, need_weights=True)  # (it has no formula for CPU flash SDPA)
    assert training_flops(cfg, 50, b, 0) == 3 * counter.get_total_flops()
    ragged = collate([src[0, :3].tolist(), src[1].tolist()], [tgt[0].tolist(), tgt[1, :2].tolist()])
    one_by_one = sum(training_flops(cfg, 50, collate([s], [t]), 0) for s, t in
                     [(src[0, :3].tolist(), tgt[0].tolist()), (src[1].tolist(), tgt[1, :2].tolist())])
    assert training_flops(cfg, 50, ragged, 0) == one_by_one
    with FlopCounterMode(display=False) as counter:
        model(ragged.src, ragged.tgt_in, need_weights=True)
    assert training_flops(cfg, 50, ragged, 0) < 3 * counter.get_total_flops()


def varied_pair(seed):
    """``pair`` with our weights scrambled (freshly initialised tiny models emit one token
    over and over) and copied into the peer: varied outputs, some ending early at EOS."""
    ours, peer = pair(seed=seed)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in ours.parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.mul_(1 + 2 * noise).add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    unloaded = greedy_decode(peer, batch()[0], max_len_a=0.0, max_len_b=8, use_cache=False)
    return ours, peer.load_from_ours(ours), unloaded


@pytest.mark.parametrize("seed", [0, 1])
def test_peer_driven_by_greedy_decode_matches_ours(seed):
    """The benchmark's peer row: ``greedy_decode(peer, use_cache=False)`` -- recompute the
    prefix, project the last position -- gives our tokens when the weights are ours."""
    ours, peer, unloaded = varied_pair(seed)
    src, _ = batch()
    kw = {"max_len_a": 0.0, "max_len_b": 8}
    outs = greedy_decode(peer, src, use_cache=False, **kw)
    assert len(outs) == 3 and all(isinstance(o, list) and len(o) <= 8 for o in outs)
    assert all(t not in (0, 2) for o in outs for t in o)  # never pad or bos
    assert len({tuple(o) for o in outs}) >= 2  # not the same output throughout
    assert outs == greedy_decode(ours, src, **kw)
    assert outs == greedy_decode(ours, src, use_cache=False, **kw)
    assert unloaded != outs  # other weights, other tokens: the comparison can fail
    assert not peer.training  # greedy_decode restores the mode; it was eval


def test_peer_beam_search_matches_ours():
    ours, peer, _ = varied_pair(1)
    src, _ = batch()
    hyps = beam_search(peer, src, beam=3, max_len_a=0.0, max_len_b=6, use_cache=False)
    ref = beam_search(ours, src, beam=3, max_len_a=0.0, max_len_b=6)
    assert [h[0][0] for h in hyps] == [h[0][0] for h in ref]
    for h, r in zip(hyps, ref):
        assert h[0][1] == pytest.approx(r[0][1], abs=1e-9)


def test_peer_last_only_needs_no_target_mask():
    """With ``last_only`` the peer passes no target padding mask (nn.MultiheadAttention's
    causal fast path); padding only trails, so unpadded rows' last logits are unchanged."""
    ours, peer = pair()
    peer.load_from_ours(ours)
    src, tgt = batch()
    memory, _ = peer.encode(src)
    last, _ = peer.decode(tgt, memory, src.eq(0), last_only=True)
    full, _ = ours.decode(tgt, memory, src.eq(0))
    assert last.shape == (3, 40)
    unpadded = tgt[:, -1].ne(0)
    assert unpadded.tolist() == [True, True, False]
    torch.testing.assert_close(last[unpadded], full[unpadded, -1], atol=1e-9, rtol=0)


def test_bench_decode_once_counts_the_same_tokens_for_every_method():
    ours, peer, _ = varied_pair(0)
    src, _ = batch()
    rows = [[t for t in r if t] for r in src.tolist()]
    batches = [collate(rows, [[] for _ in rows])]
    for beam in (1, 3):
        counts = {decode_once(m, cache, beam, batches, 0.0, 5)
                  for m, cache in ((ours, True), (ours, False), (peer, False))}
        assert len(counts) == 1 and counts.pop() > 0


def test_ctranslate2_rows_with_a_trained_run(tiny_run, tmp_path):
    """``--run`` with the ct2 extra: CTranslate2 float32 and int8 rows beside ours, each with
    its BLEU; greedy float32 translates every sentence exactly as ours; the report shows
    them and the int8 BLEU target."""
    pytest.importorskip("ctranslate2", reason="the optional extra .[ct2] (make test installs it)")
    data, info = load_data(str(tmp_path / "no-multi30k"), str(tmp_path / "cache"), quick=True)
    args = argparse.Namespace(run=str(tiny_run), checkpoint="best", sentences=12,
                              batch_tokens=4096, decode_repeats=1)
    device = torch.device("cpu")
    dec = bench_decoding(args, device, data, info, MemoryMeter(device))
    row = dec["sizes"]["trained (tiny)"]
    for search in ("greedy", "beam5"):
        assert set(row[search]) == {*METHODS, "ct2_float32", "ct2_int8"}
        for e in row[search].values():
            assert e["sentences_per_s"] > 0 and 0 <= e["bleu"] <= 100
            assert "outputs" not in e  # scored, then dropped
        assert row[search]["ct2_int8"]["identical_to_ct2_float32"] >= 0
    assert row["greedy"]["ct2_float32"]["identical_to_ours"] == 12  # the same search
    for search in ("greedy", "beam5"):  # ours by CTranslate2's rule: token for token
        assert row[search]["ct2_float32"]["identical_to_ours_full_rule"] == 12
    assert row["greedy"]["peer"]["identical_to_ours"] == 12
    assert {"greedy_ct2_float32_over_cache", "beam5_ct2_int8_over_cache"} <= set(row["ratios"])
    md = "\n".join(render_decoding("cpu", dec, "a CPU"))
    assert "| trained (tiny) | greedy | CTranslate2, float32 |" in md
    assert "| trained (tiny) | beam5 | CTranslate2, int8 |" in md
    assert "| model | search | float32 / ours | int8 / ours |" in md
    targets = evaluate_targets({"cpu": {"training": {"sizes": {}}, "decoding": dec}})
    assert any(t["target"].startswith("CTranslate2 int8 costs") for t in targets)


def test_report_puts_each_measured_number_in_its_row():
    """The renderer writes, for each size of the committed JSON, that size's own training
    numbers into that size's row (read from the JSON, not from a report it wrote)."""
    res = json.loads((REPO_ROOT / "docs" / "benchmarks.json").read_text())
    md = render_markdown(res).splitlines()
    sizes = res["devices"]["cpu"]["training"]["sizes"]
    assert sizes
    for size, row in sizes.items():
        lines = [ln for ln in md if ln.startswith(f"| {size} | {row['params'] / 1e6:.2f} M |")]
        assert len(lines) == 1, size
        cells = [c.strip() for c in lines[0].split("|")[1:-1]]
        ours, plain, peer = (row[k]["tokens_per_s"] for k in ("ours", "plain", "peer"))
        assert cells[2] == f"{ours:,.0f}"
        assert cells[3] == f"{plain:,.0f}"
        assert cells[4] == f"**{ours / plain:.2f}×**"
        assert cells[5] == f"{peer:,.0f}"
        assert cells[6] == f"**{ours / peer:.2f}×**"
        assert cells[8] == f"{row['ours']['share_of_peak'] * 100:.0f}%"


def test_peer_refuses_what_it_cannot_do():
    _, peer = pair()
    src, tgt = batch()
    with pytest.raises(TinyMTError, match="attention weights"):
        peer(src, tgt, need_weights=True)
    ours_big = Transformer(cfg(d_model=64), 40, 40, True)
    with pytest.raises(TinyMTError, match="does not match"):
        peer.load_from_ours(ours_big)
