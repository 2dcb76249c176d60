"""MultiHeadAttention against torch's nn.MultiheadAttention and against hand-written maths."""

import math

import pytest
import torch
from torch import nn

from conftest import load_from_torch
from tinymt.attention import MultiHeadAttention, dot_product_attention
from tinymt.model import causal_mask

D, H = 12, 3
DT = torch.float64


def make_pair(seed=0, dropout=0.0):
    """Our MHA and a reference nn.MultiheadAttention with the same weights (float64)."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D, H, dropout=dropout, batch_first=True, dtype=DT)
    with torch.no_grad():  # non-zero biases so they are exercised too
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    ours = load_from_torch(MultiHeadAttention(D, H, dropout=dropout).to(DT), ref)
    return ours.eval(), ref.eval()


def pad_mask(lengths, T):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T) True = pad


def our_mask(kpm, causal, T):
    """Our convention: True where a query may attend, (B, 1, T_q, T_k)."""
    mask = None if kpm is None else ~kpm[:, None, None, :]
    if causal:
        mask = causal_mask(T) if mask is None else mask & causal_mask(T)
    return mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
def test_self_attention_matches_torch(causal, padding):
    ours, ref = make_pair()
    B, T = 3, 6
    x = torch.randn(B, T, D, dtype=DT)
    kpm = pad_mask([6, 4, 2], T) if padding else None
    mask = our_mask(kpm, causal, T)
    out, w = ours(x, mask=mask, need_weights=True)
    ref_out, ref_w = ref(  # torch's masks: True = may NOT attend
        x, x, x, key_padding_mask=kpm, attn_mask=~causal_mask(T) if causal else None,
        need_weights=True, average_attn_weights=False,
    )
    assert w.shape == (B, H, T, T)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)
    # the fused path (no weights requested) gives the same output
    out_fast, none = ours(x, mask=mask)
    assert none is None
    torch.testing.assert_close(out_fast, ref_out, atol=1e-10, rtol=0)


@pytest.mark.parametrize("padding", [False, True])
def test_cross_attention_matches_torch(padding):
    ours, ref = make_pair(seed=1)
    B, T, S = 3, 4, 7
    y = torch.randn(B, T, D, dtype=DT)
    mem = torch.randn(B, S, D, dtype=DT)
    kpm = pad_mask([7, 5, 1], S) if padding else None
    mask = our_mask(kpm, False, S)
    out, w = ours(y, mem, mask=mask, need_weights=True)
    ref_out, ref_w = ref(y, mem, mem, key_padding_mask=kpm, average_attn_weights=False)
    assert w.shape == (B, H, T, S)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)
    out_fast, _ = ours(y, mem, mask=mask)
    torch.testing.assert_close(out_fast, ref_out, atol=1e-10, rtol=0)


def test_weights_are_distributions_over_unmasked_keys():
    ours, _ = make_pair(seed=2)
    B, T = 3, 5
    x = torch.randn(B, T, D, dtype=DT)
    mask = our_mask(pad_mask([5, 3, 1], T), True, T)
    _, w = ours(x, mask=mask, need_weights=True)
    assert torch.all(w[~mask.expand_as(w)] == 0.0)  # exactly zero, not just small
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T, dtype=DT), atol=1e-12, rtol=0)


def test_dropout_applies_in_training_on_both_paths():
    ours, _ = make_pair(seed=4, dropout=0.5)
    x = torch.randn(2, 5, D, dtype=DT)
    ours.eval()
    det, _ = ours(x)
    ours.train()
    for need in (False, True):
        torch.manual_seed(0)
        out, _ = ours(x, need_weights=need)
        assert not torch.allclose(out, det)


def by_hand(ours, x, mem, kpm):
    """Multi-head attention written out per head from the raw weight matrices."""
    W, b = ours.in_proj.weight, ours.in_proj.bias
    Wo, bo = ours.out_proj.weight, ours.out_proj.bias
    dh = D // H
    q = x @ W[:D].T + b[:D]
    k = mem @ W[D : 2 * D].T + b[D : 2 * D]
    v = mem @ W[2 * D :].T + b[2 * D :]
    out = bo.expand(x.shape[0], x.shape[1], D).clone()
    for i in range(H):
        sl = slice(i * dh, (i + 1) * dh)
        scores = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(dh)
        scores = scores.masked_fill(kpm[:, None, :], float("-inf"))
        ctx_i = scores.softmax(-1) @ v[..., sl]  # (B, T, dh)
        out = out + ctx_i @ Wo[:, sl].T  # this head's slice of W_O
    return out


def test_every_head_by_hand():
    ours, _ = make_pair(seed=5)
    x = torch.randn(2, 4, D, dtype=DT)
    mem = torch.randn(2, 6, D, dtype=DT)
    kpm = pad_mask([6, 3], 6)
    for need in (False, True):
        out, _ = ours(x, mem, mask=our_mask(kpm, False, 6), need_weights=need)
        torch.testing.assert_close(out, by_hand(ours, x, mem, kpm), atol=1e-10, rtol=0)


def test_dot_product_attention_is_the_formula():
    torch.manual_seed(6)
    q, k, v = (torch.randn(2, 3, n, 4, dtype=DT) for n in (5, 6, 6))
    ctx, w = dot_product_attention(q, k, v)
    ref_w = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)  # sqrt(d_k) = 2
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(ctx, ref_w @ v)


def test_fused_kernel_matches_explicit_in_float32():
    torch.manual_seed(9)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    for causal in (False, True):
        mask = our_mask(pad_mask([7, 3], 7), causal, 7)
        a, _ = mha(x, mask=mask)
        b, _ = mha(x, mask=mask, need_weights=True)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_half_precision_scores_and_weights_are_float32():
    """bf16 queries and keys: their product scaled, the softmax and the weights in float32
    (as fused kernels do); the context back in the values' dtype."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(1, 2, 5, 8).to(torch.bfloat16) for _ in range(3))
    ctx, w = dot_product_attention(q, k, v)
    ref_w = torch.softmax((q @ k.transpose(-1, -2)).float() / math.sqrt(8), dim=-1)
    assert w.dtype == torch.float32 and ctx.dtype == torch.bfloat16
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ctx, ref_w.to(torch.bfloat16) @ v)


