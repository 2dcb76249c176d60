"""The benchmark's numbers against references that do not share its code: the FLOP count
against torch's FlopCounterMode, the timing harnesses against workloads of known duration,
the peer against our model with the same weights, the decoding rows against the core's
searches; and one run of scripts/benchmark.py itself."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import forked
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from conftest import NO_CT2, REPO_ROOT
from tinymt.bench import measure
from tinymt.bench.measure import MIB, MemoryMeter, proc_status, tensor_mib, timed

CPU = torch.device("cpu")


def small_config(**options):
    from tinymt.config import ModelConfig
    return ModelConfig(**{"d_model": 16, "n_heads": 2, "n_encoder_layers": 2,
                          "n_decoder_layers": 2, "d_ff": 32, "dropout": 0.1,
                          "max_positions": 32, **options})


class Clock:
    """``time.perf_counter`` for tinymt.bench.measure: time passes only when a workload
    says how long it took, so every rate the harness reports is known exactly."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def one_thread():
    """Models of a few thousand weights: a second thread only waits, the more so on a
    loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=c))
    return c


# --------------------------------------------------------------------------- FLOPs
# distinct widths, so that a term with one width in place of another is off
FLOP_CFG = small_config(n_encoder_layers=1, n_decoder_layers=2, d_ff=40, dropout=0.0)
FLOP_VOCAB = (40, 2**17)  # source, target: the output projection is the target's, ~8 MiB
PAIR_A = ((5, 6, 7, 8, 9), (5, 6, 7))  # 6 source tokens with EOS, 4 target tokens
PAIR_B = ((5, 6), (8,))  # padded in both, in a batch with PAIR_A


@functools.cache
def counted_flops(pair: tuple[tuple[int, ...], tuple[int, ...]]) -> int:
    """torch's own count of a training step's FLOPs (forward, then backward from the
    logits) on one pair alone (no padding), our model of FLOP_CFG."""
    from tinymt.batching import collate
    from tinymt.model import Transformer

    model = Transformer(FLOP_CFG, *FLOP_VOCAB, shared_vocab=False)
    b = collate([list(pair[0])], [list(pair[1])])
    with FlopCounterMode(display=False) as counter:
        # the attention written out: the counter does not see the CPU's fused kernel
        hidden, _ = model(b.src, b.tgt_in, need_weights=True)
        model.logits(hidden).sum().backward()
    return counter.get_total_flops()


def test_training_flops_are_torchs_count_on_the_real_tokens():
    from tinymt.batching import collate

    b = collate([list(PAIR_A[0]), list(PAIR_B[0])], [list(PAIR_A[1]), list(PAIR_B[1])])
    assert b.src.eq(0).any() and b.tgt_out.eq(0).any()  # padding, which must not count
    assert measure.training_flops(FLOP_CFG, FLOP_VOCAB[1], b.src, b.tgt_out, pad_id=0) == (
        counted_flops(PAIR_A) + counted_flops(PAIR_B))


# --------------------------------------------------------------------------- timing
def test_matmul_peak_is_the_flops_of_each_timed_matmul_after_two_warm_ups(clock, monkeypatch):
    n, seconds = 64, iter([50.0, 50.0, 0.5, 0.25, 2.0])  # what each matmul takes

    def mm(a, b, out):
        assert a.shape == b.shape == out.shape == (n, n)
        clock.advance(next(seconds))

    monkeypatch.setattr(torch, "mm", mm)
    assert measure.matmul_peak(CPU, repeats=3, n=n) == pytest.approx(
        [2 * n**3 / s for s in (0.5, 0.25, 2.0)], rel=1e-9)


def test_the_harness_clock_is_wall_time(monkeypatch):
    """The real clock: a sleep of a known length, timed by ``timed`` and as the matmul of
    ``matmul_peak``. A sleep lasts at least its length; a loaded machine may add to it."""
    nap = 0.03
    result, seconds, _ = timed(lambda: time.sleep(nap) or "done", MemoryMeter(CPU))
    assert result == "done" and nap <= seconds < nap + 0.5
    monkeypatch.setattr(torch, "mm", lambda a, b, out: time.sleep(nap))
    for flops in measure.matmul_peak(CPU, repeats=2, n=8):
        assert 2 * 8**3 / (nap + 0.5) < flops <= 2 * 8**3 / nap


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


def test_status_reads_a_child():
    child = subprocess.Popen([sys.executable, "-c", "print('up', flush=True); input()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"  # the interpreter is running
        assert proc_status(child.pid)["VmRSS"] > 1000  # KiB: a Python interpreter
    finally:
        child.kill()
        child.wait()
    assert proc_status(child.pid) == {}  # gone


def test_tensor_mib_counts_a_tied_weight_once():
    w, b = torch.zeros(256, 1024), torch.zeros(1024)  # 1 MiB and 4 KiB of float32
    assert tensor_mib([w, w, b]) == pytest.approx(1 + 1 / 256)


# --------------------------------------------------------------------------- training rows
class FakeData:
    """What the benchmark reads of a PreparedData: the same pairs for every split."""

    def __init__(self, src: list[list[int]], tgt: list[list[int]]):
        self.src, self.tgt = src, tgt
        self.tgt_tokenizer = SimpleNamespace(pad_id=0)
        self.splits = {"test": range(len(src))}  # its len() is what is read

    def lengths(self, split: str) -> tuple[list[int], list[int]]:
        return [len(s) for s in self.src], [len(t) for t in self.tgt]

    def ids(self, split: str) -> tuple[list[list[int]], list[list[int]]]:
        return self.src, self.tgt


def test_training_rows_report_a_known_workloads_rate_share_and_memory(clock, monkeypatch):
    """Each timed step takes ``its target tokens / rate`` seconds, the rate known for what
    the step runs (our model with bit dropout and the fused loss, our model plain, the
    peer) and the round, and writes 32 MiB; warm-up steps (and round 1's untimed pass over
    the timed batches) are real steps (the optimizer's state) that take 1,000 s and must not
    be timed; the matmul peak's runs are given."""
    from tinymt.bench import train_speed
    from tinymt.bench.peer import PeerTransformer
    from tinymt.model import Transformer
    from tinymt.speed import BitDropout, linear_cross_entropy

    rates = {"ours": [3000.0, 2000.0, 4500.0], "plain": [1500.0, 1000.0, 1200.0],
             "peer": [900.0, 400.0, 600.0]}  # target tokens/s in rounds 1, 2, 3
    P = 4e9
    peaks = iter([[P, 3 * P, P / 3], [P, 2 * P, P / 2], [P, P, 5 * P]])  # median P, mean not
    warmup, steps, repeats = 1, 2, 3
    calls, losses, real_step = {}, {}, train_speed._step

    def runs(c) -> str:
        if isinstance(c.model, PeerTransformer):
            return "peer"
        bits = any(isinstance(m, BitDropout) for m in c.model.modules())
        return {(True, True): "ours", (False, False): "plain"}[
            bits, c.loss_fn is linear_cross_entropy]

    def step(c, b, pad, device):
        name = runs(c)
        k = calls[id(c)] = calls.get(id(c), -1) + 1  # this contender's k-th step
        first = warmup + 2 * steps  # round 1: warm-up, the timed batches untimed, timed
        rnd, i = (0, k - steps) if k < first else divmod(k - first, warmup + steps)
        rnd += k >= first
        if i < warmup:
            clock.advance(1000.0)
            return real_step(c, b, pad, device) if rnd == 0 else torch.tensor(0.0)
        clock.advance(b.n_tgt_tokens / rates[name][rnd])
        assert float(torch.ones(32 * MIB // 4)[-1]) == 1.0  # 32 MiB written
        losses[name] = 1.0 + k
        return torch.tensor(losses[name])

    monkeypatch.setattr(train_speed, "_step", step)
    monkeypatch.setattr(train_speed, "model_config", lambda size: FLOP_CFG)
    monkeypatch.setattr(measure, "matmul_peak", lambda device: next(peaks))
    monkeypatch.setattr(measure, "machine_info", lambda device, argv: {})  # no git calls
    monkeypatch.setattr(measure, "gc", SimpleNamespace(collect=int))  # ~0.3 s a pass here
    data = FakeData([list(PAIR_A[0])] * 10, [list(PAIR_A[1])] * 10)  # one FLOP count a pair
    args = SimpleNamespace(max_tokens=[20], warmup=warmup, steps=steps, repeats=repeats,
                           sizes=["test"], quick=True)
    info = {"vocab": list(FLOP_VOCAB), "shared_vocab": False}
    out = train_speed.bench_training(args, CPU, data, info, ["--quick"])

    row, flops_per_token = out["sizes"]["test"], counted_flops(PAIR_A) / (len(PAIR_A[1]) + 1)
    assert row["flops_per_target_token"] == pytest.approx(flops_per_token, rel=1e-12)
    assert out["settings"]["matmul_peak_flops"] == P
    params = sum(p.numel() for p in Transformer(FLOP_CFG, *FLOP_VOCAB, False).parameters())
    assert row["params"] == params
    for name, rate in rates.items():
        e = row[name]
        assert e["runs"] == pytest.approx(rate, rel=1e-9)
        assert e["tokens_per_s"] == pytest.approx(statistics.median(rate), rel=1e-9)
        assert e["share_of_peak"] == pytest.approx(
            statistics.median(rate) * flops_per_token / P, rel=1e-9)
        assert e["final_loss"] == losses[name]  # the last timed step's
        weights = 4 * params / MIB  # float32, ~8 MiB; AdamW keeps two more of each
        assert e["peak_mib"] is None or abs(e["peak_mib"] - (3 * weights + 32)) < 6


# --------------------------------------------------------------------------- the peer
def pair(dtype=torch.float64, vocab=(40, 40), shared=True, **options):
    from tinymt.bench.peer import PeerTransformer
    from tinymt.model import Transformer

    torch.manual_seed(0)
    ours = Transformer(small_config(**options), *vocab, shared_vocab=shared).to(dtype).eval()
    return ours, PeerTransformer(ours).to(dtype).eval()


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


def test_the_three_training_steps_compute_the_same_loss(host_reads):
    """ours (bit dropout, the fused loss), plain, peer: the same loss from the same weights
    with dropout off, so the race compares the same work; in training mode, as raced, none
    reads a tensor on the host (conftest's ``host_reads``: on a GPU it would wait)."""
    from tinymt.batching import collate
    from tinymt.bench.train_speed import _step, contenders

    ours, peer = pair(dtype=torch.float32, dropout=0.0)
    src, tgt = batch()
    b = collate([[t for t in r if t] for r in src.tolist()],
                [[t for t in r if t][1:] for r in tgt.tolist()])
    racers = contenders(ours, peer, device=CPU)
    for c in racers.values():
        c.model.train()
    host_reads.clear()
    losses = {name: _step(c, b, 0, CPU) for name, c in racers.items()}
    assert not host_reads
    losses = {name: float(loss) for name, loss in losses.items()}
    assert losses["ours"] == pytest.approx(losses["plain"], rel=1e-5)
    assert losses["peer"] == pytest.approx(losses["plain"], rel=1e-5)


# --------------------------------------------------------------------------- decoding rows
def test_decoding_rows_are_the_cores_translations_at_a_known_pace(clock, monkeypatch):
    """Every method's translations are the core's on our model (greedy: greedy_decode's, beam
    5: beam_search's); the plain loop (ours and the peer) times greedy only; each pass takes
    a known time (the median of three is reported) and writes 16 MiB; each method's untimed
    first pass takes 1,000 s."""
    from tinymt.batching import collate
    from tinymt.bench import decode_speed
    from tinymt.bench.peer import PeerTransformer
    from tinymt.decoding import beam_search, greedy_decode

    ours, _ = pair()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # scrambled: fresh tiny models repeat one token
        for p in ours.parameters():
            p.mul_(1 + 2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    peer = PeerTransformer(ours).to(torch.float64).eval()
    src = [[5, 9, 14], [20, 7, 31, 8, 11], [6, 6], [33, 12, 25, 17, 9, 10]]
    tgt = [[5] * 2, [5] * 5, [5] * 3, [5] * 6]  # the mean length, 4, is the length decoded
    seconds = {"ours_cache": 0.5, "ours_nocache": 2.0, "peer": 4.0}  # greedy; beam 5: x2
    slower = {"greedy": 1.0, "beam5": 2.0}
    pace = [3.0, 1.0, 0.5]  # pass 1, 2, 3: median 1, unlike the first, last and mean
    translations: dict[tuple[str, str], list] = {}
    warmed: set[tuple[str, str]] = set()
    translate_ids = decode_speed.translate_ids

    def one_pass(search, method, outputs):
        if (search, method) not in warmed:  # its untimed first pass: must not be timed
            warmed.add((search, method))
            clock.advance(1000.0)
            return outputs
        done = translations.setdefault((search, method), [])
        done.append(outputs)
        clock.advance(seconds[method] * slower[search] * pace[len(done) - 1])
        assert float(torch.ones(16 * MIB // 4)[-1]) == 1.0  # and 16 MiB written
        return outputs

    def spy_cached(model, src_ids, *, beam, **kw):
        assert model is ours
        hyps = translate_ids(model, src_ids, beam=beam, **kw)
        return one_pass({1: "greedy", 5: "beam5"}[beam], "ours_cache", hyps)

    def spy_plain(model, batch_src, **kw):  # one batch (4,096 tokens): a call is a pass
        assert model in (ours, peer)
        outs = greedy_decode(model, batch_src, **kw)
        return one_pass("greedy", "peer" if model is peer else "ours_nocache", outs)

    monkeypatch.setattr(decode_speed, "translate_ids", spy_cached)
    monkeypatch.setattr(decode_speed, "greedy_decode", spy_plain)
    monkeypatch.setattr(decode_speed, "model_config", lambda size: None)
    monkeypatch.setattr(decode_speed, "build_pair", lambda cfg, info, device: (ours, peer))
    monkeypatch.setattr(measure, "machine_info", lambda device, argv: {})  # no git calls
    monkeypatch.setattr(measure, "gc", SimpleNamespace(collect=int))  # ~0.3 s a pass here
    args = SimpleNamespace(sentences=10, run=None, sizes=["test"], decode_repeats=3, quick=True)
    out = decode_speed.bench_decoding(args, CPU, FakeData(src, tgt), {}, ["--quick"])

    padded = collate(src, [[] for _ in src]).src
    core = {"greedy": greedy_decode(ours, padded, max_len_a=0.0, max_len_b=4),
            "beam5": [h[0][0] for h in beam_search(ours, padded, beam=5, max_len_a=0.0,
                                                   max_len_b=4)]}
    assert len({tuple(t) for t in core["greedy"]}) >= 2  # varied: the check can fail
    row = out["sizes"]["test"]
    assert set(row) == set(core)
    assert set(row["greedy"]) == set(seconds) and set(row["beam5"]) == {"ours_cache"}
    by_length = sorted(range(len(src)), key=lambda i: len(src[i]))  # the batch's order
    for search, entries in row.items():
        for method, e in entries.items():
            if method == "ours_cache":  # translate_ids' hypotheses, the best of each
                got = [[h[0][0] for h in hyps] for hyps in translations[search, method]]
                assert got == [core[search]] * 3, (search, method)
            else:
                want = [core[search][i] for i in by_length]
                assert translations[search, method] == [want] * 3, (search, method)
            assert e["output_tokens"] == sum(len(t) for t in core[search])
            assert e["seconds"] == pytest.approx(seconds[method] * slower[search], rel=1e-9)
            assert e["sentences_per_s"] == pytest.approx(
                4 / (seconds[method] * slower[search]), rel=1e-9)
            mib = tensor_mib(ours.parameters()) + 16
            assert e["peak_mib"] is None or abs(e["peak_mib"] - mib) < 6


# --------------------------------------------------------------------------- serving
DELAY_S = 0.03  # what the stand-in server takes to answer


class SlowTranslator(BaseHTTPRequestHandler):
    """POST /translate: after DELAY_S, the text reversed; 503 for a text starting "fail"."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the real server

    def do_POST(self):
        q = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["q"]
        time.sleep(DELAY_S)
        self.answer(*(503, {"error": "busy"}) if q.startswith("fail") else (
            200, {"translatedText": q[::-1]}))

    def do_GET(self):  # GET /health, as any server of the API answers it
        self.answer(200, {"status": "ok"})

    def answer(self, code: int, answer: dict) -> None:
        body = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowTranslator)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("clients", [1, 3])
def test_serve_load_measures_a_server_of_known_latency(slow_server, clients):
    """Closed-loop clients, each request taking at least DELAY_S: the timed span at least
    the rounds of requests and within the wall time less the untimed warm-up round;
    latencies in ms; only answered requests counted; every answer where its request was."""
    from tinymt.bench.serve_speed import _load

    texts = [f"{word} {i}" for i in range(4) for word in ("sentence", "fail")]
    t0 = time.perf_counter()
    row = asyncio.run(_load(slow_server, [{"q": t} for t in texts], clients))
    wall = time.perf_counter() - t0
    assert row["answers"] == [None if t.startswith("fail") else t[::-1] for t in texts]
    assert len(row["errors"]) == 4 and all(e.startswith("503") for e in row["errors"])
    assert len(row["latencies"]) == len(texts)  # timed: not the warm-up requests
    assert all(1000 * DELAY_S <= ms < 1000 * DELAY_S + 500 for ms in row["latencies"])
    rounds = -(-len(texts) // clients)  # a client's requests go one after another
    assert rounds * DELAY_S <= row["seconds"] <= wall - DELAY_S


def test_a_level_is_each_servers_passes_in_turn(slow_server):
    """Each server takes a quarter of the requests in turn, the order reversed each pass;
    its row: every request, the failed ones counted, each answer compared with the
    reference where its request was, sentences/s the median pass's answered requests a
    second."""
    from tinymt.bench.serve_speed import PASSES, _level

    calls = []

    class Server:  # what _level reads of a ServerProcess
        base = slow_server

        def __init__(self, name: str):
            self.name = name

        def health(self) -> dict:
            calls.append(self.name)
            return {"status": "ok"}

        def rss_mib(self) -> float:
            return 42.0

    texts = [f"{word} {i}" for i in range(4) for word in ("sentence", "fail")]
    rows = _level({"a": Server("a"), "b": Server("b")}, [{"q": t} for t in texts], 1)
    assert calls == ["a", "a", "b", "b", "b", "b", "a", "a"] * (PASSES // 2)
    for row in rows.values():
        assert row["requests"] == 8 and row["errors"] == 4 and row["first_error"][:3] == "503"
        assert row["clients"] == 1
        assert row["server_rss_mib"] == 42.0 and row["mean_batch"] is None  # no batches
        assert 1000 * DELAY_S <= row["p50_ms"] <= row["p99_ms"] < 1000 * DELAY_S + 500
        assert row["seconds"] >= 8 * DELAY_S  # a pass: two requests in turn, one answered
        assert 0 < row["sentences_per_s"] <= 1 / (2 * DELAY_S)


STAND_IN = """# scripts/serve.py as ServerProcess meets it: port=0, host=; the port printed; /health
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = dict(a.split("=", 1) for a in sys.argv[1:])
if "fail" in args:
    sys.exit("error: cannot listen on the moon")


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "ok", "pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = HTTPServer((args["host"], int(args["port"])), Health)
print(f"serving a stand-in on http://{args['host']}:{server.server_port}/ ...", file=sys.stderr)
server.serve_forever()
"""


def test_a_server_is_up_once_it_answers_on_the_port_it_printed(tmp_path, monkeypatch):
    """The server picks its port (``port=0``) and prints it: the benchmark asks there, of
    that process (another server's port is never guessed); a server that exits is one line
    with its stderr; an exited server has no memory. (scripts/serve.py's stand-in prints
    what serve.py prints.)"""
    from tinymt.bench import serve_speed
    from tinymt.errors import TinyMTError

    (tmp_path / "serve.py").write_text(STAND_IN)
    monkeypatch.setattr(serve_speed, "SERVE_SCRIPT", tmp_path / "serve.py")
    # started plainly, as the benchmark starts it: the stand-in imports no torch, and a
    # fork server (tests/forked.py) costs ~4 s to start where no other test needs one
    monkeypatch.setattr(serve_speed.ServerProcess, "popen", subprocess.Popen)
    server = serve_speed.ServerProcess(["a=1"])
    try:
        assert server.base == f"http://127.0.0.1:{server.port}" and server.port > 0
        assert server.health()["pid"] == server.proc.pid
        assert server.rss_mib() > 5  # a Python interpreter
    finally:
        assert server.stop()[0] == -15  # SIGTERM
    assert server.rss_mib() is None
    with pytest.raises(TinyMTError, match="fail=1 did not serve.*cannot listen on the moon"):
        serve_speed.ServerProcess(["fail=1"])


# --------------------------------------------------------------------------- the script
def benchmark(*args: str, cwd=REPO_ROOT, timeout=600) -> subprocess.CompletedProcess:
    """The script with one torch thread (a test per core: a second thread only waits), where
    CTranslate2 is not installed (its servers' rows: tests/test_serve.py)."""
    return forked.run([sys.executable, "-c", NO_CT2, str(REPO_ROOT / "scripts" / "benchmark.py"),
                       *args],
                      cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
                      env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_help_and_bad_input(capsys, monkeypatch, tmp_path):
    from tinymt.bench import main as bench_main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        bench_main.main(["--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--sections" in out and "--merge" in out
    monkeypatch.setattr(bench_main, "measure", lambda *a: pytest.fail("measured bad input"))
    for bad in (["--steps", "0"], ["--sections", "training", "viewer"], ["--device", "tpu"],
                ["--serve-clients", "1", "x"], ["--sizes", "huge"], ["--merge", "absent.json"],
                ["--sizes", "tiny", "small", "--max-tokens", "512", "256", "128"]):
        with pytest.raises(SystemExit) as exit_:
            bench_main.main(["--device", "cpu", "--out", str(tmp_path / "r.md"), *bad])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err


# JSON of the report's own keys, nested: draws reach into devices, sections and their fields
MERGE_KEYS = ["cpu", "cuda", "training", "decoding", "serve", "machine", "settings", "sizes",
              "rows", "x"]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(MERGE_KEYS), inner, max_size=3), max_leaves=12)


@given(devices=JSON)
@example(devices={"cpu": {"training": 5}})
@example(devices={"tpu": {}})
@example(devices={"cuda": {"decoding": {"settings": {}, "machine": {}}}})
def test_merge_is_checked_before_anything_is_measured(devices, tmp_path_factory):
    """``--merge`` of a JSON holding any ``devices``: one line naming the file, exit 2,
    before anything is measured, or one the report renders (then measured, and written;
    devices other than cpu and cuda left out). Never a fault after the measuring."""
    from tinymt.bench import main as bench_main

    folder = tmp_path_factory.mktemp("merge")
    merge = folder / "m.json"
    merge.write_text(json.dumps({"devices": devices}))
    measured = []
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(io.StringIO()) as err:
        mp.chdir(folder)
        mp.setattr(bench_main, "measure", lambda *a: measured.append(a) or {})
        try:
            code = bench_main.main(["--device", "cpu", "--sizes", "tiny", "--merge", str(merge),
                                    "--out", str(folder / "r.md"), "--json", str(folder / "r.json")])
        except SystemExit as e:
            code = e.code
    lines = err.getvalue().splitlines()
    if code == 2:
        assert not measured and len(lines) == 1, lines
        assert lines[0].startswith(f"error: --merge {merge}: devices"), lines
    else:  # each section of cpu and cuda as the report reads it
        assert code == 0 and measured and (folder / "r.md").is_file(), lines
        assert not devices or isinstance(devices, dict)
        written = json.loads((folder / "r.json").read_text())["devices"]
        assert written == {dev: (devices or {}).get(dev) or {} for dev in ("cpu", "cuda")}


def test_the_published_page_is_its_results_rendered():
    """docs/benchmarks.md's figures are docs/benchmarks.json as the report renders it
    today (a change to the report re-renders the page), and ``make gpu`` can merge into
    that JSON, written by earlier versions of the benchmark."""
    from tinymt.bench.main import into_page, merged_devices
    from tinymt.bench.report import render

    results = REPO_ROOT / "docs" / "benchmarks.json"
    devices = merged_devices(str(results))
    assert {"training", "decoding"} <= set(devices["cpu"]) and "training" in devices["cuda"]
    page = (REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert into_page(page, render(json.loads(results.read_text()))) == page


def test_merge_keeps_what_was_not_measured_and_the_page_keeps_its_prose(monkeypatch, tmp_path):
    from tinymt.bench import main as bench_main
    from tinymt.bench.report import BEGIN, END

    monkeypatch.chdir(tmp_path)
    earlier = {"schema": 2, "devices": {"cpu": {"training": {"old": 1}, "decoding": {"old": 1}},
                                        "cuda": {"training": {"gpu": 1}}}}
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    (tmp_path / "page.md").write_text(f"prose before\n{BEGIN}\nold figures\n{END}\nprose after\n")
    monkeypatch.setattr(bench_main, "measure", lambda args, device, argv: {"decoding": {"new": 1}})
    monkeypatch.setattr(bench_main, "render", lambda results: "new figures\n")
    assert bench_main.main(["--device", "cpu", "--sections", "decoding", "--merge",
                            "earlier.json", "--out", "page.md", "--json", "new.json"]) == 0
    assert json.loads((tmp_path / "new.json").read_text())["devices"] == {
        "cpu": {"training": {"old": 1}, "decoding": {"new": 1}}, "cuda": {"training": {"gpu": 1}}}
    page = (tmp_path / "page.md").read_text()
    assert "old figures" not in page and all(
        page.count(text) == 1 for text in ("prose before", "new figures", "prose after"))


@pytest.mark.slow  # a tiny race, the trained run decoded, two servers
def test_a_run_of_every_section_writes_its_report_and_json(tiny_run, tmp_path):
    """One run of scripts/benchmark.py, every section at its smallest: the pieces wired, the
    rows sane and consistent with each other (what each row is measured right by: the tests
    above). Without CTranslate2: its serving rows are skipped, saying why."""
    n, requests = 6, 4
    proc = benchmark("--quick", "--device", "cpu", "--sections", "training", "decoding", "serve",
                     "--run", str(tiny_run), "--steps", "2", "--warmup", "0",
                     "--sizes", "tiny", "small", "--max-tokens", "512", "256",  # one a size
                     "--sentences", str(n), "--serve-clients", "2", "--serve-requests",
                     str(requests), "--hostile-seconds", "0",  # (its own test: test_serve.py)
                     "--data-path", str(tmp_path / "no-multi30k"),  # the built-in corpus
                     "--cache-dir", str(tmp_path / "cache"), "--out", "r.md", "--json", "r.json",
                     cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "r.md").read_text()  # (the page of any JSON: the property above)
    res = json.loads((tmp_path / "r.json").read_text())["devices"]["cpu"]
    tiny, small = (res["training"]["sizes"][size] for size in ("tiny", "small"))
    assert (tiny["max_tokens"], small["max_tokens"]) == (512, 256)  # 2 batches of each
    assert 256 < tiny["timed_target_tokens_per_run"] <= 1024 and \
        small["timed_target_tokens_per_run"] <= 512
    assert "| ≤ 512 (" in page and "| ≤ 256 (" in page
    row = tiny
    assert row["params"] > 0 and row["flops_per_target_token"] > 0
    for name in ("ours", "plain", "peer"):  # a share of the matmul peak well over 1 is wrong
        assert row[name]["tokens_per_s"] > 0 and 0 < row[name]["share_of_peak"] < 2
        mib = row[name]["peak_mib"]
        assert row[name]["final_loss"] > 0 and (mib is None or mib > 0)
    [row] = res["decoding"]["sizes"].values()  # the trained run's model
    assert res["decoding"]["settings"]["sentences"] == n
    for search, plain in (("greedy", {"ours_nocache", "peer"}), ("beam5", set())):
        assert set(row[search]) == {"ours_cache"} | plain  # the plain loop: greedy only
        assert all(e["sentences_per_s"] > 0 and e["output_tokens"] > 0
                   and 0 <= e["bleu"] <= 100 for e in row[search].values())
    greedy = row["greedy"]  # the same search, the same weights: the same translations
    for method in ("ours_nocache", "peer"):
        assert greedy[method]["identical_to_ours"] == n, method
        assert greedy[method]["bleu"] == pytest.approx(greedy["ours_cache"]["bleu"])
        assert greedy[method]["output_tokens"] == greedy["ours_cache"]["output_tokens"]
    serve = res["serve"]
    assert {(r["engine"], r["method"], r["clients"]) for r in serve["rows"]} == {
        ("torch", m, 2) for m in ("one_at_a_time", "micro_batching")}
    assert serve["skipped"] == {"ct2": "CTranslate2 is not installed: pip install -e '.[ct2]'"}
    for r in serve["rows"]:  # every answer arrived
        assert r["errors"] == 0 and r["requests"] == requests
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["sentences_per_s"] > 0
        assert r["mean_batch"] == 1 if r["method"] == "one_at_a_time" else r["mean_batch"] >= 1
        assert r["server_rss_mib"] > 50, r  # a server holding torch and a model
    assert serve["settings"]["sentences"] == requests
    assert serve["hostile"] is None  # --hostile-seconds 0: none
