"""Head analysis on real (tiny) runs: importance, gating = removing a layer's heads,
statistics and alignment error rates of constructed attention worked out by hand, pruned
checkpoints that differ from their run's in the masked heads only, the analysis end to end
(report, PNGs; the suite's one analysis, ``head_analysis`` in conftest) and
its one-line errors (the script's own: tests/test_cli_errors.py)."""

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import tinymt.config  # noqa: F401
from conftest import (
    QUIET,
    FixedAttention,
    analyze_cfg,
    compose_train,
    compose_translate,
    copy_run,
    pruned_heads,
    run_script_in_process,
)
from tinymt import KINDS
from tinymt.batching import collate
from tinymt.checkpoint import load_checkpoint, save_checkpoint
from tinymt.config import ModelConfig
from tinymt.decoding import greedy_decode, translate_ids
from tinymt.errors import TinyMTError
from tinymt.heads import (
    alignment_summary,
    all_heads,
    analyze,
    attention_pass,
    head_importance,
    head_labels,
    load_sentences,
    normalize_importance,
)
from tinymt.heads.gates import gated_heads, gates_without, head_shapes, prune_weights
from tinymt.heads.pruning import prunable, prune_counts, prune_order
from tinymt.heads.stats import AlignmentCounts, aer, attention_links
from tinymt.model import Transformer
from tinymt.rundir import checkpoint_path, load_run
from tinymt.translate import translate
from tinymt.words import piece_word_weights, pieces_to_words


def one_hot(mapping, n_words: int) -> np.ndarray:
    """``(len(mapping), n_words)`` weights of a hard position -> word map (-1: none)."""
    out = np.zeros((len(mapping), n_words))
    for i, w in enumerate(mapping):
        if w >= 0:
            out[i, w] = 1.0
    return out


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def loaded(tiny_run):
    run = load_run(str(tiny_run), "best", "cpu")
    sents, _, _ = load_sentences(run, "valid", 0, QUIET)
    return run, sents


# ----------------------------------------------------------------------------- importance
def test_importance_equals_per_sentence_gradients(loaded):
    """One backward with per-sentence gates = the sum of each sentence's own |dL/dgate|."""
    run, sents = loaded
    model = run.model
    src, tgt = sents.src_ids[:5], sents.tgt_ids[:5]
    fast = head_importance(model, src, tgt, batch_tokens=10_000)
    total = {k: torch.zeros(shape, dtype=torch.float64) for k, shape in head_shapes(model).items()}
    n_tok = 0
    for s, t in zip(src, tgt):
        gates = {k: torch.ones(shape, requires_grad=True) for k, shape in head_shapes(model).items()}
        b = collate([s], [t])
        with gated_heads(model, gates):
            logits = model.logits(model(b.src, b.tgt_in)[0])
        torch.nn.functional.cross_entropy(logits[0], b.tgt_out[0], reduction="sum").backward()
        for k in KINDS:
            total[k] += gates[k].grad.abs().double()
        n_tok += len(t) + 1
    for k in KINDS:
        np.testing.assert_allclose(fast[k], (total[k] / n_tok).numpy(), rtol=1e-4, atol=1e-9)
        assert (fast[k] > 0).all()


