"""Per-head relation accuracy (tinymt.relations) on attention written by hand.

Every expected number below is worked out by hand from the rows written here; the
sentences have a word of two pieces (word attention = its pieces' rows summed, the mass
on a key word = the sum over its pieces) and a causal decoder side (only partners to the
left count, the BOS row belongs to no word).
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from conftest import QUIET, FixedAttention, analyze_cfg, copy_run
from tinymt.corpus import SHOWCASE
from tinymt.corpus.relations import RELATIONS
from tinymt.errors import TinyMTError
from tinymt.heads import analyze, attention_pass
from tinymt.labels import frame_labels, label_sample
from tinymt.relations import (
    MARGIN,
    MIN_INSTANCES,
    RelationCounts,
    relation_instances,
    relation_summary,
    word_attention,
)

SUBJ, OBJ, AUX, QUES = (RELATIONS.index(n) for n in ("subject", "object", "aux", "question"))


def test_instances_both_directions_and_the_causal_limit():
    rels = [(SUBJ, 0, 1), (OBJ, 2, 1), (OBJ, 3, 1)]  # 0 -> 1 subject; 2, 3 -> 1 objects
    assert relation_instances(rels, causal=False) == [
        (SUBJ, 0, 0, (1,)), (SUBJ, 1, 1, (0,)),
        (OBJ, 0, 2, (1,)), (OBJ, 0, 3, (1,)), (OBJ, 1, 1, (2, 3)),  # the head: either object
    ]
    # causal: a word sees only words to its left
    assert relation_instances(rels, causal=True) == [
        (SUBJ, 1, 1, (0,)), (OBJ, 0, 2, (1,)), (OBJ, 0, 3, (1,))]


def test_word_attention_sums_a_word_s_pieces_and_leaves_eos_out():
    # pieces: w0 | w1a w1b | w2 | EOS
    weights = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], float)
    attn = np.array([
        [.10, .25, .25, .35, .05],  # w0: w1 gets .50 over two pieces, of .95 on words
        [.50, .00, .00, .40, .10],  # w1 = these two rows summed: w0 .50, w1 .10, w2 .70 ...
        [.00, .05, .05, .30, .60],  # ... of 1.30 on words (EOS's .70 left out)
        [.05, .05, .05, .80, .05],
        [.20, .20, .20, .20, .20],  # EOS belongs to no word
    ])
    np.testing.assert_allclose(word_attention(attn, weights), [
        [.10 / .95, .50 / .95, .35 / .95], [.50 / 1.3, .10 / 1.3, .70 / 1.3],
        [.05 / .95, .10 / .95, .80 / .95]])


# One sentence through attention_pass (1 layer, 2 heads of each kind).
# Source: w0 | w1a w1b | w2 | EOS; gold: w0 subject of w1, w2 object of w1.
ENC = [
    [[.10, .25, .25, .35, .05],  # head 0. w0 -> w1 (.50 > .35): subject -> hit
     [.50, .00, .00, .40, .10],  # w1 (rows summed): w0 .50+.00, w2 .40+.10 = .50 ...
     [.05, .20, .20, .05, .50],  # ... +.05 / +.05: w0 .55 > w2 .45 -> w0: subject <- hit,
     [.60, .10, .10, .10, .10],  # object <- miss. w2 -> w0: object -> miss
     [.20, .20, .20, .20, .20]],
    [[.50, .10, .10, .20, .10],  # head 1. w0: itself set aside, w2 .20 = w1 .20: the
     [.10, .30, .30, .20, .10],  # first (w1) wins the tie -> subject -> hit.
     [.00, .30, .30, .30, .10],  # w1: w0 .10, w2 .50 -> w2: object <- hit, subject <- miss
     [.10, .40, .30, .10, .10],  # w2 -> w1 (.70): object -> hit
     [.20, .20, .20, .20, .20]],
]
# Target: t0 t1 t2 (one piece each); decoder rows: BOS, t0, t1, t2. Gold: t0 aux of t1
# (t0 cannot see t1: only aux <- counts, from t1), t2 question -> t0 (t0 cannot see t2).
DEC = [
    [[1, 0, 0, 0],
     [.9, .1, 0, 0],  # t0: only BOS (no word) and itself: attends to nothing
     [.2, .5, .3, 0],  # t1 -> t0: aux <- hit
     [.1, .2, .6, .1]],  # t2 -> t1: question -> miss
    [[1, 0, 0, 0],
     [.5, .5, 0, 0],
     [.6, .1, .3, 0],  # t1 -> t0 (.1: BOS is no word): hit
     [0, .5, .2, .3]],  # t2 -> t0: hit
]
EXPECTED = {  # (kind, relation, direction): accuracy of heads 0 and 1
    ("encoder_self", "subject", "dep->head"): [1, 1],
    ("encoder_self", "subject", "head->dep"): [1, 0],
    ("encoder_self", "object", "dep->head"): [0, 1],
    ("encoder_self", "object", "head->dep"): [0, 1],
    ("decoder_self", "aux", "head->dep"): [1, 1],
    ("decoder_self", "question", "dep->head"): [0, 1],
}


def test_accuracy_of_constructed_attention_through_attention_pass():
    model = FixedAttention({"encoder_self": ENC, "decoder_self": DEC,
                            "cross": [[[.2] * 5] * 4] * 2})
    src_w = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], float)
    tgt_w = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], float)  # + EOS row
    words = {"src_weights": [src_w], "tgt_weights": [tgt_w], "alignment": [[(0, 0)]],
             "src_relations": [[(SUBJ, 0, 1), (OBJ, 2, 1)]],
             "tgt_relations": [[(AUX, 0, 1), (QUES, 2, 0)]]}
    _, _, counts = attention_pass(model, [[5, 6, 7, 8]], [[9, 10, 11]], words=words)
    summary = relation_summary(counts)
    got = {(kind, row["relation"], row["direction"]): row["accuracy"][0].tolist()
           for kind, v in summary.items() for row in v["rows"]}
    assert got == EXPECTED
    for v in summary.values():
        for row in v["rows"]:
            assert row["instances"] == 1
            assert row["baseline"] == 1.0  # one instance: its own offset finds it
            assert not row["tracks"]  # fewer than MIN_INSTANCES


def test_baseline_offset_margin_and_tracking():
    """Three sentences of 4 words, one piece each; subject -> verb at offsets +1, +1, +2:
    the best fixed offset is +1 with 2/3. Head 0 always finds the verb, head 1 always
    looks one to the right."""
    weights = np.eye(4)
    rels = [[(SUBJ, 0, 1)], [(SUBJ, 1, 2)], [(SUBJ, 0, 2)]]

    def attn(verb: int, q: int) -> np.ndarray:
        a = np.full((2, 4, 4), 0.01)
        for i in range(4):
            a[0, i, verb if i == q else (i + 2) % 4] = 1.0
            a[1, i, (i + 1) % 4] = 1.0
        return a[None]  # (1 layer, 2 heads, 4, 4)

    def counts(copies: int) -> RelationCounts:
        c = RelationCounts({"encoder_self": (1, 2), "decoder_self": (1, 2)})
        for _ in range(copies):
            for (r,) in rels:
                c.add("encoder_self", attn(r[2], r[1]), weights, [r])
        return c

    row = next(r for r in relation_summary(counts(1))["encoder_self"]["rows"]
               if r["direction"] == "dep->head")
    assert row["accuracy"].tolist() == [[1.0, 2 / 3]]
    assert row["baseline"] == pytest.approx(2 / 3) and row["baseline_offset"] == 1
    assert row["best_head"] == (0, 0) and not row["tracks"]  # 3 < MIN_INSTANCES
    n = -(-MIN_INSTANCES // 3)  # enough copies
    big = relation_summary(counts(n))["encoder_self"]
    row = next(r for r in big["rows"] if r["direction"] == "dep->head")
    assert row["instances"] == 3 * n and row["tracks"]  # 1.0 >= 2/3 + MARGIN
    assert 1.0 - 2 / 3 >= MARGIN
    assert "subject" in big["tracked"]


# ----------------------------------------------------------------------------- frame labels
class BatchAttention(torch.nn.Module):
    """Stands in for a Transformer of one layer: for a batch of sentences (each source
    piece is 100 + the sentence's index), their rows of the attention given ``{kind: (n,
    h, T_q, T_k)}``, cut to the batch's positions."""

    def __init__(self, attn: dict[str, np.ndarray]):
        super().__init__()
        self.attn = attn

    def forward(self, src, tgt_in, need_weights=False):
        assert need_weights
        rows, (S, T) = [int(s[0]) - 100 for s in src], (src.shape[1], tgt_in.shape[1])
        out = {}
        for kind, (q, k) in (("encoder_self", (S, S)), ("decoder_self", (T, T)),
                             ("cross", (T, S))):
            a = self.attn[kind][rows]
            assert a[:, :, q:].sum() == a[..., k:].sum() == 0  # nothing real cut off
            out[kind] = [torch.tensor(a[:, :, :q, :k], dtype=torch.float32)]
        return None, out


