"""The Transformer: masking, caching, options (its layers against torch's: test_layers.py)."""

import math

import pytest
import torch
from torch import nn

from tinymt.config import ModelConfig
from tinymt.decoding.cache import DecoderCache, decode_step
from tinymt.errors import TinyMTError
from tinymt.layers import LearnedPositions
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
    full, _ = run(model, src, tgt)
    cache = cache_for(model, src)
    for t in range(tgt.size(1)):
        step_logits = decode_step(model, tgt[:, t : t + 1], cache)
        assert step_logits.shape == (3, 23)
        torch.testing.assert_close(step_logits, full[:, t], atol=1e-5, rtol=0)
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
    last = decode_step(model, tgt[index, 4:5], cache)
    full, _ = run(model, src[index], tgt[index])
    torch.testing.assert_close(last, full[:, 4], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [True, False])
def test_beam_layout_shares_encoder_rows(norm_first):
    """Rows as beam slots over one cross-attention row per sentence (DecoderCache.set_beams)
    give the logits of the full forward pass on each row's own sentence, while
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
        logits = decode_step(model, history[:, -1:], cache)
        full, _ = run(model, row_src, history)
        torch.testing.assert_close(logits, full[:, -1], atol=1e-10, rtol=0)
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


def test_attention_weights_only_when_asked():
    model = tiny_model()
    src, tgt = tokens([5, 3], 5), tokens([4, 2], 4, bos=True)
    hidden, attn = model(src, tgt)
    assert attn is None
    same, attn = model(src, tgt, need_weights=True)
    torch.testing.assert_close(same, hidden, atol=1e-12, rtol=0)
    assert sorted(attn) == ["cross", "decoder_self", "encoder_self"]
    memory, attn = model.encode(src)
    assert attn is None
    assert model.decode(tgt, memory, model.padding_mask(src))[1] is None


def test_count_parameters_counts_each_tensor_once_and_frozen_ones_on_request():
    model = tiny_model(vocab=(30, 30), shared=True, tie_embeddings=True)
    unique = {id(p): p.numel() for p in model.parameters()}  # tied matrices: one entry
    assert count_parameters(model) == count_parameters(model, trainable_only=False) == sum(
        unique.values())
    model.src_embed.weight.requires_grad_(False)  # the tied embedding and output matrix
    assert count_parameters(model) == sum(unique.values()) - 30 * D
    assert count_parameters(model, trainable_only=False) == sum(unique.values())


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
    with pytest.raises(TinyMTError, match=r"^a source sentence of 9 tokens is longer than "
                                          r"model.max_positions=8; shorten the input \(e.g. "
                                          r"data.max_len\) or train a model with a larger "
                                          r"model.max_positions$"):
        model.encode(tokens([9], 9))
    with pytest.raises(TinyMTError, match="^a target sentence of 9 tokens is longer than "
                                          "model.max_positions=8"):
        model(ok_src, tokens([9], 9, bos=True))
    cache = cache_for(model, ok_src)
    for t in range(8):
        decode_step(model, ok_tgt[:, t : t + 1], cache)
    with pytest.raises(TinyMTError, match="^a target prefix of 9 tokens is longer than "
                                          "model.max_positions=8"):
        decode_step(model, ok_tgt[:, :1], cache)


def test_embeddings_are_scaled_by_sqrt_d_plus_the_papers_positions():
    """What enters the first encoder and decoder layers (3.4, 3.5): the token's embedding
    times sqrt(d_model) plus PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...);
    decoding one token at a time, at the token's own position."""
    model = tiny_model(seed=3)
    assert (model.d_model, model.n_heads, model.max_positions, model.pad_id) == (D, H, 32, 0)
    seen = []
    for layer in (model.encoder_layers[0], model.decoder_layers[0]):
        layer.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    src, tgt = tokens([5, 3], 5), tokens([4, 4], 4, bos=True)
    model(src, tgt)

    def expected(embedding, toks, offset=0):
        pe = torch.tensor([[math.sin(p / 10000 ** (2 * (j // 2) / D)) if j % 2 == 0 else
                            math.cos(p / 10000 ** (2 * (j // 2) / D)) for j in range(D)]
                           for p in range(offset, offset + toks.size(1))], dtype=DT)
        return embedding.weight[toks] * math.sqrt(D) + pe

    torch.testing.assert_close(seen[0], expected(model.src_embed, src))
    torch.testing.assert_close(seen[1], expected(model.tgt_embed, tgt))
    cache = cache_for(model, src)
    seen.clear()
    for t in range(3):
        decode_step(model, tgt[:, t : t + 1], cache)
    torch.testing.assert_close(seen[2], expected(model.tgt_embed, tgt[:, 2:3], offset=2))


@pytest.mark.parametrize("norm_first", [True, False])
def test_final_norms_only_in_pre_ln(norm_first):
    """Pre-LN normalises each stack's last output (LayerNorm, by its formula: fresh weights 1,
    biases 0); post-LN's layers end in a norm already and nothing is added."""
    model = tiny_model(seed=4, norm_first=norm_first)
    outs = []
    for layer in (model.encoder_layers[-1], model.decoder_layers[-1]):
        layer.register_forward_hook(lambda m, args, out: outs.append(out[0].detach()))
    src, tgt = tokens([5, 3], 5), tokens([4, 2], 4, bos=True)
    memory, _ = model.encode(src)
    hidden, _ = model(src, tgt)

    def final(x):
        if not norm_first:
            return x
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5)

    torch.testing.assert_close(memory, final(outs[0]))
    torch.testing.assert_close(hidden, final(outs[2]))