def test_importance_of_a_head_masked_in_training_is_zero(loaded):
    """A fresh model trained a few dozen steps with two heads gated off: those heads' W_O
    columns never learn; pruned (their W_O columns zeroed, as a pruned checkpoint stores
    them), their importance is exactly 0; every other head's is > 0."""
    run, sents = loaded
    torch.manual_seed(0)
    cfg = OmegaConf.create(OmegaConf.to_container(run.model.config))
    model = Transformer(cfg, run.model.src_vocab_size, run.model.tgt_vocab_size,
                        run.model.shared_vocab)
    off = gates_without(model, [("encoder_self", 1, 0), ("cross", 0, 1)])
    d_head = cfg.d_model // cfg.n_heads
    w_o = model.encoder_layers[1].self_attn.out_proj.weight
    before = w_o[:, :d_head].detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    src, tgt = sents.src_ids[:48], sents.tgt_ids[:48]
    losses = []
    for step in range(30):
        idx = [(step * 8 + i) % len(src) for i in range(8)]
        b = collate([src[i] for i in idx], [tgt[i] for i in idx])
        with gated_heads(model, off):
            logits = model.logits(model(b.src, b.tgt_in)[0])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b.tgt_out,
                                                 ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0  # it did learn
    assert torch.equal(w_o[:, :d_head], before)  # the masked head's W_O never moved
    masked = [("encoder_self", 1, 0), ("cross", 0, 1)]
    model.load_state_dict(prune_weights(model.state_dict(), masked, cfg.n_heads))
    assert sorted(pruned_heads(model)) == sorted(masked)
    imp = head_importance(model, src, tgt)
    assert imp["encoder_self"][1, 0] == 0.0 and imp["cross"][0, 1] == 0.0
    others = [imp[k][layer, h] for k, layer, h in all_heads(model)
              if (k, layer, h) not in {("encoder_self", 1, 0), ("cross", 0, 1)}]
    assert min(others) > 1e-4
    # masked heads go first in the pruning order
    assert set(prune_order(normalize_importance(imp))[:2]) == {("encoder_self", 1, 0),
                                                               ("cross", 0, 1)}


def test_importance_of_a_head_with_zero_output_weights_is_zero(loaded):
    """Constructed directly: a head whose W_O columns are zero contributes nothing."""
    run, sents = loaded
    model = run.model
    layer = model.decoder_layers[0].cross_attn
    d_head = layer.d_head
    saved = layer.out_proj.weight.detach().clone()
    try:
        with torch.no_grad():
            layer.out_proj.weight[:, d_head:] = 0.0  # head 1 of cross layer 0
        imp = head_importance(model, sents.src_ids[:20], sents.tgt_ids[:20])
    finally:
        with torch.no_grad():
            layer.out_proj.weight.copy_(saved)
    assert imp["cross"][0, 1] < 1e-7 * imp["cross"][0, 0]
    assert all((imp[k] > 0).all() for k in ("encoder_self", "decoder_self"))


def test_normalisation_and_order():
    raw = {"encoder_self": np.array([[3.0, 4.0], [0.0, 0.0]]), "decoder_self": np.array([[1.0, 1.0]]),
           "cross": np.array([[0.0, 2.0]])}
    norm = normalize_importance(raw)
    np.testing.assert_allclose(norm["encoder_self"], [[0.6, 0.8], [0.0, 0.0]])
    np.testing.assert_allclose(np.linalg.norm(norm["decoder_self"], axis=1), [1.0])
    order = prune_order(norm)
    assert order[:3] == [("encoder_self", 1, 0), ("encoder_self", 1, 1), ("cross", 0, 0)]
    assert prune_order(norm, ("cross",)) == [("cross", 0, 0), ("cross", 0, 1)]
    assert prune_counts(10, 0.1) == list(range(11))
    assert prune_counts(2, 0.1) == [0, 1, 2]
    assert prune_counts(7, 0.5) == [0, 4, 7]
    assert prunable([(0, 30.0), (2, 29.5), (4, 28.5), (6, 29.9)], 30.0) == 2