def labelled_batch(n: int = 24, seed: int = 0):
    """``n`` sentences of 4 or 5 source words (one piece each) and 3 target words, and the
    attention of two heads of each kind. Gold: source word 0 is the subject of word 1 (even
    sentences) or 2 (odd: the best fixed offset finds half); target word 2 the object of
    word 0 (always two to the left) and word 0 the subject of word 1 or 2 (uniform attention
    finds it, by the tie: first wins); word i aligned to word i. Encoder head 0 sends word 0
    to its verb (random rows otherwise), head 1 0.7 to the next piece; decoder head 0 0.8 to
    <s> and the rest to itself, head 1 uniform; cross head 0 0.9 to the aligned word, head 1
    0.8 to </s>."""
    rng = np.random.default_rng(seed)
    enc, dec, cross = np.zeros((n, 2, 6, 6)), np.zeros((n, 2, 4, 4)), np.zeros((n, 2, 4, 6))
    words = {k: [] for k in ("src_weights", "tgt_weights", "alignment", "src_relations",
                             "tgt_relations")}
    for b in range(n):
        n_w, verb = 4 + b % 2, 1 + b % 2
        S = n_w + 1
        uniform = np.full(S, 1 / S)
        for i in range(S):
            enc[b, 0, i, :S] = .1 * uniform + .9 * np.eye(S)[verb] if i == 0 else \
                rng.dirichlet(np.ones(S))
            enc[b, 1, i, :S] = .3 * uniform + .7 * np.eye(S)[min(i + 1, S - 1)]
        for i in range(4):
            dec[b, 0, i, :i + 1] = [1.0] if i == 0 else [.8] + [0] * (i - 1) + [.2]
            dec[b, 1, i, :i + 1] = 1 / (i + 1)
            cross[b, 0, i, :S] = np.eye(S)[S - 1] if i == 3 else .9 * np.eye(S)[i] + .1 * \
                np.eye(S)[S - 1]
            cross[b, 1, i, :S] = .8 * np.eye(S)[S - 1] + .2 * uniform
        words["src_weights"].append(np.vstack([np.eye(n_w), np.zeros((1, n_w))]))
        words["tgt_weights"].append(np.vstack([np.eye(3), np.zeros((1, 3))]))
        words["alignment"].append([(0, 0), (1, 1), (2, 2)])
        words["src_relations"].append([(SUBJ, 0, verb)])
        words["tgt_relations"].append([(OBJ, 2, 0), (SUBJ, 0, verb)])
    src_ids = [[100 + b] * (4 + b % 2) for b in range(n)]
    return {"encoder_self": enc, "decoder_self": dec, "cross": cross}, src_ids, words