def test_attention_dropout_zeroes_weights_and_rescales_the_rest():
    """Dropout on the attention weights (training): each weight of the context is either
    dropped or scaled by 1 / (1 - p); the returned weights are those before dropout."""
    torch.manual_seed(8)
    T = 6
    q, k = torch.randn(2, 2, T, T, dtype=DT), torch.randn(2, 2, T, T, dtype=DT)
    v = torch.eye(T, dtype=DT).expand(2, 2, T, T)  # context = the dropped-out weights
    ctx, w = dot_product_attention(q, k, v, dropout=0.5)
    ref_w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(T), dim=-1)
    torch.testing.assert_close(w, ref_w)
    kept = ctx != 0
    torch.testing.assert_close(ctx[kept], 2 * ref_w[kept])
    assert 0.3 < kept.double().mean() < 0.7  # about half of 144 kept
    ctx, _ = dot_product_attention(q, k, v, dropout=0.0)
    torch.testing.assert_close(ctx, ref_w)


def test_without_biases_it_matches_torch():
    torch.manual_seed(10)
    ref = nn.MultiheadAttention(D, H, bias=False, batch_first=True, dtype=DT).eval()
    ours = load_from_torch(MultiHeadAttention(D, H, bias=False).to(DT).eval(), ref)
    assert ours.in_proj.bias is None and ours.out_proj.bias is None
    y, mem = torch.randn(2, 3, D, dtype=DT), torch.randn(2, 5, D, dtype=DT)
    for kv in (None, mem):
        out, w = ours(y, kv, need_weights=True)
        ref_out, ref_w = ref(y, y if kv is None else kv, y if kv is None else kv,
                             average_attn_weights=False)
        torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
        torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)


def test_no_dropout_by_default():
    torch.manual_seed(12)
    mha = MultiHeadAttention(D, H).to(DT)
    x = torch.randn(2, 5, D, dtype=DT)
    torch.testing.assert_close(mha.train()(x)[0], mha.eval()(x)[0], atol=1e-12, rtol=0)


def test_no_dropout_in_eval_mode():
    ours, ref = make_pair(seed=11, dropout=0.5)  # both in eval mode
    x = torch.randn(2, 5, D, dtype=DT)
    ref_out, _ = ref(x, x, x)
    for need in (False, True):
        torch.testing.assert_close(ours(x, need_weights=need)[0], ref_out, atol=1e-10, rtol=0)
