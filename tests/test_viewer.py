"""The attention viewer's data: view documents, their TensorBoard records, the Attention
tab's routes on the real TensorBoard server, and the self-contained HTML file.

Weights are checked against the model's own attention (``collect_attention`` on the
checkpoint of that step), gold cells against cells worked out by hand for the
tutorials' sentence; the browser side is tests/test_viewer_browser.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import io
import json
import re
import struct
import time
import urllib.request
import zlib
from pathlib import Path
from unittest.mock import ANY

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import (
    REPO_ROOT,
    SRC_PIECES,
    TGT_PIECES,
    TINY_FRAMES,
    compose_train,
    compose_translate,
    hostile_records,
    http_get,
    inline_data,
    pack,
    random_attention,
    showcase_document,
    small_document,
    unpack,
)
from tinymt.attention_maps import collect_attention
from tinymt.corpus import SHOWCASE
from tinymt.corpus.relations import RELATIONS
from tinymt.data import normalize
from tinymt.rundir import load_run
from tinymt.translate import translate
from tinymt.viewer.document import (
    SCALE,
    Probe,
    build_document,
    document_json,
    jsonable,
    probe_from_pair,
)
from tinymt.viewer.summary import (
    MAGIC,
    PLUGIN_NAME,
    decode,
    encode,
    parse_meta,
    summary_metadata,
)

PRECISION = 0.5 / SCALE + 1e-6  # what 8 bits per weight keep


def dequantize(weights) -> np.ndarray:
    return np.asarray(weights, dtype=np.float64) / SCALE

def cells(doc, kind):
    return {(i, j): label for i, j, label in doc["kinds"][kind]["gold"]}


def test_gold_cells_of_the_tutorials_sentence_worked_out_by_hand():
    _, doc = showcase_document()
    # cross: row = the target piece predicted, column = the source piece; from the gold
    # word links 我-I 请-asked 李雷-Li/Lei 帮-to/help 我-me 订-book 了-asked 去-to 北京-Beijing
    # 的-to 机票-a/ticket 。-.
    cross = {(0, 0), (1, 1), (2, 2), (2, 3), (3, 2), (3, 3), (4, 4), (5, 4), (6, 5), (7, 6),
             (1, 7), (11, 8), (12, 9), (11, 10), (8, 11), (8, 12), (9, 11), (9, 12), (10, 11),
             (10, 12), (13, 13)}
    assert set(cells(doc, "cross")) == cross
    assert set(cells(doc, "cross").values()) == {"aligned"}
    # encoder self-attention: 我→请 subject, 机票→订 object, 了→订 aux, 去→机票 relative,
    # 李雷→请 and 我→帮 pivot; "→": the query is the dependent, "←": the head
    enc = {(0, 1): "subject →", (1, 0): "subject ←",
           (11, 6): "object →", (12, 6): "object →", (6, 11): "object ←", (6, 12): "object ←",
           (7, 6): "aux →", (6, 7): "aux ←",
           (8, 11): "relative →", (8, 12): "relative →", (11, 8): "relative ←",
           (12, 8): "relative ←",
           (2, 1): "pivot →", (3, 1): "pivot →", (1, 2): "pivot ←", (1, 3): "pivot ←",
           (5, 4): "pivot →", (4, 5): "pivot ←"}
    assert cells(doc, "encoder_self") == enc
    # decoder self-attention: positions are <s> + pieces, and a query sees only its left
    dec = {(2, 1): "subject ←", (10, 8): "object →", (11, 8): "object →",
           (10, 9): "determiner ←", (11, 9): "determiner ←", (12, 10): "relative →",
           (12, 11): "relative →", (3, 2): "pivot →", (4, 2): "pivot →", (7, 6): "pivot →"}
    assert cells(doc, "decoder_self") == dec


def test_no_target_gold_when_the_decoder_read_its_own_translation():
    _, doc = showcase_document(forced_reference=False)
    assert doc["forced"] == "translation"
    assert doc["kinds"]["cross"]["gold"] == [] and doc["kinds"]["decoder_self"]["gold"] == []
    assert len(doc["kinds"]["encoder_self"]["gold"]) == 18  # the source side still has it
    plain = build_document(showcase_document()[0], SRC_PIECES, TGT_PIECES, Probe("x"), "y", 0,
                           forced_reference=False)
    assert all(not v["gold"] for v in plain["kinds"].values())


# the word of each piece of SRC_PIECES (+ </s>) and of <s> + TGT_PIECES, by hand
SRC_WORD = [0, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 11, -1]
DEC_WORD = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 10, 11, 12]


@given(seed=st.integers(0, 2**32 - 1))
@settings(max_examples=30, deadline=None)
def test_each_relation_of_the_sentence_names_the_head_giving_it_the_most(seed):
    """Every gold relation of the showcase, both ends (the decoder: only a partner to the
    left), with the head whose query word puts the most of its attention on the partner:
    written plainly, piece by piece, from the document's own float attention."""
    attn, doc = showcase_document(seed=seed)
    pair = SHOWCASE[0]
    for kind, of, words, rels, causal in (
            ("encoder_self", SRC_WORD, pair.zh_words, pair.zh_relations, False),
            ("decoder_self", DEC_WORD, pair.en_words, pair.en_relations, True)):
        want = []
        for rel, dep, head in rels:
            for q, k, arrow in ((dep, head, "→"), (head, dep, "←")):
                if causal and k > q:
                    continue
                best = None
                for layer, heads in enumerate(attn[kind]):
                    for h, a in enumerate(heads):
                        on = sum(a[i][j] for i in range(len(of)) if of[i] == q
                                 for j in range(len(of)) if of[j] == k)
                        total = sum(a[i][j] for i in range(len(of)) if of[i] == q
                                    for j in range(len(of)) if of[j] >= 0)
                        if best is None or on / total > best[2]:
                            best = (layer, h, on / total)
                want.append([words[q], words[k], f"{RELATIONS[rel]} {arrow}", best[0], best[1],
                             round(best[2], 3)])
        got = sorted(doc["kinds"][kind]["relations"], key=lambda x: x[:3])
        want.sort(key=lambda x: x[:3])
        assert [x[:5] for x in got] == [x[:5] for x in want], kind
        np.testing.assert_allclose([x[5] for x in got], [x[5] for x in want], atol=1e-3)