def reference_labels(attn: dict, src_ids: list, words: dict | None) -> dict:
    """The labels worked out with plain loops, row by row and word by word (one piece a
    word here): ``{kind: [short label of head 0, head 1]}``, and each relation label's
    baseline and offset."""
    out, details, diffuse = {}, {}, set()
    for kind, a in attn.items():
        causal, labels = kind == "decoder_self", []
        for h in range(2):
            mass, ent, rows = {}, 0.0, 0
            for b, ids in enumerate(src_ids):
                n_q = len(ids) + 1 if kind == "encoder_self" else 4
                n_k = 4 if causal else len(ids) + 1
                for i in range(n_q):
                    keys = i + 1 if causal else n_k
                    if keys < 2:
                        continue
                    row = a[b, h, i, :keys]
                    rows += 1
                    ent += -sum(p * math.log(p) for p in row if p > 0) / math.log(keys)
                    spots = {"<s>" if causal else "</s>": 0 if causal else n_k - 1}
                    if kind != "cross":
                        spots.update({"previous": i - 1, "self": i, "next": i + 1})
                    for name, j in spots.items():
                        mass[name] = mass.get(name, 0.0) + (row[j] if 0 <= j < keys else 0.0)
            name, top = max(mass.items(), key=lambda kv: kv[1])
            if ent / rows >= .8:
                diffuse.add((kind, h))
            labels.append(name if top / rows >= .5 else "diffuse" if ent / rows >= .8
                          else "content")
        out[kind] = labels
    if words is None:
        return out, details
    for kind, side, shift in (("encoder_self", "src", 0), ("decoder_self", "tgt", 1)):
        found = {}  # (relation, direction) -> [hits of head 0, head 1, instances, offsets]
        for b in range(len(src_ids)):
            n_words = words[f"{side}_weights"][b].shape[1]
            for r, d, hd in words[f"{side}_relations"][b]:
                for direction, q, g in ((0, d, hd), (1, hd, d)):
                    if shift and g > q:  # the decoder sees its left only
                        continue
                    f = found.setdefault((r, direction), [0, 0, 0, {}])
                    f[2] += 1
                    f[3][g - q] = f[3].get(g - q, 0) + 1
                    for h in range(2):
                        others = [w for w in range(n_words) if w != q]
                        row = attn[kind][b, h, q + shift]
                        best = max(others, key=lambda w: (row[w + shift], -w))
                        f[h] += row[best + shift] > 0 and best == g
        for (r, direction), (h0, h1, n, offsets) in found.items():
            base, off = max((c, -k) for k, c in offsets.items() if k)
            for h, hits in enumerate((h0, h1)):
                if n >= 20 and hits / n >= base / n + .1 and (kind, h) not in diffuse:
                    label = f"{RELATIONS[r]} {'→←'[direction]} {hits / n:.2f}"
                    if hits / n - base / n > details.get((kind, h), (-1,))[0]:
                        details[kind, h] = (hits / n - base / n, base / n, -off)
                        out[kind][h] = label
    for h in range(2):  # target word t aligned to source word t, </s> the last source position
        share = {"aligned": 0.0, "before": 0.0, "after": 0.0, "</s>": 0.0}
        for b, t in itertools.product(range(len(src_ids)), range(3)):
            row = attn["cross"][b, h, t]
            for place, j in (("aligned", t), ("before", t - 1), ("after", t + 1),
                             ("</s>", len(src_ids[b]))):
                share[place] += row[j] / (3 * len(src_ids)) if j >= 0 else 0.0
        share["elsewhere"] = 1 - sum(share.values())
        first = max(share, key=share.get)
        second = max((p for p in share if p not in (first, "elsewhere")), key=share.get)
        out["cross"][h] = f"{first} {share[first]:.2f}, {second} {share[second]:.2f}"
    return out, details