# ----------------------------------------------------------------------------- gates
def _tiny_model(bias: bool) -> Transformer:
    torch.manual_seed(3)
    cfg = ModelConfig(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32,
                      dropout=0.0, max_positions=32)
    model = Transformer(cfg, 23, 23, True).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.3 if bias else 0.0)
    return model


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind,layer", [("encoder_self", 1), ("decoder_self", 0), ("cross", 1)])
def test_gating_all_heads_of_a_layer_removes_its_attention(kind, layer, bias):
    """Gates of 0 for every head of one layer = that attention sub-layer's output replaced,
    by a forward hook (the independent reference), with zeros plus W_O's bias (a constant
    vector, no head's doing: with zero biases, exactly zeros)."""
    model = _tiny_model(bias)
    src = torch.tensor([[5, 9, 7, 11, 3], [6, 8, 3, 0, 0]])
    tgt = torch.tensor([[2, 12, 13, 14], [2, 15, 16, 0]])
    gates = {k: torch.ones(2, 2, dtype=torch.float64) for k in KINDS}
    gates[kind][layer] = 0.0
    with gated_heads(model, gates):
        gated, _ = model(src, tgt)
    plain, _ = model(src, tgt)
    owner = model.encoder_layers[layer] if kind == "encoder_self" else model.decoder_layers[layer]
    module = owner.cross_attn if kind == "cross" else owner.self_attn

    def no_heads(mod, args, out):
        y, w = out
        return (torch.zeros_like(y) + (mod.out_proj.bias if bias else 0.0), w)

    handle = module.register_forward_hook(no_heads)
    try:
        reference, _ = model(src, tgt)
    finally:
        handle.remove()
    torch.testing.assert_close(gated, reference, atol=1e-12, rtol=0)
    assert not torch.allclose(gated, plain)
    # zeroing the heads' W_O columns does the same
    heads = [(kind, layer, h) for h in range(2)]
    model.load_state_dict(prune_weights(model.state_dict(), heads, 2))
    torch.testing.assert_close(model(src, tgt)[0], reference, atol=1e-12, rtol=0)
    assert sorted(pruned_heads(model)) == heads


# ----------------------------------------------------------------------------- alignment
def test_pieces_to_words():
    # English: pieces start with ▁ at word starts; punctuation is a word of its own
    words = ["This", "boy", "knows", "Xi'an", "."]
    pieces = ["▁This", "▁bo", "y", "▁know", "s", "▁Xi", "'", "an", "."]
    assert pieces_to_words(pieces, words) == [0, 1, 1, 2, 2, 3, 3, 3, 4]
    # a bare ▁ goes with the next piece; specials map to nothing
    assert pieces_to_words(["▁", "This", "▁boy", "</s>"], ["This", "boy"]) == [0, 0, 1, -1]
    # Chinese: no spaces; pieces may span words (majority, first on a tie) or split them
    zh = ["我", "请", "李雷", "帮", "我", "订", "了", "机票", "。"]
    pz = ["▁我请", "李", "雷帮", "我", "订了", "机", "票", "。"]
    assert pieces_to_words(pz, zh) == [0, 2, 2, 4, 5, 7, 7, 8]
    # NFKC: a full-width question mark in the words, ASCII in the pieces
    assert pieces_to_words(["▁他", "喜欢", "猫", "吗", "?"], ["他", "喜欢", "猫", "吗", "？"]) == \
        [0, 1, 2, 3, 4]
    # robust: an <unk> piece (characters lost) maps to nothing, the rest still map
    assert pieces_to_words(["▁I", "▁like", "<unk>", "▁cats"], ["I", "like", "Ω", "cats"]) == \
        [0, 1, -1, 3]


def test_aer_formula_and_null():
    assert aer(3, 3, 3) == 0.0 and aer(0, 4, 3) == 1.0
    assert aer(2, 3, 4) == pytest.approx(1 - 4 / 7)
    # 2 source words + EOS (NULL) -> 2 target words + EOS row
    attn = np.array([[0.7, 0.2, 0.1],    # target word 0 -> source word 0
                     [0.1, 0.2, 0.7],    # target word 1: NULL wins -> no link
                     [0.0, 0.0, 1.0]])   # EOS row (unmapped)
    hard = one_hot([0, 1, -1], 2)
    links = attention_links(attn, hard, hard)
    assert links.tolist() == [[True, False], [False, False]]
    # per head at once, and ties give several links
    two = np.stack([attn, np.array([[0.4, 0.4, 0.2], [0.1, 0.8, 0.1], [0, 0, 1.0]])])
    links = attention_links(two, hard, hard)
    assert links[1].tolist() == [[True, False], [True, True]]


