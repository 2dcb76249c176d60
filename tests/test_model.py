"""The Transformer: layers against torch's reference layers, masking, caching, options."""

import pytest
import torch
from torch import nn

from tinymt.config import ModelConfig
from tinymt.decoding.cache import DecoderCache, decode_step
from tinymt.errors import TinyMTError
from tinymt.layers import DecoderLayer, EncoderLayer, LearnedPositions
from tinymt.model import Transformer, count_parameters

DT = torch.float64
D, H, FF = 16, 2, 32


def tiny_cfg(**kw):
    base = {"d_model": D, "n_heads": H, "n_encoder_layers": 2, "n_decoder_layers": 2}
    return ModelConfig(**{"d_ff": FF, "dropout": 0.0, "max_positions": 32, **base, **kw})


def tiny_model(seed=0, dtype=DT, vocab=(23, 23), shared=True, **kw):
    torch.manual_seed(seed)
    return Transformer(tiny_cfg(**kw), vocab[0], vocab[1], shared).to(dtype).eval()


def pad_mask(lengths, T):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T) True = pad


def run(model, src, tgt, need_weights=False):
    """Logits (B, T, V) of teacher forcing, and the attention weights."""
    hidden, attn = model(src, tgt, need_weights=need_weights)
    return model.logits(hidden), attn


def cache_for(model, src):
    memory, _ = model.encode(src)
    return DecoderCache(model, memory, model.padding_mask(src))


def tokens(lengths, T, vocab=23, bos=False):
    """Random non-special tokens (ids >= 4), right-padded with 0."""
    x = torch.randint(4, vocab, (len(lengths), T))
    if bos:
        x[:, 0] = 2
    return x.masked_fill(pad_mask(lengths, T), 0)


def randomize_(module):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
    return module


# --------------------------------------------------------------------------- layers vs torch
def copy_encoder_layer(ours: EncoderLayer, ref: nn.TransformerEncoderLayer):
    ours.self_attn.load_from_torch(ref.self_attn)
    ours.ff.linear1.load_state_dict(ref.linear1.state_dict())
    ours.ff.linear2.load_state_dict(ref.linear2.state_dict())
    ours.norm1.load_state_dict(ref.norm1.state_dict())
    ours.norm2.load_state_dict(ref.norm2.state_dict())