def test_weights_tokens_and_entropy():
    attn, doc = showcase_document()
    src = SRC_PIECES + ["</s>"]
    axes = {"encoder_self": (src, src), "decoder_self": (["<s>"] + TGT_PIECES,) * 2,
            "cross": (TGT_PIECES + ["</s>"], src)}
    for kind, view in doc["kinds"].items():
        assert (view["rows"], view["cols"]) == axes[kind]
        w = np.stack(attn[kind])
        assert view["weights"].dtype == np.uint8 and view["weights"].shape == w.shape
        assert np.abs(dequantize(view["weights"]) - w).max() <= PRECISION
        ent = -(w * np.log(np.where(w > 0, w, 1))).sum(-1).mean(-1)  # (layers, heads)
        np.testing.assert_allclose(view["entropy"], ent, atol=1e-4)
    assert list(doc["kinds"]) == ["encoder_self", "decoder_self", "cross"]


def test_head_labels_are_optional_and_round_trip():
    """A record may carry each head's label ([layer][head] strings, the trainer's) or not
    (older records, the HTML file's): both read back as written."""
    doc = small_document()
    assert "labels" not in decode(encode(doc))["kinds"]["cross"]
    doc["kinds"]["cross"]["labels"] = [["aligned 0.81, </s> 0.10 · 0.81 on the gold-aligned "
                                        "source pieces", "x" * 200]]
    assert decode(encode(doc))["kinds"]["cross"]["labels"] == doc["kinds"]["cross"]["labels"]


def test_records_round_trip_and_damage_is_refused():
    _, doc = showcase_document()
    blob = encode(doc)
    back = decode(blob)
    for kind, view in doc["kinds"].items():
        np.testing.assert_array_equal(back["kinds"][kind]["weights"], view["weights"])
        assert back["kinds"][kind]["gold"] == [list(c) for c in view["gold"]]
        assert back["kinds"][kind].get("relations") == view.get("relations")
    assert {k: v for k, v in back.items() if k != "kinds"} == \
        {k: v for k, v in doc.items() if k != "kinds"}
    weights = sum(v["weights"].size for v in doc["kinds"].values())
    bare = {**doc, "kinds": {k: {n: x for n, x in v.items() if n != "relations"}
                             for k, v in doc["kinds"].items()}}
    assert len(encode(bare)) < weights  # compressed below one byte per weight
    raw = zlib.decompress(blob)
    for bad in (blob[:-7], b"junk", zlib.compress(b"XXXXX" + raw[5:]),
                zlib.compress(raw[:-3])):
        with pytest.raises(ValueError):
            decode(bad)


# ----------------------------------------------------------------------------- hostile records
# what the reader says of each record of conftest.hostile_records (the tag's first step)
REFUSED = {
    "huge_shape": "cross.shape is not [layers, heads, rows, columns] of at most 1,024 heads "
                  "and 4,096 tokens a side",
    "over_cap": "the record declares over 16,777,216 weights",
    "gold_out_of_range": "cross.gold has a cell outside its 2x3 grid",
    "scale_markup": "scale is not a positive finite number",
    "scale_nan": "the record's header is not valid JSON (NaN is not a number JSON allows)",
    "truncated": "the record is truncated",
    "zlib_bomb": "the record inflates past the size its header declares",
    "header_deep": "the record's header is not valid JSON (maximum recursion depth exceeded",
    "not_a_string": "not a string tensor of one value (dtype float32, shape ())",
}
BAD_META = {"meta_list": "the tag's metadata is not version 1 of this viewer's",
            "meta_deep": "the tag's metadata is not valid JSON (maximum recursion depth "
                         "exceeded while decoding a JSON array from a unicode string)"}
DELETE = object()


def change(path, value):
    """A header edit: ``value`` at ``path`` (``DELETE``: the field removed)."""
    def apply(h):
        *outer, last = path
        node = h
        for key in outer:
            node = node[key]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return apply


def header_refusals():
    """``(what is wrong, the header changed, the error's start)``: every check of the
    record's header, one at a time, on the small hand-written document."""
    c = ("kinds", "cross")
    odd = "the record's header is not what encode writes"
    return [
        ("an empty header", lambda h: h.clear(), f"{odd} (KeyError: 'scale')"),
        ("no kinds", change(("kinds",), DELETE), f"{odd} (KeyError: 'kinds')"),
        ("kinds that are a list", change(("kinds",), []), f"{odd} (AttributeError"),
        ("a kind without entropy", change((*c, "entropy"), DELETE), f"{odd} (KeyError"),
        ("a scale of 0", change(("scale",), 0), "scale is not a positive finite number"),
        ("a scale beyond any float", change(("scale",), 10 ** 400), "scale is not a positive"),
        ("a scale that is a string", change(("scale",), "255"), "scale is not a positive"),
        ("a shape of 3 numbers", change((*c, "shape"), [1, 2, 2]), "cross.shape is not [layers"),
        ("a shape of a bool", change((*c, "shape"), [True, 2, 2, 3]), "cross.shape is not"),
        ("a shape of 0 rows", change((*c, "shape"), [1, 2, 0, 3]), "cross.shape is not"),
        ("too many heads", change((*c, "shape"), [64, 64, 2, 3]), "cross.shape is not"),
        ("a shape beside its tokens", change((*c, "shape"), [1, 2, 3, 3]),
         "cross.shape 3x3 is not its lists of rows x columns"),
        ("no tokens", change((*c, "cols"), []), "cross.shape 2x3 is not its lists"),
        ("tokens that are a string", change((*c, "cols"), "abc"), "cross.shape 2x3 is not"),
        ("a bool gold index", change((*c, "gold"), [[True, 0, "x"]]),
         "cross.gold has a cell outside its 2x3 grid"),
        ("a negative gold index", change((*c, "gold"), [[0, -1, "x"]]), "cross.gold has a"),
        ("a gold index past the columns", change((*c, "gold"), [[0, 3, "x"]]), "cross.gold has"),
        ("a gold cell without label", change((*c, "gold"), [[0, 0]]), f"{odd} (ValueError"),
        ("infinite entropy", change((*c, "entropy"), [[0.0, "=1e999"]]),
         "cross.entropy is not 1x2 finite numbers"),
        ("null entropy", change((*c, "entropy"), [[0.0, None]]), "cross.entropy is not 1x2"),
        ("entropy of too few heads", change((*c, "entropy"), [[0.0]]), "cross.entropy is not"),
        ("entropy of text", change((*c, "entropy"), [[0.0, "a"]]), f"{odd} (ValueError"),
        ("entropy beyond any float", change((*c, "entropy"), [[0.0, 10 ** 400]]),
         f"{odd} (OverflowError"),
    ]