def test_frame_labels_against_plain_loops():
    """The trainer's labels of every head (tinymt.labels.frame_labels: length-sorted batches,
    padded) on 24 constructed sentences are what plain loops over the same attention give,
    and what the attention was built to do; without gold words, the positional ones."""
    attn, src_ids, words = labelled_batch()
    model = BatchAttention(attn)
    sample = label_sample(src_ids, [[7, 8, 9]] * 24, words, batch_tokens=40)
    assert len(sample.batches) > 2 and sorted(i for idx, _ in sample.batches for i in idx) == \
        list(range(24))
    got = frame_labels(model, sample, "cpu")
    want, details = reference_labels(attn, src_ids, words)
    assert {k: [label.split(" · ")[0] for label in v[0]] for k, v in got.items()} == want
    assert want == {"encoder_self": ["subject → 1.00", "next"], "decoder_self": ["<s>", "diffuse"],
                    "cross": ["aligned 0.90, </s> 0.10", "</s> 0.84, aligned 0.04"]}
    margin, base, offset = details["encoder_self", 0]
    assert (base, offset) == (.5, 1)
    assert got["encoder_self"][0][0] == "subject → 1.00 · accuracy 1.00 over 24 instances · " \
                                        "baseline 0.50: the word at offset +1"
    assert got["cross"][0][0] == "aligned 0.90, </s> 0.10 · 0.90 on the gold-aligned source " \
        "pieces, 0.00 on the piece before them, 0.00 on the piece after them, 0.10 on </s>, 0.00 " \
        "on anything else · over 72 target pieces with gold-aligned source words"
    plain = frame_labels(model, label_sample(src_ids, [[7, 8, 9]] * 24, None), "cpu")
    assert {k: [label.split(" · ")[0] for label in v[0]] for k, v in plain.items()} == \
        reference_labels(attn, src_ids, None)[0]
    assert plain["encoder_self"][0][0].startswith("content")  # random rows, without its verb


# ----------------------------------------------------------------------------- the report
def test_report_on_a_briefly_trained_model(head_analysis):
    run_dir, r = head_analysis
    for kind, shape in (("encoder_self", (2, 2)), ("decoder_self", (1, 2))):
        rows = r["relations"][kind]["rows"]
        assert rows and r["relations"][kind]["shape"] == shape
        for row in rows:
            assert row["accuracy"].shape == shape
            assert 0 <= row["accuracy"].min() and row["accuracy"].max() <= 1
            assert 0 <= row["baseline"] <= 1 and row["instances"] > 0
    # decoder self-attention only ever sees partners to its left: no "-> head" rows for a
    # relation whose head always follows (determiner -> noun in English)
    dec = {(row["relation"], row["direction"]) for row in r["relations"]["decoder_self"]["rows"]}
    assert ("determiner", "head->dep") in dec and ("determiner", "dep->head") not in dec
    report = (run_dir / "heads.md").read_text(encoding="utf-8")
    assert "## 5. Which relation does each head track?" in report
    for name in ("relations_encoder_self", "relations_decoder_self"):
        png = run_dir / "heads" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"](heads/{name}.png)" in report
    doc = json.loads((run_dir / "heads.json").read_text(encoding="utf-8"))
    for kind in ("encoder_self", "decoder_self"):
        for row, mine in zip(doc["relations"][kind]["rows"], r["relations"][kind]["rows"]):
            np.testing.assert_allclose(row["accuracy"], mine["accuracy"], atol=1e-6)
            assert row["relation"] == mine["relation"] and row["tracks"] == mine["tracks"]