def copy_decoder_layer(ours: DecoderLayer, ref: nn.TransformerDecoderLayer):
    ours.self_attn.load_from_torch(ref.self_attn)
    ours.cross_attn.load_from_torch(ref.multihead_attn)
    ours.ff.linear1.load_state_dict(ref.linear1.state_dict())
    ours.ff.linear2.load_state_dict(ref.linear2.state_dict())
    for i in (1, 2, 3):
        getattr(ours, f"norm{i}").load_state_dict(getattr(ref, f"norm{i}").state_dict())


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    torch.manual_seed(0)
    ref = nn.TransformerEncoderLayer(
        D, H, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first,
        dtype=DT,
    )
    randomize_(ref)
    ours = EncoderLayer(D, H, FF, 0.0, 0.0, activation, norm_first).to(DT)
    copy_encoder_layer(ours, ref)
    x = torch.randn(3, 6, D, dtype=DT)
    kpm = pad_mask([6, 4, 1], 6)
    expected = ref(x, src_key_padding_mask=kpm)  # grad enabled: torch's slow, exact path
    for need in (False, True):
        out, w = ours(x, ~kpm[:, None, None, :], need_weights=need)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
        assert (w is not None) == need


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_decoder_layer_matches_torch(norm_first, activation):
    torch.manual_seed(1)
    ref = nn.TransformerDecoderLayer(
        D, H, FF, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first,
        dtype=DT,
    )
    randomize_(ref)
    ours = DecoderLayer(D, H, FF, 0.0, 0.0, activation, norm_first).to(DT)
    copy_decoder_layer(ours, ref)
    T, S = 5, 7
    y = torch.randn(3, T, D, dtype=DT)
    mem = torch.randn(3, S, D, dtype=DT)
    tpm, mpm = pad_mask([5, 3, 2], T), pad_mask([7, 2, 5], S)
    expected = ref(
        y, mem, tgt_mask=torch.ones(T, T, dtype=torch.bool).triu(1),
        tgt_key_padding_mask=tpm, memory_key_padding_mask=mpm,
    )
    for need in (False, True):
        tgt_mask = ~tpm[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()
        out, sw, cw = ours(y, mem, ~mpm[:, None, None, :], tgt_mask, need_weights=need)
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
        if need:
            assert sw.shape == (3, H, T, T) and cw.shape == (3, H, T, S)


# --------------------------------------------------------------------------- masking
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
def test_decoder_is_causal(norm_first, need_weights):
    model = tiny_model(norm_first=norm_first)
    src = tokens([6, 4], 6)
    tgt = tokens([7, 7], 7, bos=True)
    t = 3
    changed = tgt.clone()
    changed[:, t] = (changed[:, t] + 1 - 4) % 19 + 4  # another non-special token
    a, _ = run(model, src, tgt, need_weights=need_weights)
    b, _ = run(model, src, changed, need_weights=need_weights)
    torch.testing.assert_close(a[:, :t], b[:, :t], atol=1e-12, rtol=0)
    assert not torch.allclose(a[:, t:], b[:, t:])

    # gradients: outputs before t do not depend on the embedding of tokens t, t+1, ...
    store = {}

    def keep(module, inputs, output):
        output.retain_grad()
        store["emb"] = output

    handle = model.tgt_embed.register_forward_hook(keep)
    try:
        logits, _ = run(model, src, tgt, need_weights=need_weights)
    finally:
        handle.remove()
    logits[:, :t].pow(2).sum().backward()
    grad = store["emb"].grad  # (B, T, d)
    assert torch.all(grad[:, t:] == 0)
    assert grad[:, :t].abs().sum() > 0


def test_padding_invariance():
    model = tiny_model(seed=2)
    src_a, src_b = tokens([4], 4), tokens([7], 7)
    tgt_a, tgt_b = tokens([3], 3, bos=True), tokens([6], 6, bos=True)
    src = torch.zeros(2, 7, dtype=torch.long)
    src[0, :4], src[1] = src_a[0], src_b[0]
    tgt = torch.zeros(2, 6, dtype=torch.long)
    tgt[0, :3], tgt[1] = tgt_a[0], tgt_b[0]

    for need in (False, True):
        mem_alone, enc_alone = model.encode(src_a, need_weights=need)
        mem_batch, enc_batch = model.encode(src, need_weights=need)
        torch.testing.assert_close(mem_batch[0, :4], mem_alone[0], atol=1e-10, rtol=0)

        logits_alone, attn_alone = run(model, src_a, tgt_a, need_weights=need)
        logits_batch, attn_batch = run(model, src, tgt, need_weights=need)
        torch.testing.assert_close(logits_batch[0, :3], logits_alone[0], atol=1e-10, rtol=0)
        if need:
            for layer in range(2):
                cross_b = attn_batch["cross"][layer][0, :, :3]  # (h, 3, 7)
                cross_a = attn_alone["cross"][layer][0]  # (h, 3, 4)
                torch.testing.assert_close(cross_b[..., :4], cross_a, atol=1e-10, rtol=0)
                assert torch.all(cross_b[..., 4:] == 0)
                enc_b = enc_batch["encoder_self"][layer][0, :, :4, :4]
                torch.testing.assert_close(enc_b, enc_alone["encoder_self"][layer][0])


# --------------------------------------------------------------------------- incremental
@pytest.mark.parametrize(
    "options",
    [{}, {"norm_first": False}, {"positional": "learned", "activation": "gelu"}],
)
def test_cached_decoding_equals_full_forward(options):
    model = tiny_model(seed=3, dtype=torch.float32, **options)
    src = tokens([7, 3, 5], 7)
    tgt = tokens([8, 8, 8], 8, bos=True)
    full, attn = run(model, src, tgt, need_weights=True)
    cache = cache_for(model, src)
    for t in range(tgt.size(1)):
        need = t in (0, 5)
        step_logits, step_attn = decode_step(model, tgt[:, t : t + 1], cache, need_weights=need)
        assert step_logits.shape == (3, 23)
        torch.testing.assert_close(step_logits, full[:, t], atol=1e-5, rtol=0)
        if need:
            for layer in range(2):
                torch.testing.assert_close(
                    step_attn["cross"][layer][:, :, 0], attn["cross"][layer][:, :, t],
                    atol=1e-5, rtol=0,
                )
                torch.testing.assert_close(
                    step_attn["decoder_self"][layer][:, :, 0],
                    attn["decoder_self"][layer][:, :, t, : t + 1], atol=1e-5, rtol=0,
                )
    assert cache.step == tgt.size(1)


def test_cache_reorder_follows_rows():
    model = tiny_model(seed=4, dtype=torch.float32)
    src = tokens([6, 2], 6)
    tgt = tokens([5, 5], 5, bos=True)
    cache = cache_for(model, src)
    for t in range(4):
        decode_step(model, tgt[:, t : t + 1], cache)
    index = torch.tensor([1, 1, 0])
    cache.reorder(index)
    last, _ = decode_step(model, tgt[index, 4:5], cache)
    full, _ = run(model, src[index], tgt[index])
    torch.testing.assert_close(last, full[:, 4], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [True, False])
def test_beam_layout_shares_encoder_rows(norm_first):
    """Rows as beam slots over one cross-attention row per sentence (DecoderCache.set_beams)
    give the logits and weights of the full forward pass on each row's own sentence, while
    hypotheses move between slots and sentences leave."""
    model = tiny_model(seed=5, norm_first=norm_first)
    src = tokens([6, 2, 4], 6)
    beam = 3
    cache = cache_for(model, src)
    assert cache.layers[0][1].k.size(0) == 3  # one row per sentence, for all beams
    # (rows kept, their new slots, sentences kept) before each step; None: as they are
    plan = [
        (None, [0, 3, 6], None),  # step 0: one hypothesis per sentence, in beam 0
        ([0, 0, 1, 2, 2, 2], [0, 2, 3, 6, 7, 8], None),  # spread out over the beams
        ([1, 0, 2, 5, 4], [0, 1, 3, 6, 8], None),  # swap, drop a row of sentence 2
        ([3, 4, 4], [0, 1, 2], torch.tensor([2])),  # sentences 0 and 1 leave
        (None, [0, 1, 2], None),
        ([2, 0], [1, 2], None),
    ]
    sentence = torch.tensor([0, 1, 2])  # original sentence of each kept sentence
    history = torch.full((3, 1), 2)  # (R, t) each row's prefix, BOS first
    g = torch.Generator().manual_seed(0)
    for rows, slots, keep in plan:
        if keep is not None:
            sentence = sentence[keep]
        if rows is not None:
            history = history[torch.tensor(rows)]
        slots = torch.tensor(slots)
        cache.set_beams(None if rows is None else torch.tensor(rows), slots, beam, keep)
        row_src = src[sentence[slots // beam]]  # (R, S) each row's own sentence
        logits, attn = decode_step(model, history[:, -1:], cache, need_weights=True)
        full, full_attn = run(model, row_src, history, need_weights=True)
        torch.testing.assert_close(logits, full[:, -1], atol=1e-10, rtol=0)
        for layer in range(2):
            torch.testing.assert_close(
                attn["cross"][layer][:, :, 0], full_attn["cross"][layer][:, :, -1],
                atol=1e-10, rtol=0)
        history = torch.cat([history, torch.randint(4, 23, (len(history), 1), generator=g)], 1)


# --------------------------------------------------------------------------- options
def test_attention_dict_layout():
    model = tiny_model(seed=5, n_encoder_layers=3, n_decoder_layers=2)
    src, tgt = tokens([5, 3], 5), tokens([4, 4], 4, bos=True)
    logits, attn = run(model, src, tgt, need_weights=True)
    assert logits.shape == (2, 4, 23)
    assert set(attn) == {"encoder_self", "decoder_self", "cross"}
    assert [w.shape for w in attn["encoder_self"]] == [(2, H, 5, 5)] * 3
    assert [w.shape for w in attn["decoder_self"]] == [(2, H, 4, 4)] * 2
    assert [w.shape for w in attn["cross"]] == [(2, H, 4, 5)] * 2
    logits2, none = run(model, src, tgt)
    assert none is None
    torch.testing.assert_close(logits2, logits, atol=1e-10, rtol=0)


def test_tied_embeddings():
    shared = tiny_model(vocab=(30, 30), shared=True)
    assert shared.src_embed.weight is shared.tgt_embed.weight is shared.output_proj.weight
    ptr = shared.src_embed.weight.data_ptr()
    assert shared.output_proj.weight.data_ptr() == ptr

    separate = tiny_model(vocab=(30, 25), shared=False)
    assert separate.tgt_embed.weight is separate.output_proj.weight
    assert separate.src_embed.weight.data_ptr() != separate.tgt_embed.weight.data_ptr()

    untied = tiny_model(vocab=(30, 30), shared=True, tie_embeddings=False)
    n_tied, n_untied = count_parameters(shared), count_parameters(untied)
    assert n_untied - n_tied == 2 * 30 * D
    assert count_parameters(separate) == n_tied + 25 * D  # its own target matrix

    with pytest.raises(TinyMTError, match="shared vocabulary"):
        Transformer(tiny_cfg(), 30, 25, shared_vocab=True)


def test_learned_positions_and_checkpoint_rebuild():
    model = tiny_model(seed=6, positional="learned")
    assert isinstance(model.src_pos, LearnedPositions)
    assert "src_pos.embedding.weight" in model.state_dict()
    sinus = tiny_model(seed=6)
    assert not any("pos" in k for k in sinus.state_dict())  # sinusoids are not saved
    # a checkpoint rebuilds from the stored constructor arguments
    rebuilt = Transformer(
        sinus.config, sinus.src_vocab_size, sinus.tgt_vocab_size, sinus.shared_vocab,
        sinus.pad_id,
    ).to(DT).eval()
    rebuilt.load_state_dict(sinus.state_dict())
    src, tgt = tokens([5], 5), tokens([4], 4, bos=True)
    torch.testing.assert_close(rebuilt(src, tgt)[0], sinus(src, tgt)[0], atol=0, rtol=0)


def test_post_ln_has_no_final_norm():
    model = tiny_model(norm_first=False)
    assert isinstance(model.encoder_norm, nn.Identity)
    assert isinstance(tiny_model().decoder_norm, nn.LayerNorm)


def test_train_mode_dropout_and_backward():
    model = tiny_model(seed=7, dropout=0.3, attention_dropout=0.2).train()
    src, tgt = tokens([5, 4], 5), tokens([4, 3], 4, bos=True)
    a, _ = model(src, tgt)
    b, _ = model(src, tgt)
    assert not torch.allclose(a, b)
    a.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_too_long_sequences_raise():
    model = tiny_model(max_positions=8)
    ok_src, ok_tgt = tokens([8], 8), tokens([8], 8, bos=True)
    model(ok_src, ok_tgt)
    with pytest.raises(TinyMTError, match="max_positions=8"):
        model.encode(tokens([9], 9))
    with pytest.raises(TinyMTError, match="max_positions"):
        model(ok_src, tokens([9], 9, bos=True))
    cache = cache_for(model, ok_src)
    for t in range(8):
        decode_step(model, ok_tgt[:, t : t + 1], cache)
    with pytest.raises(TinyMTError, match="max_positions"):
        decode_step(model, ok_tgt[:, :1], cache)


def test_bad_config_values_raise():
    with pytest.raises(TinyMTError, match="activation"):
        Transformer(tiny_cfg(activation="swish"), 10, 10, True)
    with pytest.raises(TinyMTError, match="positional"):
        Transformer(tiny_cfg(positional="rope"), 10, 10, True)
    with pytest.raises(TinyMTError, match="divisible"):
        Transformer(tiny_cfg(d_model=10, n_heads=3), 10, 10, True)