def _constructed_attention(src_w, tgt_w, gold, wrong: bool) -> np.ndarray:
    """Piece-level cross-attention put on each target word's gold source words (1/k of the
    mass each, spread over the pieces holding them) or, ``wrong``, on one source word that
    is not gold-aligned to it; rows of EOS / unaligned target words look at the source EOS."""
    S, T = src_w.shape[0], tgt_w.shape[0]
    attn = np.zeros((T, S))
    n_src = src_w.shape[1]
    for t in range(T):
        j = int(tgt_w[t].argmax()) if tgt_w[t].sum() > 0 else -1
        linked = sorted({i for i, jj in gold if jj == j}) if j >= 0 else []
        if wrong and linked:
            linked = [i for i in range(n_src) if i not in linked][:1]
        if not linked:
            attn[t, S - 1] = 1.0
            continue
        for i in linked:
            pieces = np.nonzero(src_w[:, i])[0]
            attn[t, pieces] += 1.0 / len(linked) / len(pieces)
    return attn


def test_aer_is_zero_on_gold_attention_and_one_on_wrong(loaded):
    """Real sentences, real tokenizer, real piece->word mapping: attention forced onto the
    gold alignment gives AER 0 (ties link every gold word), onto non-gold words AER 1 --
    exactly on sentences whose pieces each lie inside one word; where a piece spans two
    words (Chinese BPE merges) the subword model cannot tell them apart, so nearly."""
    run, sents = loaded
    w = sents.words
    usable = [i for i, m in enumerate(w["src_weights"]) if m is not None]
    assert len(usable) >= 40
    clean, everything = AlignmentCounts.zeros(1, 3), AlignmentCounts.zeros(1, 3)
    n_clean = 0
    for i in usable:
        src_w, tgt_w, gold = w["src_weights"][i], w["tgt_weights"][i], w["alignment"][i]
        # every word has pieces (the mapping covers the sentence); EOS belongs to no word
        assert (src_w.sum(0) > 0).all() and (tgt_w.sum(0) > 0).all()
        assert src_w[-1].sum() == 0 and tgt_w[-1].sum() == 0
        np.testing.assert_allclose(src_w[:-1].sum(1), 1.0)
        on_eos = np.zeros((len(tgt_w), len(src_w)))
        on_eos[:, -1] = 1.0  # everything on the source EOS (NULL)
        heads = np.stack([_constructed_attention(src_w, tgt_w, gold, False),
                          _constructed_attention(src_w, tgt_w, gold, True), on_eos])
        everything.add(heads[None], src_w, tgt_w, gold)
        if ((src_w > 0).sum(1) <= 1).all() and ((tgt_w > 0).sum(1) <= 1).all():
            clean.add(heads[None], src_w, tgt_w, gold)
            n_clean += 1
    assert n_clean >= 20
    head_aer = clean.aer(clean.heads)
    assert head_aer[0, 0] == 0.0
    assert head_aer[0, 1] == 1.0
    assert head_aer[0, 2] == 1.0 and clean.heads[0, 2, 1] == 0  # NULL only: no links
    all_aer = everything.aer(everything.heads)
    assert all_aer[0, 0] < 0.05 and all_aer[0, 1] > 0.95 and all_aer[0, 2] == 1.0
    assert 0.0 < everything.oracle_aer < 0.5