def test_the_showcase_s_every_relation_has_its_head_in_the_report(head_analysis):
    run_dir, r = head_analysis
    enc = r["showcase"]["encoder_self"]
    pair = SHOWCASE[0]
    assert enc["words"] == list(pair.zh_words)
    # both ends of every gold relation look for the other (which head: tests/test_viewer.py)
    assert sorted((x["query"], x["key"], x["relation"]) for x in enc["relations"]) == sorted(
        (q, k, RELATIONS[rel]) for rel, d, h in pair.zh_relations for q, k in ((d, h), (h, d)))
    assert all(0 <= x["head"][0] < 2 and 0 <= x["head"][1] < 2 and 0 <= x["weight"] <= 1
               for x in enc["relations"])
    x = next(x for x in enc["relations"] if (x["relation"], x["direction"]) == ("object", "head->dep"))
    report = (run_dir / "heads.md").read_text(encoding="utf-8")
    assert f"| 订 → 机票 | object ← | {x['head'][0]}.{x['head'][1]} | {x['weight']:.2f} |" in report


@pytest.mark.slow
def test_sweep_folder_analyses_every_run_and_compares_them(head_analysis, tmp_path):
    """run=<a train.py -m folder>: each run analysed (pruning=false), heads_sweep.md side by
    side, labelled by the setting that differs. The runs are copies of one analysed already:
    analysing again replaces that analysis's report."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("{}\n")
    runs = [copy_run(head_analysis[0], sweep / name) for name in ("0_a", "1_b")]
    cfg = (runs[1] / "config.yaml").read_text(encoding="utf-8")
    assert "  seed: 1\n" in cfg
    (runs[1] / "config.yaml").write_text(cfg.replace("  seed: 1\n", "  seed: 7\n"))
    out = analyze(analyze_cfg(sweep, "max_sentences=10", "pruning=false"), progress=False,
                  log=QUIET)
    assert out["runs"] == [str(r) for r in runs]
    report = (sweep / "heads_sweep.md").read_text(encoding="utf-8")
    bleu = json.loads((runs[0] / "metrics.json").read_text())["test_bleu"]
    assert f"| trainer.seed=1 | {bleu:.2f} |" in report and "| trainer.seed=7 |" in report
    row = out["results"][0]["relations"]["encoder_self"]["rows"][0]
    assert f"| {row['relation']} " in report
    # the showcase's object, either direction: the largest weight a head gives it
    obj = max((x for x in out["results"][0]["showcase"]["encoder_self"]["relations"]
               if x["relation"] == "object"), key=lambda x: x["weight"])
    words = out["results"][0]["showcase"]["encoder_self"]["words"]
    assert (f"| {obj['weight']:.2f} ({words[obj['query']]} → {words[obj['key']]}, head "
            f"{obj['head'][0]}.{obj['head'][1]}) |") in report
    for r in runs:
        assert (r / "heads.json").is_file()
        report = (r / "heads.md").read_text(encoding="utf-8")
        assert "## 2. Pruning without retraining" in report and "pruning=false" in report
    assert all(result["pruning"] is None for result in out["results"])
    with pytest.raises(TinyMTError, match="prune_output"):
        analyze(analyze_cfg(sweep, f"prune_output={tmp_path / 'p.pt'}"), progress=False,
                log=QUIET)
    # a run without its checkpoint (a sweep job stopped early), last of three: the sweep
    # stops before any work, every report as it was
    (copy_run(head_analysis[0], sweep / "10_c") / "checkpoints" / "best.pt").unlink()
    before = {p: p.read_bytes() for p in sweep.rglob("*.md")}
    with pytest.raises(TinyMTError, match="10_c/checkpoints/best.pt does not exist"):
        analyze(analyze_cfg(sweep, "pruning=false"), progress=False, log=QUIET)
    assert {p: p.read_bytes() for p in sweep.rglob("*.md")} == before
