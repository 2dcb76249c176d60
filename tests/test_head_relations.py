"""Per-head relation accuracy (tinymt.heads.relations) on attention written by hand.

Every expected number below is worked out by hand from the rows written here; the
sentences have a word of two pieces (word attention = its pieces' rows summed, the mass
on a key word = the sum over its pieces) and a causal decoder side (only partners to the
left count, the BOS row belongs to no word).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import QUIET, FixedAttention, analyze_cfg, copy_run
from tinymt.corpus import SHOWCASE
from tinymt.corpus.relations import RELATIONS
from tinymt.errors import TinyMTError
from tinymt.heads import analyze, attention_pass
from tinymt.heads.relations import (
    MARGIN,
    MIN_INSTANCES,
    RelationCounts,
    attended_words,
    relation_instances,
    relation_summary,
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


def test_attended_word_sums_pieces_and_sets_the_word_itself_aside():
    # pieces: w0 | w1a w1b | w2 | EOS
    weights = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], float)
    attn = np.array([
        [.10, .25, .25, .35, .05],  # w0: w1 gets .50 over two pieces > w2's single .35
        [.50, .00, .00, .40, .10],  # w1a alone would pick w0 ...
        [.00, .05, .05, .30, .60],  # ... w1b alone w2; summed: w0 .50 < w2 .70
        [.05, .05, .05, .80, .05],  # w2: mostly itself; of the others, w1 (.10) > w0 (.05)
        [.20, .20, .20, .20, .20],
    ])
    attended, share = attended_words(attn, weights)
    assert attended.tolist() == [1, 2, 1]
    np.testing.assert_allclose(share, [.50 / .95, .70 / 1.30, .10 / .95])


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
    for name in ("relations_encoder_self", "relations_decoder_self",
                 "relations_showcase_encoder_self", "relations_showcase_decoder_self"):
        png = run_dir / "heads" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"](heads/{name}.png)" in report
    doc = json.loads((run_dir / "heads.json").read_text(encoding="utf-8"))
    for kind in ("encoder_self", "decoder_self"):
        for row, mine in zip(doc["relations"][kind]["rows"], r["relations"][kind]["rows"]):
            np.testing.assert_allclose(row["accuracy"], mine["accuracy"], atol=1e-6)
            assert row["relation"] == mine["relation"] and row["tracks"] == mine["tracks"]
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    assert {"heads/relations/encoder_self", "heads/relations/decoder_self",
            "heads/relations/showcase_encoder_self"} <= set(tags["images"])
    row = r["relations"]["encoder_self"]["rows"][0]
    tag = f"heads/relations/encoder_self/{row['relation']}_" \
          f"{row['direction'].replace('->', '_to_')}/best"
    assert acc.Scalars(tag)[0].value == pytest.approx(row["best_accuracy"])


def test_showcase_links_use_the_showcase_gold(head_analysis):
    _, r = head_analysis
    enc = r["showcase"]["encoder_self"]
    pair = SHOWCASE[0]
    assert enc["words"] == list(pair.zh_words)
    assert enc["attended"].shape == (2, 2, len(pair.zh_words))
    gold = {(d, h): RELATIONS[k] for k, d, h in pair.zh_relations}
    assert all(enc["gold"][key] == name for key, name in gold.items())
    assert not (enc["attended"] == np.arange(len(pair.zh_words))).any()  # never itself


@pytest.mark.slow
def test_sweep_folder_analyses_every_run_and_compares_them(head_analysis, tmp_path):
    """run=<a train.py -m folder>: each run analysed (pruning=false), heads_sweep.md side by
    side, labelled by the setting that differs. The runs are copies of one analysed already:
    analysing again replaces that analysis's report and events instead of adding to them."""
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
    for r in runs:
        assert (r / "heads.json").is_file()
        report = (r / "heads.md").read_text(encoding="utf-8")
        assert "## 2. Pruning without retraining" in report and "pruning=false" in report
        assert len(list(r.glob("events.out.tfevents.*.heads"))) == 1
        acc = EventAccumulator(str(r), size_guidance={"scalars": 0})
        acc.Reload()
        assert "heads/pruning_bleu/all" not in acc.Tags()["scalars"]  # the first one's, gone
        assert len(acc.Scalars("heads/aer/best")) == 1
        assert len(acc.Scalars("valid/bleu")) == 2  # the training run's own events intact
    assert all(result["pruning"] is None for result in out["results"])
    with pytest.raises(TinyMTError, match="prune_output"):
        analyze(analyze_cfg(sweep, f"prune_output={tmp_path / 'p.pt'}"), progress=False,
                log=QUIET)