def test_piece_word_weights_split_spanning_pieces():
    w = piece_word_weights(["▁一个", "人", "。"], ["一", "个", "人", "。"])
    np.testing.assert_allclose(w, [[0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    np.testing.assert_allclose(one_hot([1, -1, 0], 2), [[0, 1], [0, 0], [1, 0]])
    # target word "a" attends to the piece 一个: both source words tie -> two links
    attn = np.array([[0.9, 0.0, 0.0, 0.1]])  # one target piece; source: 一个 人 。 EOS
    src = np.concatenate([w, np.zeros((1, 4))])
    links = attention_links(attn, src, np.ones((1, 1)))
    assert links[:, 0].tolist() == [True, True, False, False]


# ----------------------------------------------------------------------------- constructed
def _uniform(n_q: int, n_k: int) -> list:
    return [[[1.0 / n_k] * n_k] * n_q] * 2


T3 = 1 / 3
# One sentence: 2 source pieces + EOS (3 keys), 3 target pieces after BOS (4 decoder rows).
STATS_ATTENTION = {
    "encoder_self": [[[1, 0, 0], [0, 1, 0], [0, 0, 1]],            # head 0: itself
                     [[0, 1, 0], [0, 0, 1], [0, .5, .5]]],         # head 1: mostly next
    "decoder_self": [[[1, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]],  # previous
                     [[1, 0, 0, 0], [.5, .5, 0, 0], [T3, T3, T3, 0], [0, 0, .5, .5]]],
    "cross": [[[T3, T3, T3]] * 4,                                  # head 0: uniform
              [[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]],       # head 1: one key a row
}
L2, L3 = math.log(2), math.log(3)
# Means worked out by hand, [head 0, head 1]. Entropy and distance are means over every
# query row; norm_entropy (entropy / log(number of keys)), offset, the masses at -1 / 0 / +1
# and on the sink (</s>; the decoder's <s>) over the rows with more than one key (all but the
# decoder's BOS row 0).
STATS_EXPECTED = {
    # 3 x 3, diagonal j* = i, distance |j - i| / 3. Head 1 rows: offsets +1, +1, (-1 + 0)/2
    "encoder_self": {
        "entropy": [0, (0 + 0 + L2) / 3],                       # 0.2310
        "norm_entropy": [0, (L2 / L3) / 3],                     # 0.2103
        "distance": [0, (1 / 3 + 1 / 3 + .5 * 1 / 3) / 3],      # 5/18
        "offset": [0, (1 + 1 - .5) / 3],                        # 0.5
        "prev": [0, (0 + 0 + .5) / 3], "same": [1, (0 + 0 + .5) / 3],
        "next": [0, (1 + 1 + 0) / 3],                           # 2/3 >= 0.5: next
        "sink": [1 / 3, (0 + 1 + .5) / 3]},                     # column 2, </s>: 1/2 < 2/3
    # 4 x 4 causal, j* = i, distance |j - i| / 4; row i has i + 1 keys
    "decoder_self": {
        "entropy": [0, (0 + L2 + L3 + L2) / 4],                 # ln 12 / 4 = 0.6212
        "norm_entropy": [0, (L2 / L2 + L3 / L3 + L2 / math.log(4)) / 3],  # 5/6 >= 0.8
        # head 0: rows 1-3 one step back; head 1: row 1 .5 * 1/4, row 2 1/3 * (2/4 + 1/4),
        # row 3 .5 * 1/4
        "distance": [(0 + 3 * 1 / 4) / 4, (.5 / 4 + (3 / 4) / 3 + .5 / 4) / 4],  # 3/16, 1/8
        "offset": [-1, (-.5 + (-2 - 1) / 3 - .5) / 3],          # -1, -2/3
        "prev": [1, (.5 + T3 + .5) / 3], "same": [0, (.5 + T3 + .5) / 3],  # 4/9 < 0.5
        "next": [0, 0], "sink": [1 / 3, (.5 + T3 + 0) / 3]},     # column 0, <s>: 5/18
    # 4 rows x 3 keys: j*_i = (i + 1/2) * 3/4 - 1/2 = -1/8, 5/8, 11/8, 17/8; distance
    # |j - j*_i| / 3. Uniform: rows (1/8 + 9/8 + 17/8) / 9, (5/8 + 3/8 + 11/8) / 9, ...;
    # head 1: |0 + 1/8|, |0 - 5/8|, |1 - 11/8|, |2 - 17/8|, each / 3
    "cross": {
        "entropy": [L3, 0],
        "norm_entropy": [1, 0],
        "sink": [1 / 3, 1 / 4],                                  # column 2, </s>
        "distance": [(27 + 19 + 19 + 27) / 72 / 4,              # 23/72 = 0.3194
                     (1 / 8 + 5 / 8 + 3 / 8 + 1 / 8) / 3 / 4]}, # 5/48
}
STATS_LABELS = {"encoder_self": [["self", "next"]],
                "decoder_self": [["previous", "diffuse"]],
                "cross": [["diffuse", "content"]]}


def test_attention_statistics_of_constructed_attention():
    """attention_pass + AttentionStats.means on one sentence whose attention is written
    out above, against means worked out by hand; and the labels they give."""
    model = FixedAttention(STATS_ATTENTION)
    stats, counts, relations = attention_pass(model, [[5, 6]], [[7, 8, 9]])
    assert counts is None and relations is None
    means = stats.means()
    assert set(means) == set(KINDS)
    for kind, expected in STATS_EXPECTED.items():
        assert set(means[kind]) == set(expected), kind
        for name, heads in expected.items():
            assert means[kind][name].shape == (1, 2)
            np.testing.assert_allclose(means[kind][name][0], heads, rtol=1e-6, atol=1e-7,
                                       err_msg=f"{kind} {name}")
        assert head_labels(means[kind], kind) == STATS_LABELS[kind]


# 3 source words + EOS, 3 target words (+ the EOS row); one piece per word; gold: i <-> i.
# Head 0 links t0-s0, t1-s1, t2-s0: 2 of 3 right, AER = 1 - 2*2 / (3 + 3) = 1/3.
# Head 1 links t0-s0, t2-s2 (t1: EOS = NULL wins, no link): AER = 1 - 2*2 / (2 + 3) = 1/5.
# Their mean (the layer's, and with one layer every head's, average) links all three:
# rows (.65 .15 .1 .1), (.1 .45 .1 .35), (.35 .1 .4 .15) -> AER 0.
ALIGN_CROSS = [[[.7, .1, .1, .1], [.1, .6, .1, .2], [.6, .1, .2, .1], [0, 0, 0, 1]],
               [[.6, .2, .1, .1], [.1, .3, .1, .5], [.1, .1, .6, .2], [0, 0, 0, 1]]]


def test_alignment_error_rates_of_constructed_attention():
    model = FixedAttention({"encoder_self": _uniform(4, 4), "decoder_self": _uniform(4, 4),
                            "cross": ALIGN_CROSS})
    words = one_hot([0, 1, 2, -1], 3)  # piece -> word, EOS: none (both sides)
    _, counts, _ = attention_pass(model, [[5, 6, 7]], [[8, 9, 10]],
                               words={"src_weights": [words], "tgt_weights": [words],
                                      "alignment": [[(0, 0), (1, 1), (2, 2)]]})
    assert counts.heads.tolist() == [[[2, 3], [2, 2]]]  # (hits, links) per head
    a = alignment_summary(counts)
    np.testing.assert_allclose(a["aer"], [[1 / 3, 1 / 5]])
    assert a["best_head"] == (0, 1) and a["best_aer"] == pytest.approx(1 / 5)
    assert a["layer_average_aer"].tolist() == [0.0] and a["average_aer"] == 0.0
    assert a["gold_links"] == 3 and a["oracle_aer"] == 0.0


# ----------------------------------------------------------------------------- pruning
def test_pruned_checkpoint_differs_in_the_masked_heads_only(head_analysis):
    """The pruned checkpoint against its run's: head masks 0 exactly at the heads it lists
    (the least important half) and 1 elsewhere, every other tensor identical; its model
    computes what the unpruned one does with those heads' gates at 0."""
    run_dir, r = head_analysis
    p = r["pruned"]
    assert Path(p["path"]) == checkpoint_path(run_dir, "pruned")
    pruned_ckpt = load_checkpoint(p["path"])
    plain_ckpt = load_checkpoint(checkpoint_path(run_dir, "best"))
    masked = {tuple(h) for h in pruned_ckpt["pruned"]["heads"]}
    assert masked == set(p["heads"]) and len(masked) == p["n_masked"] == 4  # 0.5 of 8
    importance = {(k, layer, h): v for k in KINDS
                  for (layer, h), v in np.ndenumerate(r["importance"][k])}
    assert max(importance[h] for h in masked) <= \
        min(v for h, v in importance.items() if h not in masked)
    state, plain_state = pruned_ckpt["model"], plain_ckpt["model"]
    assert state.keys() == plain_state.keys()
    changed = {name for name, tensor in plain_state.items() if not torch.equal(state[name], tensor)}
    assert changed == {name for name in plain_state if name.endswith(".out_proj.weight")
                       and any(name.startswith(_owner(k, layer)) for k, layer, _ in masked)}
    assert pruned_ckpt["model_config"] == plain_ckpt["model_config"]
    assert "optimizer" in plain_ckpt and "optimizer" not in pruned_ckpt

    pruned = load_run(str(run_dir), p["path"], "cpu")
    plain = load_run(str(run_dir), "best", "cpu")
    gates = gates_without(plain.model, masked)
    assert sorted(pruned_heads(pruned.model)) == sorted(masked)
    sents, _, _ = load_sentences(plain, "valid", 30, QUIET)
    b = collate(sents.src_ids[:8], sents.tgt_ids[:8])
    masked_logits, _ = pruned.model(b.src, b.tgt_in)
    with gated_heads(plain.model, gates):
        gated_logits, _ = plain.model(b.src, b.tgt_in)
    torch.testing.assert_close(masked_logits, gated_logits, atol=1e-5, rtol=0)
    assert not torch.allclose(masked_logits, plain.model(b.src, b.tgt_in)[0], atol=1e-3)
    # translations: the pruned checkpoint = the unpruned model with the same gates
    outs = translate_ids(pruned.model, sents.src_ids)
    for i, o in enumerate(outs):
        with gated_heads(plain.model, gates):
            ref = greedy_decode(plain.model, collate([sents.src_ids[i]], [[]]).src)[0]
        assert o[0][0] == ref
    # pruning BLEU: the "all" curve at 4 masked heads is the pruned model's BLEU
    assert dict((n, b) for n, _, b in r["pruning"]["curves"]["all"])[4] == \
        pytest.approx(p["bleu"])


def _owner(kind, layer):
    side = "encoder" if kind == "encoder_self" else "decoder"
    return f"{side}_layers.{layer}.{'cross_attn' if kind == 'cross' else 'self_attn'}."


SENTENCES = ["我请李雷帮我订了去北京的机票。", "他喜欢猫吗？", "这个男孩认识西安。"]


def test_translate_translates_with_the_pruned_checkpoint(head_analysis):
    """translate with checkpoint=<pruned> prints the pruned model's translations (greedy,
    the default)."""
    run_dir, r = head_analysis
    out = io.StringIO()
    translate(compose_translate(f"run={run_dir}", f"checkpoint={r['pruned']['path']}"),
              SENTENCES, stdout=out)
    pruned = load_run(str(run_dir), r["pruned"]["path"], "cpu")
    outs = translate_ids(pruned.model, pruned.src_tokenizer.encode_batch(SENTENCES))
    assert out.getvalue().splitlines() == [pruned.tgt_tokenizer.decode(o[0][0]) for o in outs]


def test_analysis_results(head_analysis, loaded):
    run_dir, r = head_analysis
    assert r["sentences"] == 30 and r["n_heads"] == 8
    assert r["shapes"] == {"encoder_self": (2, 2), "decoder_self": (1, 2), "cross": (1, 2)}
    for k in KINDS:
        np.testing.assert_allclose(np.linalg.norm(r["importance"][k], axis=1), 1.0, rtol=1e-6)
        assert r["stats"][k]["entropy"].shape == r["shapes"][k]
    curves = r["pruning"]["curves"]
    assert set(curves) == {"all", *KINDS}
    assert [n for n, _, _ in curves["all"]] == list(range(9))
    assert all(pts[0][2] == r["pruning"]["base"] for pts in curves.values())
    # the alignment counts every gold link of the 30 sentences (none is too long here);
    # one link per target word with a gold link is the oracle
    gold = loaded[1].words["alignment"][:30]
    assert all(g is not None for g in gold)
    n_gold = sum(len(g) for g in gold)
    n_linked = sum(len({t for _, t in g}) for g in gold)
    a = r["alignment"]
    assert a["aer"].shape == (1, 2) and a["layer_average_aer"].shape == (1,)
    assert a["gold_links"] == n_gold
    assert a["oracle_aer"] == pytest.approx(1 - 2 * n_linked / (n_linked + n_gold))


# ----------------------------------------------------------------------------- the report
def test_report_and_figures(head_analysis):
    run_dir, _ = head_analysis
    report = (run_dir / "heads.md").read_text(encoding="utf-8")
    for section in ("## 1. Importance", "## 2. Pruning", "## 3. Cross-attention",
                    "## 4. Entropy and distance", "Best head:", "pruned.pt"):
        assert section in report, section
    for name in [f"importance_{k}.png" for k in KINDS] + ["pruning.png", "aer_cross.png",
                                                          "entropy_vs_distance.png"]:
        png = run_dir / "heads" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"](heads/{name})" in report
    assert not list(run_dir.glob("events.out.tfevents.*.heads"))  # the report is the output


def test_bad_options_are_errors(tiny_run):
    for overrides, words in ((["split=train"], "split"), (["prune_step=0"], "prune_step"),
                             (["prune=1.5"], "prune"), (["prune_output=x.pt"], "set prune="),
                             (["prune=0.5", "prune_output="], "prune_output=: empty")):
        with pytest.raises(TinyMTError, match=words):
            analyze(analyze_cfg(tiny_run, *overrides), progress=False, log=QUIET)


def test_a_run_from_elsewhere_is_analysed_with_its_data_rebuilt_here(tiny_run, tmp_path):
    """A run whose checkpoint names a data cache this machine cannot make (another machine's
    folder): refused in one line, and analysed with ``cache_dir=`` a folder of this one."""
    run = copy_run(tiny_run, tmp_path / "run")
    best = run / "checkpoints" / "best.pt"
    state = load_checkpoint(best)
    state["config"]["data"]["cache_dir"] = "/proc/elsewhere/cache"
    save_checkpoint(state, best)
    with pytest.raises(TinyMTError, match="data.cache_dir='/proc/elsewhere/cache'"):
        analyze(analyze_cfg(run, "max_sentences=4", "pruning=false"), progress=False, log=QUIET)
    out = analyze(analyze_cfg(run, "max_sentences=4", "pruning=false",
                              f"cache_dir={tmp_path / 'here'}"), progress=False, log=QUIET)
    assert out["sentences"] == 4 and any((tmp_path / "here").iterdir())


def test_an_empty_output_of_a_run_s_tool_is_refused(tiny_run, capsys):
    """``output=`` (empty) names no file: one line, not the default file written."""
    status, err = run_script_in_process("average_checkpoints", [f"run={tiny_run}", "output="],
                                        capsys)
    assert (status, err.strip()) == (2, "error: output=: empty: name a file or folder "
                                        "(nothing was written)")


@pytest.mark.slow
def test_data_without_gold_alignments_skips_aer(tmp_path, text_corpus):
    cfg = compose_train(tmp_path, "data.source=text", f"data.path={text_corpus}",
                        "data.src_lang=de", "data.tgt_lang=en", "data.vocab_size=40",
                        "data.valid_split=valid",
                        "trainer.max_steps=6", "trainer.valid_every=6", "trainer.test_beam=1")
    from tinymt.trainer import train

    train(cfg)
    r = analyze(analyze_cfg(tmp_path / "run", "prune_step=0.5"), progress=False, log=QUIET)
    assert r["alignment"] is None and "gold word alignments" in r["alignment_note"]
    report = (tmp_path / "run" / "heads.md").read_text(encoding="utf-8")
    assert "Skipped: no gold word alignments" in report
    assert not (tmp_path / "run" / "heads" / "aer_cross.png").exists()
    assert r["pruning"]["curves"]["all"][0][0] == 0


@pytest.mark.parametrize("target", ["checkpoints/last.pt", "checkpoints/best.pt"])
def test_pruning_never_writes_over_the_run_state(tiny_run, tmp_path, capsys, target):
    """analyze_heads.py prune_output=<run>/checkpoints/last.pt (or best.pt) replaced the run's
    own checkpoint with a pruned one: the run could no longer resume. Refused before any
    work: nothing of the run changes (no heads.md either)."""
    run = copy_run(tiny_run, tmp_path / "run")
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    status, err = run_script_in_process("analyze_heads", [
        f"run={run}", "device=cpu", "max_sentences=4", "pruning=false", "prune=0.5",
        f"prune_output={run / target}"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: prune_output="), lines
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before