@pytest.mark.parametrize("what, apply, message", header_refusals(),
                         ids=[case[0] for case in header_refusals()])
def test_the_reader_checks_what_bounds_it_and_what_the_views_use(what, apply, message):
    head, weights = unpack(encode(small_document()))
    apply(head)
    text = json.dumps(head).replace('"=1e999"', "1e999").encode()  # inf, as a number
    with pytest.raises(ValueError) as e:
        decode(pack(text, weights))
    assert str(e.value).startswith(message) and len(str(e.value).splitlines()) == 1, e.value


def test_fields_the_views_show_as_text_are_read_as_written():
    """What neither bounds the reading nor is computed with (text, step, head labels, an
    odd field) comes back as the record holds it: the views show any JSON value as text."""
    head, weights = unpack(encode(small_document()))
    for edit in (change(("sentence",), 5), change(("step",), 1.5), change(("extra",), [1]),
                 change(("kinds", "cross", "labels"), None), change(("kinds", "self"), {
                     "rows": [7], "cols": [None], "shape": [1, 1, 1, 1], "entropy": [[0]],
                     "gold": []})):
        edit(head)
    doc = decode(pack(head, weights + b"\x05"))
    assert {k: v for k, v in doc.items() if k != "kinds"} == \
        {k: v for k, v in head.items() if k != "kinds"}
    assert doc["kinds"]["cross"]["labels"] is None and doc["kinds"]["self"]["rows"] == [7]
    assert doc["kinds"]["self"]["weights"].tolist() == [[[[5]]]]


def test_the_reader_refuses_every_hostile_record_in_bounded_memory():
    """Each forged record of the hostile run is refused in one line, and the zlib bomb
    (1 MB inflating to 1 GiB) costs the reader a few KB, not a GiB."""
    import tracemalloc

    records = hostile_records()
    for tag, message in REFUSED.items():
        _, [(_, tensor), *_] = records[tag]
        if tag == "not_a_string":  # the plugin's check (_record): the reader reads bytes
            continue
        blob = tensor.string_val[0]
        tracemalloc.start()
        t0 = time.perf_counter()
        with pytest.raises(ValueError) as e:
            decode(blob)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert str(e.value).startswith(message), (tag, e.value)
        assert len(str(e.value).splitlines()) == 1 and seconds < 1, (tag, seconds)
        assert peak < 4 << 20, (tag, peak)  # the bomb: 3 MiB, copies of its 1 MB input
    for tag, message in BAD_META.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_meta(records[tag][0])
    # the largest record allowed is read; a header longer than 1 MiB is refused unread
    doc = decode(records["largest_allowed"][1][0][1].string_val[0])
    assert doc["kinds"]["cross"]["weights"].shape == (1, 1, 4096, 4096)
    with pytest.raises(ValueError, match="header is 1,048,577 bytes"):
        decode(zlib.compress(MAGIC + struct.pack("<I", (1 << 20) + 1)))
    assert decode(records["surrogate"][1][0][1].string_val[0])["kinds"]["cross"]["rows"][0] \
        == "\ud800"  # a lone surrogate is text; the plugin escapes it in its JSON


