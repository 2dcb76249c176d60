"""tinymt.layers, in paper order: the sinusoidal positions against the paper's formula (3.5),
the learned ones, and the encoder and decoder layers (pre- and post-LN, relu and gelu)
against torch's nn.TransformerEncoderLayer / nn.TransformerDecoderLayer with the same
weights; dropout wired to the right places, checked where it is total (p = 1)."""

import math

import pytest
import torch
from torch import nn

from conftest import load_from_torch
from tinymt.layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    LearnedPositions,
    SinusoidalPositions,
)

DT = torch.float64
D, H, FF = 16, 2, 32


def pad_mask(lengths, T):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T) True = pad


def randomize_(module):
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
    return module


# --------------------------------------------------------------------------- layers vs torch
def copy_encoder_layer(ours: EncoderLayer, ref: nn.TransformerEncoderLayer):
    load_from_torch(ours.self_attn, ref.self_attn)
    ours.ff.linear1.load_state_dict(ref.linear1.state_dict())
    ours.ff.linear2.load_state_dict(ref.linear2.state_dict())
    ours.norm1.load_state_dict(ref.norm1.state_dict())
    ours.norm2.load_state_dict(ref.norm2.state_dict())


def copy_decoder_layer(ours: DecoderLayer, ref: nn.TransformerDecoderLayer):
    load_from_torch(ours.self_attn, ref.self_attn)
    load_from_torch(ours.cross_attn, ref.multihead_attn)
    ours.ff.linear1.load_state_dict(ref.linear1.state_dict())
    ours.ff.linear2.load_state_dict(ref.linear2.state_dict())
    for i in (1, 2, 3):
        getattr(ours, f"norm{i}").load_state_dict(getattr(ref, f"norm{i}").state_dict())


def layer_pair(ref_cls, ours_cls, copy, seed: int, activation: str, norm_first: bool):
    """torch's layer with random weights, and ours holding the same ones."""
    torch.manual_seed(seed)
    ref = ref_cls(D, H, FF, dropout=0.0, activation=activation, batch_first=True,
                  norm_first=norm_first, dtype=DT)
    randomize_(ref)
    ours = ours_cls(D, H, FF, 0.0, 0.0, activation, norm_first).to(DT)
    copy(ours, ref)
    return ref, ours


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    ref, ours = layer_pair(nn.TransformerEncoderLayer, EncoderLayer, copy_encoder_layer, 0,
                           activation, norm_first)
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
    ref, ours = layer_pair(nn.TransformerDecoderLayer, DecoderLayer, copy_decoder_layer, 1,
                           activation, norm_first)
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



# --------------------------------------------------------------------------- positions
@pytest.mark.parametrize("d", [6, 7])
def test_sinusoidal_positions_are_the_papers_formula(d):
    pe = SinusoidalPositions(12, d)
    for pos in range(12):
        for j in range(d):
            i = j // 2  # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...)
            angle = pos / 10000 ** (2 * i / d)
            expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert pe(12)[pos, j].item() == pytest.approx(expected, abs=1e-5)
    assert pe(3, offset=4).shape == (3, d)
    torch.testing.assert_close(pe(3, offset=4), pe(12)[4:7])
    assert "pe" not in pe.state_dict()  # rebuilt, not saved


def test_learned_positions_are_rows_of_the_table_from_the_offset():
    torch.manual_seed(0)
    pos = LearnedPositions(10, 4)
    table = pos.embedding.weight
    assert torch.equal(pos(3), table[0:3])
    assert torch.equal(pos(2, offset=5), table[5:7])


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_is_w2_act_w1(activation):
    torch.manual_seed(1)
    ff = FeedForward(4, 8, 0.0, activation).to(DT)
    x = torch.randn(2, 3, 4, dtype=DT)
    h = x @ ff.linear1.weight.T + ff.linear1.bias
    act = h.clamp(min=0) if activation == "relu" else 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    torch.testing.assert_close(ff(x), act @ ff.linear2.weight.T + ff.linear2.bias)


# --------------------------------------------------------------------------- dropout
def _mha_bias_only(mha, x):
    """Attention whose weights are all dropped (p = 1): out = W_O 0 + b_O."""
    return mha.out_proj.bias.expand_as(x)


@pytest.mark.parametrize("norm_first", [True, False])
def test_dropout_one_drops_every_sublayer_of_the_encoder_layer(norm_first):
    torch.manual_seed(2)
    x = torch.randn(2, 5, D, dtype=DT)
    layer = randomize_(EncoderLayer(D, H, FF, 1.0, 0.0, "relu", norm_first).to(DT)).train()
    out, _ = layer(x, None)
    # every residual branch dropped: x itself (pre-LN), or the two norms of x (post-LN)
    torch.testing.assert_close(out, x if norm_first else layer.norm2(layer.norm1(x)))
    layer.eval()  # dropout is for training only
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True,
                                     norm_first=norm_first, dtype=DT)
    copy_encoder_layer(layer, ref)
    torch.testing.assert_close(layer(x, None)[0], ref(x), atol=1e-10, rtol=0)


@pytest.mark.parametrize("norm_first", [True, False])
def test_attention_dropout_one_leaves_the_attention_bias_alone(norm_first):
    torch.manual_seed(3)
    x = torch.randn(2, 5, D, dtype=DT)
    layer = randomize_(EncoderLayer(D, H, FF, 0.0, 1.0, "relu", norm_first).to(DT)).train()
    attn = _mha_bias_only(layer.self_attn, x)
    if norm_first:
        y = x + attn
        expected = y + layer.ff(layer.norm2(y))
    else:
        y = layer.norm1(x + attn)
        expected = layer.norm2(y + layer.ff(y))
    for need in (False, True):
        torch.testing.assert_close(layer(x, None, need_weights=need)[0], expected)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_layer_dropout_one_and_attention_dropout_one(norm_first):
    torch.manual_seed(4)
    y, mem = torch.randn(2, 4, D, dtype=DT), torch.randn(2, 6, D, dtype=DT)
    layer = randomize_(DecoderLayer(D, H, FF, 1.0, 0.0, "gelu", norm_first).to(DT)).train()
    out = layer(y, mem, None, None)[0]
    n1, n2, n3 = layer.norm1, layer.norm2, layer.norm3
    torch.testing.assert_close(out, y if norm_first else n3(n2(n1(y))))

    layer = randomize_(DecoderLayer(D, H, FF, 0.0, 1.0, "gelu", norm_first).to(DT)).train()
    n1, n2, n3, ff = layer.norm1, layer.norm2, layer.norm3, layer.ff
    a, c = _mha_bias_only(layer.self_attn, y), _mha_bias_only(layer.cross_attn, y)
    if norm_first:
        z = y + a + c
        expected = z + ff(n3(z))
    else:
        z = n2(n1(y + a) + c)
        expected = n3(z + ff(z))
    torch.testing.assert_close(layer(y, mem, None, None)[0], expected)


def test_layers_return_attention_weights_only_when_asked():
    torch.manual_seed(5)
    x, mem = torch.randn(2, 3, D), torch.randn(2, 4, D)
    enc = EncoderLayer(D, H, FF, 0.0, 0.0, "relu", True).eval()
    dec = DecoderLayer(D, H, FF, 0.0, 0.0, "relu", True).eval()
    assert enc(x, None)[1] is None and enc(x, None, need_weights=True)[1].shape == (2, H, 3, 3)
    _, self_w, cross_w = dec(x, mem, None, None)
    assert self_w is None and cross_w is None
