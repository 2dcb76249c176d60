"""The benchmark's measurements against independent references, its nn.Transformer peer
against our model, and runs of scripts/benchmark.py itself."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from conftest import REPO_ROOT
from tinymt.bench.measure import (
    MIB,
    MemoryMeter,
    matmul_peak,
    proc_status,
    process_tree,
    tensor_mib,
    timed,
    training_flops,
)

CPU = torch.device("cpu")


# --------------------------------------------------------------------------- measurements
def test_training_flops_of_a_tiny_model_match_a_hand_count():
    cfg = SimpleNamespace(d_model=4, d_ff=8, n_encoder_layers=1, n_decoder_layers=1)
    src = torch.tensor([[5, 6, 7, 0]])  # 3 source tokens and a pad
    tgt_out = torch.tensor([[5, 3, 0]])  # 2 target tokens and a pad; vocabulary 10
    # by hand, a (m, k) @ (k, n) matmul being 2 m k n, over the real tokens only:
    encoder = (4 * 2 * 3 * 4 * 4  # Q, K, V, O of 3 tokens
               + 2 * 3 * 4 * 8 + 2 * 3 * 8 * 4  # the feed-forward's two matmuls
               + 2 * (2 * 3 * 3 * 4))  # scores and weighted sum, 3 x 3
    decoder = (4 * 2 * 2 * 4 * 4  # self-attention's Q, K, V, O of 2 tokens
               + 2 * 2 * 2 * 4 * 4 + 2 * 2 * 3 * 4 * 4  # cross: Q, O of 2; K, V of 3
               + 2 * 2 * 4 * 8 + 2 * 2 * 8 * 4  # feed-forward
               + 2 * (2 * 2 * 2 * 4) + 2 * (2 * 2 * 3 * 4))  # self 2 x 2, cross 2 x 3
    output = 2 * 2 * 4 * 10
    assert (encoder, decoder, output) == (912, 992, 160)
    # forward + backward = 3 x forward
    assert training_flops(cfg, 10, src, tgt_out, pad_id=0) == 3 * (912 + 992 + 160)


def test_matmul_peak_agrees_with_a_timed_reference_matmul():
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm
    best = min(_seconds(lambda: a @ b) for _ in range(5))
    reference = 2 * n**3 / best
    peak = statistics.median(matmul_peak(CPU, repeats=3))
    assert reference / 5 < peak < reference * 5, (peak / 1e9, reference / 1e9)


def _seconds(work) -> float:
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def test_memory_meter_sees_the_memory_a_measurement_touches():
    meter = MemoryMeter(CPU)

    def work() -> float:
        x = torch.ones(64 * MIB // 4)  # 64 MiB of float32, written
        return float(x[-1])

    result, seconds, mib = timed(work, meter)
    if mib is None:
        pytest.skip("/proc/self/clear_refs refused here")
    assert result == 1.0 and seconds > 0
    assert 56 < mib < 160, mib
    _, _, little = timed(lambda: sum(range(1000)), meter)  # the peak was reset
    assert little < 16, little


def test_process_tree_and_status_read_a_child():
    child = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); input()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"  # the interpreter is running
        assert child.pid in process_tree(os.getpid())
        assert proc_status(child.pid)["VmRSS"] > 1000  # KiB: a Python interpreter
    finally:
        child.kill()
        child.wait()
    assert proc_status(child.pid) == {}  # gone


def test_tensor_mib_counts_a_tied_weight_once():
    w, b = torch.zeros(256, 1024), torch.zeros(1024)  # 1 MiB and 4 KiB of float32
    assert tensor_mib([w, w, b]) == pytest.approx(1 + 1 / 256)


# --------------------------------------------------------------------------- the peer
def pair(dtype=torch.float64, vocab=(40, 40), shared=True, **options):
    from tinymt.bench.peer import PeerTransformer
    from tinymt.config import ModelConfig
    from tinymt.model import Transformer

    cfg = ModelConfig(**{"d_model": 16, "n_heads": 2, "n_encoder_layers": 2,
                         "n_decoder_layers": 2, "d_ff": 32, "dropout": 0.1,
                         "max_positions": 32, **options})
    torch.manual_seed(0)
    ours = Transformer(cfg, *vocab, shared_vocab=shared).to(dtype).eval()
    return ours, PeerTransformer.copy_of(ours).to(dtype).eval()


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
    from tinymt.model import count_parameters

    ours, peer = pair(**options)
    assert count_parameters(ours) == count_parameters(peer)
    src, tgt = batch(vocab=min(options.get("vocab", (40,))))
    hidden, attn = peer(src, tgt)
    expected, _ = ours(src, tgt)
    assert attn is None and hidden.shape == (3, 6, 16)
    real = tgt.ne(0)  # padded positions' states are nobody's business
    torch.testing.assert_close(hidden[real], expected[real], atol=1e-9, rtol=0)
    torch.testing.assert_close(peer.logits(hidden), ours.logits(hidden))


def scrambled_pair():
    """Our weights scrambled (fresh tiny models repeat one token), copied into the peer."""
    ours, _ = pair()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(1 + 2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    from tinymt.bench.peer import PeerTransformer
    return ours, PeerTransformer.copy_of(ours).to(torch.float64).eval()


@pytest.mark.parametrize("beam", [1, 5])
def test_the_peers_recompute_loop_translates_as_our_kv_cache(beam):
    from tinymt.decoding import translate_ids

    ours, peer = scrambled_pair()
    src_ids = [[t for t in row if t] for row in batch()[0].tolist()]
    kw = {"beam": beam, "max_len_a": 0.0, "max_len_b": 8}
    theirs = translate_ids(peer, src_ids, use_cache=False, **kw)
    mine = translate_ids(ours, src_ids, use_cache=True, **kw)
    assert [h[0][0] for h in theirs] == [h[0][0] for h in mine]
    assert len({tuple(h[0][0]) for h in mine}) >= 2  # varied outputs: the check can fail
    if beam > 1:
        assert [h[0][1] for h in theirs] == pytest.approx([h[0][1] for h in mine], rel=1e-5)


def test_the_three_training_steps_compute_the_same_loss():
    """ours (bit dropout, the fused loss), plain, peer: the same loss from the same weights
    with dropout off, so the race compares the same work."""
    from tinymt.batching import collate
    from tinymt.bench.train_speed import _step, contenders

    ours, peer = pair(dtype=torch.float32)
    src, tgt = batch()
    b = collate([[t for t in r if t] for r in src.tolist()],
                [[t for t in r if t][1:] for r in tgt.tolist()])
    racers = contenders(ours, peer, compile_=False, device=CPU)
    for c in racers.values():
        c.model.eval()  # use_bit_dropout's new modules start in training mode
    losses = {name: float(_step(c, b, 0, CPU)) for name, c in racers.items()}
    assert losses["ours"] == pytest.approx(losses["plain"], rel=1e-5)
    assert losses["peer"] == pytest.approx(losses["plain"], rel=1e-5)


def test_peer_refuses_what_it_cannot_do():
    from tinymt.errors import TinyMTError
    _, peer = pair()
    with pytest.raises(TinyMTError, match="attention weights"):
        peer(*batch(), need_weights=True)
    bigger, _ = pair(d_model=32)
    with pytest.raises(TinyMTError, match="does not match"):
        peer.load_from_ours(bigger)


# --------------------------------------------------------------------------- the script
def benchmark(*args: str, cwd=REPO_ROOT, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def test_help_and_bad_input(capsys, monkeypatch, tmp_path):
    from tinymt.bench import main as bench_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        bench_main.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--sections" in out and "--merge" in out
    monkeypatch.setattr(bench_main, "measure", lambda *a: pytest.fail("measured bad input"))
    for bad in (["--steps", "0"], ["--sections", "training,viewer"], ["--device", "tpu"],
                ["--serve-clients", "1,x"], ["--sizes", "huge"], ["--merge", "absent.json"]):
        with pytest.raises(SystemExit) as exit_:
            bench_main.main(["--device", "cpu", "--out", str(tmp_path / "r.md"), *bad])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err


def test_docs_are_written_from_a_clean_working_tree_only(monkeypatch, tmp_path, capsys):
    from tinymt.bench import main as bench_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench_main, "uncommitted_changes", lambda: ["src/tinymt/model.py"])
    monkeypatch.setattr(bench_main, "measure", lambda *a: pytest.fail("measured first"))
    docs = {p: p.read_bytes() for p in (REPO_ROOT / "docs").glob("benchmarks*")}
    with pytest.raises(SystemExit) as exit_:
        bench_main.main(["--quick", "--device", "cpu", "--out", str(REPO_ROOT / "docs" / "x.md")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "src/tinymt/model.py" in err
    assert {p: p.read_bytes() for p in (REPO_ROOT / "docs").glob("benchmarks*")} == docs


@pytest.mark.slow  # the built-in corpus prepared, two tiny races: ~1 min on 2 cores
def test_a_quick_run_measures_every_row_and_merge_keeps_the_rest(tmp_path):
    common = ["--quick", "--device", "cpu", "--steps", "2", "--warmup", "0", "--sentences",
              "6", "--data-path", str(tmp_path / "no-multi30k"), "--cache-dir",
              str(tmp_path / "cache")]
    first = benchmark(*common, "--out", "a.md", "--json", "a.json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    res = json.loads((tmp_path / "a.json").read_text())["devices"]["cpu"]
    row = res["training"]["sizes"]["tiny"]
    for name in ("ours", "plain", "peer"):
        assert row[name]["tokens_per_s"] > 0 and 0 < row[name]["share_of_peak"] < 2
    dec = res["decoding"]["sizes"]["tiny"]
    for search in ("greedy", "beam5"):  # random models decode a fixed length: equal work
        tokens = {m: e["output_tokens"] for m, e in dec[search].items()}
        assert set(tokens) == {"ours_cache", "ours_nocache", "peer"}
        assert len(set(tokens.values())) == 1 and tokens["peer"] > 0
    md = (tmp_path / "a.md").read_text()
    assert any(line.startswith("| tiny |") and f"{row['ours']['tokens_per_s']:,.0f}" in line
               for line in md.splitlines())  # the row exists, with its own numbers
    second = benchmark(*common, "--sections", "decoding", "--merge", "a.json", "--out", "b.md",
                       "--json", "b.json", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    merged = json.loads((tmp_path / "b.json").read_text())["devices"]["cpu"]
    assert merged["training"] == res["training"] and merged["decoding"] != res["decoding"]


@pytest.mark.slow  # four servers and the CTranslate2 child: ~1 min on 2 cores
def test_a_trained_run_decodes_with_ct2_and_serves(tiny_run, tmp_path):
    pytest.importorskip("ctranslate2", reason="the optional extra .[ct2] (make test installs it)")
    proc = benchmark("--device", "cpu", "--sections", "decoding,serve", "--run", str(tiny_run),
                     "--sizes", "tiny", "--sentences", "12", "--serve-clients", "1,4",
                     "--serve-requests", "8", "--out", "r.md", "--json", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())["devices"]["cpu"]
    [row] = res["decoding"]["sizes"].values()
    greedy = row["greedy"]
    assert set(greedy) == {"ours_cache", "ours_nocache", "peer", "ct2_float32", "ct2_int8"}
    # the same search, the same weights: the same translations
    for method in ("ours_nocache", "peer", "ct2_float32"):
        assert greedy[method]["identical_to_ours"] == 12, method
    assert greedy["ct2_float32"]["bleu"] == pytest.approx(greedy["ours_cache"]["bleu"])
    rows = res["serve"]["rows"]
    assert {(r["engine"], r["method"], r["clients"]) for r in rows} == {
        (e, m, c) for e in ("torch", "ct2") for m in ("one_at_a_time", "micro_batching")
        for c in (1, 4)}
    for r in rows:  # every answer arrived, and each equals the sentence translated alone
        assert r["errors"] == 0 and r["equal_to_one_at_a_time"] == r["requests"] == 8
        assert r["p50_ms"] <= r["p99_ms"] and r["server_rss_mib"] > 50
    assert res["serve"]["ct2_equal_to_torch"] == res["serve"]["settings"]["sentences"]