def test_tag_metadata_is_version_checked():
    assert parse_meta(summary_metadata("猫。", None).plugin_data.content) == \
        {"sentence": "猫。", "reference": None}
    for content, message in [(b'{"version": 2, "sentence": "x"}', "not version 1"),
                             (b'{"version": 1}', "no sentence and reference"),
                             (b'{"version": 1, "sentence": "x", "reference": 1}', "reference"),
                             (b"\xff", "not valid UTF-8"), (b"{", "not valid JSON"),
                             (b" " * (1 << 20) + b"{}", "at most 1,048,576")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_meta(content)


def test_the_tab_writes_documents_as_json_of_their_numbers():
    """The one JSON writer of documents (weights as text in one numpy buffer; the tab's and
    the server's) says what ``json.dumps`` of the document would, for every shape down to
    one weight; a value JSON cannot hold is refused."""

    rng = np.random.default_rng(0)
    doc = showcase_document()[1]
    doc["kinds"]["extra"] = {"rows": ["a"], "cols": ["b"], "weights": np.zeros((1, 1, 1, 1))}
    for shape in [(1, 1, 1, 1), (3, 1, 2, 1), (1, 4, 1, 3), (2, 3, 5, 7)]:
        doc["kinds"]["extra"]["weights"] = rng.integers(0, 256, shape).astype(np.uint8)
        body = document_json(doc)
        assert body.isascii() and json.loads(body) == json.loads(json.dumps(jsonable(doc)))
    with pytest.raises(ValueError):
        document_json({**doc, "translation": float("nan")})


# ----------------------------------------------------------------------------- a real run
def model_attention(run_dir: Path, step: int, probe: Probe) -> dict:
    """The attention of the checkpoint of ``step`` for ``probe``, teacher-forced on its
    reference, as the trainer computes it."""
    run = load_run(str(run_dir), str(run_dir / "checkpoints" / f"ckpt_{step}.pt"), "cpu")
    cap = run.model.max_positions - 1
    src = run.src_tokenizer.encode(normalize(probe.sentence))[:cap]
    tgt = run.tgt_tokenizer.encode(normalize(probe.reference))[:cap]
    return collect_attention(run.model, src, tgt)


def assert_weights_match(served_kinds: dict, attn: dict):
    for kind, layers in attn.items():
        served = dequantize(np.asarray(served_kinds[kind]["weights"]))
        assert served.shape == np.stack(layers).shape, kind
        assert np.abs(served - np.stack(layers)).max() <= PRECISION, kind


def test_the_trainer_logs_every_probe_at_every_validation(tiny_run):
    acc = EventAccumulator(str(tiny_run), size_guidance={"tensors": 0})
    acc.Reload()
    tags = sorted(t for t in acc.Tags()["tensors"] if t.startswith("probe_"))
    assert tags == ["probe_0", "probe_1", "probe_2"]  # 2 showcase + n_probes=1 valid
    for tag in tags:
        assert acc.SummaryMetadata(tag).plugin_data.plugin_name == PLUGIN_NAME
        assert [e.step for e in acc.Tensors(tag)] == TINY_FRAMES
    doc = decode(acc.Tensors("probe_0")[9].tensor_proto.string_val[0])
    assert (doc["sentence"], doc["reference"], doc["forced"], doc["step"]) == \
        (SHOWCASE[0].zh, SHOWCASE[0].en, "reference", 20)
    assert doc["kinds"]["cross"]["gold"] and doc["kinds"]["encoder_self"]["gold"]
    assert_weights_match(doc["kinds"], model_attention(tiny_run, 20, probe_from_pair(SHOWCASE[0])))
    # the axes stay put from step to step (the reference is forced), the weights move
    later = decode(acc.Tensors("probe_0")[1].tensor_proto.string_val[0])
    for kind, view in doc["kinds"].items():
        assert later["kinds"][kind]["rows"] == view["rows"]
        assert not np.array_equal(later["kinds"][kind]["weights"], view["weights"])
    # each head's label (tinymt.labels), measured on the validation sentences: the same in
    # every probe's record of a step, measured anew at every frame
    frames = [{tag: decode(acc.Tensors(tag)[k].tensor_proto.string_val[0])["kinds"]
               for tag in tags} for k in (0, -1)]
    for frame in frames:
        for kind, view in frame["probe_0"].items():
            assert np.shape(view["labels"]) == view["weights"].shape[:2], kind
            assert all(frame[tag][kind]["labels"] == view["labels"] for tag in tags)
    assert frames[0]["probe_0"]["cross"]["labels"] != frames[1]["probe_0"]["cross"]["labels"]
    scalars = EventAccumulator(str(tiny_run), size_guidance={"scalars": 0})
    scalars.Reload()
    for name in ("head_label_seconds", "probe_seconds"):
        assert [e.step for e in scalars.Scalars(f"logging/{name}")] == TINY_FRAMES
    assert all(0 < a.value < b.value for a, b in zip(scalars.Scalars("logging/head_label_seconds"),
                                                     scalars.Scalars("logging/probe_seconds")))


def _events(run: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run), size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    acc.Reload()
    return acc


@pytest.mark.slow
def test_frames_between_validations_change_nothing_else(tiny_run, tmp_path):
    """``trainer.probe_every``: the probes' records (the Attention tab's frames) and their
    heads' entropy between validations, nothing else of a validation (no PNG grids, no
    BLEU); the training itself is the same step for step as without them."""
    from tinymt.trainer import train

    steps = ("trainer.max_steps=6", "trainer.valid_every=6",
             f"data.cache_dir={tiny_run.parent / 'cache'}")  # the tiny run's data, built
    acc = {}
    for every in (2, 0):  # the PNG grids: drawn where they are checked
        train(compose_train(tmp_path / str(every), *steps, f"trainer.probe_every={every}",
                            f"trainer.attention_images={every > 0}"))
        acc[every] = _events(tmp_path / str(every) / "run")
    frames, plain = acc[2], acc[0]
    for tag in ("probe_0", "probe_1", "probe_2"):
        assert [e.step for e in frames.Tensors(tag)] == [2, 4, 6]
        assert [e.step for e in plain.Tensors(tag)] == [6]
        assert decode(frames.Tensors(tag)[0].tensor_proto.string_val[0])["step"] == 2
    images = [t for t in frames.Tags()["images"] if t.startswith("attention/")]
    assert images and all([e.step for e in frames.Images(t)] == [6] for t in images)
    assert [e.step for e in frames.Scalars("valid/bleu")] == [6]
    assert [e.value for e in frames.Scalars("train/loss")] == \
        [e.value for e in plain.Scalars("train/loss")]


# ----------------------------------------------------------------------------- TensorBoard
@pytest.mark.slow
def test_the_attention_tab_serves_the_models_attention(tensorboard, tiny_run):
    status, body = http_get(f"{tensorboard}/data/plugins_listing")
    plugin = json.loads(body)[PLUGIN_NAME]
    assert status == 200 and plugin["enabled"] and plugin["tab_name"] == "Attention"
    assert plugin["loading_mechanism"] == {"type": "IFRAME",
                                           "module_path": f"/data/plugin/{PLUGIN_NAME}/index.js"}
    route = f"{tensorboard}/data/plugin/{PLUGIN_NAME}"
    runs = json.loads(http_get(f"{route}/runs")[1])["runs"]
    assert [r["run"] for r in runs] == ["."]
    assert [(p["tag"], p["sentence"], p["reference"]) for p in runs[0]["probes"][:2]] == \
        [(f"probe_{k}", pair.zh, pair.en) for k, pair in enumerate(SHOWCASE)]
    assert json.loads(http_get(f"{route}/steps?run=.&tag=probe_1")[1]) == {"steps": TINY_FRAMES}
    status, body = http_get(f"{route}/step?run=.&tag=probe_1&step=40")
    assert status == 200
    served = json.loads(body)
    assert served["step"] == 40 and served["scale"] == SCALE
    assert_weights_match(served["kinds"], model_attention(tiny_run, 40, probe_from_pair(SHOWCASE[1])))
    for path in ("index.js", "view.js"):
        status, body = http_get(f"{route}/{path}")
        assert status == 200 and b"export" in body
    status, font = http_get(f"{route}/font.otf")
    assert status == 200 and font[:4] == b"OTTO"  # OpenType (CFF)


@pytest.mark.slow
def test_bad_requests_are_http_errors_not_crashes(tensorboard):
    route = f"{tensorboard}/data/plugin/{PLUGIN_NAME}"
    for query, code in [("steps?run=nope&tag=probe_0", 404), ("steps?run=.&tag=nope", 404),
                        ("steps?run=.", 400), ("step?run=.&tag=probe_0&step=x", 400),
                        ("step?run=.&tag=probe_0&step=21", 404),
                        ("step?run=.&tag=probe_0", 400), ("step", 400)]:
        status, body = http_get(f"{route}/{query}")
        assert status == code, (query, status, body)
        assert b"Traceback" not in body and len(body.splitlines()) == 1, body
    assert http_get(f"{route}/runs")[0] == 200  # still serving


@pytest.mark.slow
def test_font_requests_cannot_starve_the_tab(tiny_run):
    """16 clients asking a real TensorBoard for distinct 4,096-character fonts: one cut at a
    time (on a process of its own), the rest refused (503); the tab answers all along and
    TensorBoard's memory, its cutting process included, stays bounded."""
    from conftest import tensorboard_process
    from tinymt.bench.measure import proc_status
    from tinymt.bench.serve_speed import hostile_load

    route = f"/data/plugin/{PLUGIN_NAME}"
    with tensorboard_process(tiny_run, lambda base: http_get(f"{base}{route}/runs")[0] == 200
                             ) as (base, proc):
        def rss():
            return sum(proc_status(p).get("VmRSS", 0) for p in process_tree(proc.pid)) / 1024

        load = asyncio.run(hostile_load(int(base.rsplit(":", 1)[1]), 5, rss, fonts=16,
                                        stalled=0, slowloris=0, font_path=f"{route}/font.otf",
                                        probe=("GET", f"{route}/runs", b"")))
    assert len(load["probes_ms"]) >= 4 and None not in load["probes_ms"], load["probes_ms"]
    assert set(load["fonts"]) <= {"200", "503"} and load["fonts"].get("503"), load["fonts"]
    assert load["rss_peak_mib"] - load["rss_start_mib"] < 512, load["rss_mib"]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (TensorBoard and its data server)."""
    children = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
    return [pid, *(p for c in children for p in process_tree(c))]


def peak_mib(pids: list[int], reset: bool = False) -> float:
    """The processes' summed peak resident memory (VmHWM) since the last reset, MiB;
    ``reset``: start a new peak at the present resident memory instead."""
    if reset:
        for pid in pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        return 0.0
    return sum(int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())[1])
               for pid in pids) / 1024


@pytest.mark.slow
def test_a_hostile_run_beside_a_good_one(hostile_tensorboard, tiny_run):
    """One TensorBoard on a good run and a run of forged records: every route of the good
    run answers as before; each forged record is a 422 with one line naming run, tag and
    step (a bad tag's metadata an ``error`` in /runs), answered in bounded time and
    memory; the server stays up."""
    base, proc = hostile_tensorboard
    route = f"{base}/data/plugin/{PLUGIN_NAME}"
    records = hostile_records()
    pids = process_tree(proc.pid)
    peak_mib(pids, reset=True)
    before = peak_mib(pids)  # resident now: a reset peak starts at it
    status, body = http_get(f"{route}/runs")
    assert status == 200
    runs = {r["run"]: r["probes"] for r in json.loads(body)["runs"]}
    assert list(runs) == ["bad", "good"]
    assert [(p["tag"], p["sentence"]) for p in runs["good"]] == \
        [(f"probe_{k}", pair.zh) for k, pair in enumerate(SHOWCASE)] + [("probe_2", ANY)]
    assert {p["tag"]: p.get("error") for p in runs["bad"]} == \
        {tag: BAD_META.get(tag) for tag in records}
    slowest = 0.0
    for tag, (_, steps) in records.items():  # steps are listed without reading a record
        status, body = http_get(f"{route}/steps?run=bad&tag={tag}")
        assert (status, json.loads(body)) == (200, {"steps": [s for s, _ in steps]}), tag
        if tag not in REFUSED:  # readable records (odd metadata, names, text): served
            if tag != "largest_allowed":
                assert http_get(f"{route}/step?run=bad&tag={tag}&step=1")[0] == 200, tag
            continue
        t0 = time.perf_counter()
        status, body = http_get(f"{route}/step?run=bad&tag={tag}&step={steps[0][0]}")
        slowest = max(slowest, time.perf_counter() - t0)
        assert status == 422 and len(body.splitlines()) == 1, (tag, status, body)
        assert body.decode().startswith(f"run 'bad', tag '{tag}', step {steps[0][0]}: "
                                        f"unreadable record: {REFUSED[tag]}"), body
    status, body = http_get(f"{route}/step?run=bad&tag=scale_nan&step=2")
    assert (status, body.split(b": ")[-1]) == (422, b"scale is not a positive finite number")
    refused = peak_mib(pids)
    # a lone surrogate goes out escaped: the answer is ASCII JSON
    status, body = http_get(f"{route}/step?run=bad&tag=surrogate&step=1")
    assert status == 200 and body.isascii()
    assert json.loads(body)["kinds"]["cross"]["rows"] == ["\ud800", "</s>"]
    # the largest record allowed: 16 Mi weights of 255, 67 MB of JSON
    peak_mib(pids, reset=True)
    t0 = time.perf_counter()
    status, body = http_get(f"{route}/step?run=bad&tag=largest_allowed&step=1")
    largest_s, largest = time.perf_counter() - t0, peak_mib(pids)
    assert status == 200 and body.startswith(b'{"sentence":')
    assert body.count(b"255") == (1 << 24) + 1  # every weight sent, and the scale
    peak_mib(pids, reset=True)  # again, gzipped as a browser asks for it
    request = urllib.request.Request(f"{route}/step?run=bad&tag=largest_allowed&step=1",
                                     headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert gzip.decompress(answer.read()) == body
    gzipped = peak_mib(pids)
    print(f"\nTensorBoard (+ data server): {before:.0f} MiB resident before, peak "
          f"{refused:.0f} MiB over the refused records (slowest {slowest:.2f} s), "
          f"{largest:.0f} MiB for the largest allowed ({len(body) / 1e6:.1f} MB in "
          f"{largest_s:.1f} s), {gzipped:.0f} MiB gzipped")
    # above what was resident (which holds the font-cutting process when the tab cut one)
    assert refused - before < 64 and max(largest, gzipped) - before < 384 and slowest < 5
    # the good run, after all that: the records as logged, every route
    assert proc.poll() is None
    acc = EventAccumulator(str(tiny_run), size_guidance={"tensors": 0})
    acc.Reload()
    for tag in ("probe_0", "probe_2"):
        status, body = http_get(f"{route}/steps?run=good&tag={tag}")
        assert (status, json.loads(body)) == (200, {"steps": TINY_FRAMES})
        status, body = http_get(f"{route}/step?run=good&tag={tag}&step=40")
        logged = decode(acc.Tensors(tag)[-1].tensor_proto.string_val[0])
        assert status == 200 and json.loads(body) == json.loads(json.dumps(jsonable(logged)))


# ----------------------------------------------------------------------------- /trend
TREND_HEADS = {"encoder_self": (2, 3), "decoder_self": (1, 2), "cross": (2, 2)}


def trend_document(rng, step: int, t: int = 5, kinds=tuple(TREND_HEADS)) -> dict:
    """A view document written by hand: random rows of weights (decoder rows causal),
    random gold cells (one listed twice), unrounded entropy headers; a gold row of
    ``cross`` all 0 in head (0, 1) and every gold row of ``cross`` all 0 in head (1, 1)
    (rows left out of the share; a head left without rows is null). ``encoder_self``
    has no gold."""
    toks = [f"t{i}" for i in range(t)]
    out = {}
    for kind in kinds:
        layers, heads = TREND_HEADS[kind]
        w = random_attention(rng, layers, heads, t, t + (kind == "cross"),
                             causal=kind == "decoder_self")
        w = np.rint(w * SCALE).astype(np.uint8)
        rows, cols = toks, toks + ["</s>"] * (kind == "cross")
        gold = []
        if kind != "encoder_self":
            for i in sorted(rng.choice(t, 3, replace=False)):
                for j in sorted(rng.choice(i + 1 if kind == "decoder_self" else len(cols),
                                           2 if i else 1, replace=False)):
                    gold.append([int(i), int(j), "x"])
            gold.append(list(gold[0]))  # a cell listed twice counts once
        if kind == "cross":
            gold_rows = sorted({i for i, _, _ in gold})
            w[0, 1, gold_rows[0]] = 0
            w[1, 1, gold_rows] = 0
        out[kind] = {"rows": rows, "cols": cols, "weights": w, "gold": gold,
                     "entropy": rng.uniform(0, 3, (layers, heads)).tolist()}
    return {"sentence": "猫。", "reference": None, "translation": "Cat",
            "forced": "translation", "step": step, "scale": SCALE, "kinds": out}


def brute_gold(w, gold):
    """The gold share of every head, cell by cell in plain Python."""
    cells = {(i, j) for i, j, _ in gold}
    if not cells:
        return None
    layers, heads, _, t_k = w.shape
    out = []
    for layer in range(layers):
        out.append([])
        for head in range(heads):
            shares = []
            for i in sorted({i for i, _ in cells}):
                total = sum(int(w[layer, head, i, j]) for j in range(t_k))
                if total:
                    shares.append(sum(int(w[layer, head, i, j]) for j in range(t_k)
                                      if (i, j) in cells) / total)
            out[-1].append(sum(shares) / len(shares) if shares else None)
    return out


def assert_trend(served: list, want: list | None):
    """A [layer][head] list of the route against the unrounded one: 4 decimals."""
    if want is None:
        assert served is None
        return
    assert np.shape(served) == np.shape(want)
    for s_row, w_row in zip(served, want):
        for s, w in zip(s_row, w_row):
            assert (s is None) == (w is None), (served, want)
            if w is not None:
                assert round(s, 4) == s and abs(s - w) <= 5e-5 + 1e-12, (served, want)


def trend_records(seed: int = 0):
    """``(documents by step, hostile_records' form)``: probe_0 three good records (the one
    at step 20 without decoder_self, a cross of other lengths at step 30); probe_1 good
    records around a truncated one, one whose cross has 3 heads a layer where the first
    had 2 (step 3, a document of its own), and a float tensor."""
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2

    from tinymt.viewer.summary import probe_summary

    rng = np.random.default_rng(seed)
    docs = {10: trend_document(rng, 10),
            20: trend_document(rng, 20, kinds=("encoder_self", "cross")),
            30: trend_document(rng, 30, t=7)}

    def tensor(doc):
        return probe_summary("probe_0", doc, "猫。", None).value[0].tensor

    meta = json.dumps({"version": 1, "sentence": "猫。", "reference": None}).encode()
    wide = trend_document(rng, 3)  # its cross: 3 heads a layer, not 2
    wide["kinds"]["cross"].update(weights=np.rint(random_attention(rng, 2, 3, 5, 6) * SCALE)
                                  .astype(np.uint8), entropy=[[1.0] * 3] * 2)
    truncated = tensor(docs[10])
    truncated.string_val[0] = truncated.string_val[0][:-7]
    floats = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0],
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto())
    records = {"probe_0": (meta, [(s, tensor(d)) for s, d in docs.items()]),
               "probe_1": (meta, [(1, tensor(docs[10])), (2, truncated), (3, tensor(wide)),
                                  (4, tensor(docs[30])), (5, floats)])}
    return {**docs, 3: wide}, records


@pytest.fixture(scope="module")
def trend_logdir(tmp_path_factory) -> tuple[Path, dict]:
    from conftest import write_records

    logdir = tmp_path_factory.mktemp("trend_logdir")
    docs, records = trend_records()
    (logdir / "trend").mkdir()
    write_records(logdir / "trend", records)
    return logdir, docs


@pytest.mark.slow
def test_the_trend_of_every_head_through_tensorboard(trend_logdir, tmp_path):
    """``/trend`` on a real TensorBoard: every head's gold share against a cell-by-cell
    count, its entropy the header's; a refused record and a float tensor are null at
    their step with one line each, the others right (a record whose heads are not as many
    as at the step before too); a tag without data a 404, a request without run or tag a
    400."""
    from conftest import tensorboard_process

    logdir, docs = trend_logdir
    route = f"data/plugin/{PLUGIN_NAME}"

    def ready(base):
        return all(json.loads(http_get(f"{base}/{route}/steps?run=trend&tag={tag}")[1]) == want
                   for tag, want in (("probe_0", {"steps": [10, 20, 30]}),
                                     ("probe_1", {"steps": [1, 2, 3, 4, 5]})))

    with tensorboard_process(logdir, ready) as (base, _):
        status, body = http_get(f"{base}/{route}/trend?run=trend&tag=probe_0")
        assert status == 200 and body.isascii()
        good = json.loads(body)
        status, body = http_get(f"{base}/{route}/trend?run=trend&tag=probe_1")
        assert status == 200
        mixed = json.loads(body)
        bad = {q: http_get(f"{base}/{route}/{q}")
               for q in ("trend?run=trend&tag=nope", "trend?run=nope&tag=probe_0",
                         "trend?run=trend", "trend?tag=probe_0", "trend")}

    assert good["steps"] == [10, 20, 30] and good["errors"] == []
    assert list(good["kinds"]) == ["encoder_self", "decoder_self", "cross"]
    for kind, series in good["kinds"].items():
        assert set(series) == {"entropy", "gold"}
        for k, step in enumerate(good["steps"]):
            view = docs[step]["kinds"].get(kind)
            if view is None:  # decoder_self at step 20
                assert series["entropy"][k] is None and series["gold"][k] is None
                continue
            assert series["entropy"][k] == np.round(view["entropy"], 4).tolist()
            assert_trend(series["gold"][k], brute_gold(view["weights"], view["gold"]))
    assert good["kinds"]["encoder_self"]["gold"] == [None] * 3  # no gold cells
    assert good["kinds"]["cross"]["gold"][0][1][1] is None  # every gold row all 0
    assert None not in good["kinds"]["cross"]["gold"][0][0]  # one row 0: left out
    assert good["kinds"]["decoder_self"]["entropy"][1] is None

    assert mixed["steps"] == [1, 2, 3, 4, 5]
    errors = {e["step"]: e["error"] for e in mixed["errors"]}
    assert set(errors) == {2, 5} and all(len(e.splitlines()) == 1 for e in errors.values())
    assert errors[2].startswith("unreadable record: the record is truncated")
    assert errors[5] == ("unreadable record: not a string tensor of one value "
                         "(dtype float32, shape ())")
    for kind, series in mixed["kinds"].items():
        for name in ("entropy", "gold"):
            assert [series[name][k] is None for k in (1, 4)] == [True] * 2, (kind, name)
        for k, step in ((0, 10), (2, 3), (3, 30)):
            view = docs[step]["kinds"][kind]
            assert series["entropy"][k] == np.round(view["entropy"], 4).tolist()
            assert_trend(series["gold"][k], brute_gold(view["weights"], view["gold"]))

    for query, (status, body) in bad.items():
        assert status == (404 if "tag=" in query and "run=" in query else 400), query
        assert len(body.splitlines()) == 1 and b"Traceback" not in body, (query, body)
    assert bad["trend?run=trend&tag=nope"][1] == \
        b"no attention data for run 'trend', tag 'nope'"


def in_process_tab(logdir: Path):
    """The Attention tab on TensorBoard's own data provider over ``logdir``, in process."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from tinymt.viewer import plugin

    mux = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={PLUGIN_NAME: 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    return plugin.AttentionPlugin(base_plugin.TBContext(
        data_provider=data_provider.MultiplexerDataProvider(mux, str(logdir))))


def test_a_value_json_cannot_hold_is_a_422(tmp_path):
    """A number JSON reads as infinite (``1e999``) where the reader lets any value through
    (here the translation): /step answers 422 naming run, tag and step, not a 500."""
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
    from werkzeug.test import Client

    from conftest import write_records

    head, weights = unpack(encode(small_document()))
    text = json.dumps({**head, "translation": "=1e999"}).replace('"=1e999"', "1e999")
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[
        pack(text.encode(), weights)], tensor_shape=tensor_shape_pb2.TensorShapeProto())
    meta = json.dumps({"version": 1, "sentence": "猫。", "reference": None}).encode()
    (tmp_path / "inf").mkdir()
    write_records(tmp_path / "inf", {"probe_0": (meta, [(1, tensor)])})
    answer = Client(in_process_tab(tmp_path).get_plugin_apps()["/step"]).get(
        "/?run=inf&tag=probe_0&step=1")
    assert answer.status_code == 422 and answer.data == (
        b"run 'inf', tag 'probe_0', step 1: unreadable record: Out of range float values are "
        b"not JSON compliant")


@pytest.fixture(scope="module")
def long_trend(tmp_path_factory):
    """The Attention tab over one probe of 40 steps (1..40), 18 numbers each; the
    encoder's entropy of layer 0, head 0 at step 7 the largest float (finite: it reads)."""
    from conftest import write_records
    from tinymt.viewer.summary import probe_summary

    rng = np.random.default_rng(3)
    docs = {s: trend_document(rng, s) for s in range(1, 41)}
    docs[7]["kinds"]["encoder_self"]["entropy"][0][0] = 1.7976931348623157e308
    meta = json.dumps({"version": 1, "sentence": "猫。", "reference": None}).encode()
    logdir = tmp_path_factory.mktemp("long_trend")
    (logdir / "long").mkdir()
    write_records(logdir / "long", {"probe_0": (meta, [
        (s, probe_summary("probe_0", d, "猫。", None).value[0].tensor) for s, d in docs.items()])})
    return in_process_tab(logdir)


@settings(max_examples=60)
@given(most_steps=st.integers(1, 60), most_numbers=st.integers(1, 1000))
def test_a_trend_answer_is_bounded_and_spread_evenly(long_trend, most_steps, most_numbers):
    """Whatever the bounds, ``/trend`` answers at most ``TREND_STEPS`` steps, spread evenly
    over the 40 logged (gaps differing by at most one, the first and last kept), and at most
    ``TREND_NUMBERS`` numbers (the first step always): the later steps past it left out. A
    number that is not finite (an entropy near the float range rounds to infinity) is
    null at its point alone."""
    from unittest.mock import patch

    from werkzeug.test import Client

    from tinymt.viewer import plugin

    with patch.object(plugin, "TREND_STEPS", most_steps), \
            patch.object(plugin, "TREND_NUMBERS", most_numbers):
        answer = Client(long_trend.get_plugin_apps()["/trend"]).get("/?run=long&tag=probe_0")
    assert answer.status_code == 200
    trend = json.loads(answer.data)
    steps, kinds = trend["steps"], trend["kinds"]
    numbers = sum(len(row) for kind in kinds.values() for series in kind.values()
                  for heads in series if heads is not None for row in heads)
    assert trend["logged"] == 40 and trend["errors"] == []
    assert steps and steps[0] == 1 and steps == sorted(set(steps))
    assert len(steps) <= most_steps and (numbers <= most_numbers or len(steps) == 1)
    if len(steps) == min(most_steps, 40):  # all that was picked: evenly spread
        assert steps[-1] == (40 if most_steps > 1 else 1)
        gaps = np.diff(steps)
        assert len(gaps) == 0 or gaps.max() - gaps.min() <= 1
    else:  # cut where the next step's 18 numbers would not fit
        assert numbers + 18 > most_numbers
    if 7 in steps:
        entropy = kinds["encoder_self"]["entropy"][steps.index(7)]
        assert entropy[0][0] is None and all(v is not None for v in entropy[0][1:])


# ----------------------------------------------------------------------------- HTML file
def test_translate_writes_one_self_contained_page(tiny_run, tmp_path):
    target = tmp_path / "view" / "maps.html"
    sentences = [SHOWCASE[0].zh, "他喜欢猫吗？"]
    result = translate(compose_translate(f"run={tiny_run}", f"attention={target}"), sentences)
    page = target.read_text(encoding="utf-8")
    assert not list(target.parent.glob(".*tmp*"))  # written whole
    assert "function mountView" in page
    # nothing fetched: the only URLs are XML namespace names
    assert set(re.findall(r"https?://[^\s\"'`)]+", page)) <= {
        "http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
    font = re.search(r'url\(data:font/otf;base64,([A-Za-z0-9+/=]+)\)', page)
    assert base64.b64decode(font.group(1))[:4] == b"OTTO"
    assert len(page) < 2_000_000  # the font is cut to the page's characters
    data = inline_data(page)
    probes = data["runs"][0]["probes"]
    assert [p["sentence"] for p in probes] == sentences
    run = load_run(str(tiny_run), "best", "cpu")
    step = int(run.state["step"])
    for k, sentence in enumerate(sentences):
        doc = data["docs"][f"{data['runs'][0]['run']}\u0000probe_{k}\u0000{step}"]
        assert doc["translation"] == result["translations"][k] and doc["forced"] == "translation"
        src = run.src_tokenizer.encode(normalize(sentence))
        # the pieces the model produced (a barely trained model's text need not re-encode
        # to them), which decode to its translation
        out = [run.tgt_tokenizer.sp.piece_to_id(p) for p in doc["kinds"]["cross"]["rows"][:-1]]
        assert run.tgt_tokenizer.decode(out) == doc["translation"]
        assert doc["kinds"]["encoder_self"]["rows"] == run.src_tokenizer.pieces(src) + ["</s>"]
        assert_weights_match(doc["kinds"], collect_attention(run.model, src, out))
    # the showcase sentence brings its source-side gold; the other sentence has none
    assert data["docs"][f"{data['runs'][0]['run']}\u0000probe_0\u0000{step}"]["kinds"][
        "encoder_self"]["gold"]
    assert not any(v["gold"] for v in data["docs"][
        f"{data['runs'][0]['run']}\u0000probe_1\u0000{step}"]["kinds"].values())


class _Terminal(io.StringIO):
    """Lines typed at a terminal (translate.py's interactive mode)."""

    def isatty(self) -> bool:
        return True


def test_the_page_of_an_interactive_session_keeps_every_sentence(tiny_run, tmp_path):
    """translate.py attention=x.html, sentences typed one at a time: the page kept only the
    last one; now each typed sentence is one more probe of the page."""
    target = tmp_path / "typed.html"
    typed = [SHOWCASE[0].zh, "他喜欢猫吗？", "韩梅梅明天会在图书馆里看三本书。"]
    result = translate(compose_translate(f"run={tiny_run}", f"attention={target}"),
                       stdin=_Terminal("\n".join(typed) + "\n"), stdout=io.StringIO())
    assert len(result["translations"]) == 3
    data = inline_data(target.read_text(encoding="utf-8"))
    assert [p["sentence"] for p in data["runs"][0]["probes"]] == typed


def test_the_tab_is_registered_as_a_tensorboard_plugin():
    """The entry point of pyproject.toml names our loader, and TensorBoard's own plugin
    discovery finds it (what ``tensorboard --logdir`` uses)."""
    from tensorboard import default

    from tinymt.viewer.plugin import AttentionLoader

    assert AttentionLoader in default.get_dynamic_plugins()
    assert 'tinymt_attention = "tinymt.viewer.plugin:AttentionLoader"' in \
        (REPO_ROOT / "pyproject.toml").read_text()


def test_every_logged_step_is_kept_unless_the_user_says_otherwise():
    """TensorBoard keeps a random 10 steps per tag of a plugin it does not know; the loader
    asks for all of ours (0), and leaves an explicit --samples_per_plugin alone."""
    import argparse

    from tinymt.viewer.plugin import AttentionLoader

    flags = argparse.Namespace(samples_per_plugin={"images": 5})
    AttentionLoader().fix_flags(flags)
    assert flags.samples_per_plugin == {"images": 5, PLUGIN_NAME: 0}
    flags = argparse.Namespace(samples_per_plugin={PLUGIN_NAME: 3})
    AttentionLoader().fix_flags(flags)
    assert flags.samples_per_plugin == {PLUGIN_NAME: 3}


@pytest.mark.slow
def test_without_the_png_grids_the_tab_still_gets_every_head(tmp_path):
    from tinymt.trainer import train

    train(compose_train(tmp_path, "trainer.max_steps=10", "trainer.valid_every=10",
                        "trainer.attention_images=false", "trainer.test_beam=1"))
    acc = EventAccumulator(str(tmp_path / "run"), size_guidance={"tensors": 0, "images": 0})
    acc.Reload()
    assert not acc.Tags()["images"]
    assert sorted(t for t in acc.Tags()["tensors"] if t.startswith("probe_")) == \
        ["probe_0", "probe_1", "probe_2"]
    assert [e.step for e in acc.Scalars("logging/attention_png_seconds")] == [10]
    assert acc.Scalars("logging/attention_png_seconds")[0].value == 0
