"""MultiHeadAttention against torch's nn.MultiheadAttention and against hand-written maths."""

import doctest
import math

import pytest
import torch
from torch import nn

import tinymt.attention
from tinymt.attention import KVCache, MultiHeadAttention
from tinymt.errors import TinyMTError

D, H = 12, 3
DT = torch.float64


def make_pair(seed=0, dropout=0.0):
    """Our MHA and a reference nn.MultiheadAttention with the same weights (float64)."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D, H, dropout=dropout, batch_first=True, dtype=DT)
    with torch.no_grad():  # non-zero biases so they are exercised too
        ref.in_proj_bias.normal_()
        ref.out_proj.bias.normal_()
    ours = MultiHeadAttention(D, H, dropout=dropout).to(DT).load_from_torch(ref)
    return ours.eval(), ref.eval()


def pad_mask(lengths, T):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]  # (B, T) True = pad


def causal_bool(T):
    return torch.ones(T, T, dtype=torch.bool).triu(1)  # True = may NOT attend (torch's sense)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
def test_self_attention_matches_torch(causal, padding):
    ours, ref = make_pair()
    B, T = 3, 6
    x = torch.randn(B, T, D, dtype=DT)
    kpm = pad_mask([6, 4, 2], T) if padding else None
    out, w = ours(x, key_padding_mask=kpm, causal=causal, need_weights=True)
    ref_out, ref_w = ref(
        x, x, x, key_padding_mask=kpm, attn_mask=causal_bool(T) if causal else None,
        need_weights=True, average_attn_weights=False,
    )
    assert w.shape == (B, H, T, T)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)
    # the SDPA path (no weights requested) gives the same output
    out_fast, none = ours(x, key_padding_mask=kpm, causal=causal)
    assert none is None
    torch.testing.assert_close(out_fast, ref_out, atol=1e-10, rtol=0)


@pytest.mark.parametrize("padding", [False, True])
def test_cross_attention_matches_torch(padding):
    ours, ref = make_pair(seed=1)
    B, T, S = 3, 4, 7
    y = torch.randn(B, T, D, dtype=DT)
    mem = torch.randn(B, S, D, dtype=DT)
    kpm = pad_mask([7, 5, 1], S) if padding else None
    out, w = ours(y, mem, key_padding_mask=kpm, need_weights=True)
    ref_out, ref_w = ref(y, mem, mem, key_padding_mask=kpm, average_attn_weights=False)
    assert w.shape == (B, H, T, S)
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(w, ref_w, atol=1e-10, rtol=0)
    out_fast, _ = ours(y, mem, key_padding_mask=kpm)
    torch.testing.assert_close(out_fast, ref_out, atol=1e-10, rtol=0)


def test_weights_are_distributions_over_unmasked_keys():
    ours, _ = make_pair(seed=2)
    B, T = 3, 5
    x = torch.randn(B, T, D, dtype=DT)
    kpm = pad_mask([5, 3, 1], T)
    _, w = ours(x, key_padding_mask=kpm, causal=True, need_weights=True)
    allowed = ~kpm[:, None, None, :] & torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.all(w[~allowed.expand_as(w)] == 0.0)  # exactly zero, not just small
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T, dtype=DT), atol=1e-12, rtol=0)


def test_fully_masked_rows_give_zeros_not_nan():
    ours, _ = make_pair(seed=3)
    x = torch.randn(2, 4, D, dtype=DT, requires_grad=True)
    kpm = pad_mask([4, 0], 4)  # second sentence is all padding
    for need in (False, True):
        out, w = ours(x, key_padding_mask=kpm, need_weights=need)
        assert torch.isfinite(out).all()
        out.sum().backward()
        assert torch.isfinite(x.grad).all()
        x.grad = None
    assert torch.all(w[1] == 0)


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


def by_hand(ours, x, mem, kpm, drop_head=None):
    """Multi-head attention written out per head from the raw weight matrices."""
    W, b = ours.in_proj.weight, ours.in_proj.bias
    Wo, bo = ours.out_proj.weight, ours.out_proj.bias
    dh = D // H
    q = x @ W[:D].T + b[:D]
    k = mem @ W[D : 2 * D].T + b[D : 2 * D]
    v = mem @ W[2 * D :].T + b[2 * D :]
    out = bo.expand(x.shape[0], x.shape[1], D).clone()
    for i in range(H):
        if i == drop_head:
            continue
        sl = slice(i * dh, (i + 1) * dh)
        scores = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(dh)
        scores = scores.masked_fill(kpm[:, None, :], float("-inf"))
        ctx_i = scores.softmax(-1) @ v[..., sl]  # (B, T, dh)
        out = out + ctx_i @ Wo[:, sl].T  # this head's slice of W_O
    return out


def test_head_gates():
    ours, _ = make_pair(seed=5)
    x = torch.randn(2, 4, D, dtype=DT)
    mem = torch.randn(2, 6, D, dtype=DT)
    kpm = pad_mask([6, 3], 6)
    base, _ = ours(x, mem, key_padding_mask=kpm)
    torch.testing.assert_close(base, by_hand(ours, x, mem, kpm), atol=1e-10, rtol=0)
    ones, _ = ours(x, mem, key_padding_mask=kpm, head_gate=torch.ones(H, dtype=DT))
    torch.testing.assert_close(ones, base, atol=0, rtol=0)
    for j in range(H):
        gate = torch.ones(H, dtype=DT)
        gate[j] = 0
        for need in (False, True):
            gated, _ = ours(x, mem, key_padding_mask=kpm, head_gate=gate, need_weights=need)
            ref = by_hand(ours, x, mem, kpm, drop_head=j)
            torch.testing.assert_close(gated, ref, atol=1e-10, rtol=0)
    # per-sentence gates (B, h) and gradients with respect to the gate
    gate = torch.ones(2, H, dtype=DT, requires_grad=True)
    out, _ = ours(x, mem, key_padding_mask=kpm, head_gate=gate)
    out.pow(2).sum().backward()
    assert gate.grad.shape == (2, H) and gate.grad.abs().min() > 0


def test_kv_cache_incremental_equals_full_causal():
    ours, _ = make_pair(seed=6)
    B, T = 3, 6
    x = torch.randn(B, T, D, dtype=DT)
    full, full_w = ours(x, causal=True, need_weights=True)
    cache = KVCache()
    for t in range(T):
        need = t % 2 == 0
        step, w = ours(x[:, t : t + 1], causal=True, cache=cache, need_weights=need)
        torch.testing.assert_close(step[:, 0], full[:, t], atol=1e-12, rtol=0)
        if need:
            torch.testing.assert_close(w[:, :, 0], full_w[:, :, t, : t + 1], atol=1e-12, rtol=0)
        assert cache.length == t + 1
    # several new positions at once on top of a cache (offset causal mask)
    cache = KVCache()
    a, _ = ours(x[:, :2], causal=True, cache=cache)
    b, _ = ours(x[:, 2:], causal=True, cache=cache)
    torch.testing.assert_close(torch.cat([a, b], 1), full, atol=1e-12, rtol=0)


def test_kv_cache_reorder():
    ours, _ = make_pair(seed=7)
    B, T = 3, 5
    x = torch.randn(B, T, D, dtype=DT)
    cache = KVCache()
    for t in range(T - 1):
        ours(x[:, t : t + 1], causal=True, cache=cache)
    index = torch.tensor([2, 0, 0, 1])
    cache.reorder(index)
    xr = x[index]
    last, _ = ours(xr[:, -1:], causal=True, cache=cache)
    full, _ = ours(xr, causal=True)
    torch.testing.assert_close(last[:, 0], full[:, -1], atol=1e-12, rtol=0)


def test_kv_cache_grows_past_its_buffer_with_reorders():
    """Many steps (the buffer is reallocated twice), multi-step updates that cross the
    buffer's end, and reorders in between: always the same as full causal attention."""
    ours, _ = make_pair(seed=9)
    B, T = 2, 3 * KVCache.MIN_ROOM + 5
    x = torch.randn(B, T, D, dtype=DT)
    cache = KVCache()
    rows = torch.arange(B)  # which sentence of x each cache row holds
    t, grown = 0, set()
    while t < T:
        n = 1 if t % 7 else min(3, T - t)  # now and then three positions at once
        out, _ = ours(x[rows, t : t + n], causal=True, cache=cache)
        full, _ = ours(x[rows, : t + n], causal=True)
        torch.testing.assert_close(out, full[:, t:], atol=1e-12, rtol=0)
        t += n
        assert cache.length == t and cache.k.shape == (len(rows), ours.n_heads, t, D // ours.n_heads)
        grown.add(cache._k.size(2))
        if t % 5 == 0:  # beam-search-like shuffle: duplicate, drop and permute rows
            index = torch.tensor([1, 0, 0]) if len(rows) == 2 else torch.tensor([2, 1])
            cache.reorder(index)
            rows = rows[index]
    assert len(grown) >= 3  # started small and was reallocated at least twice


def test_static_cross_cache_is_computed_once():
    ours, _ = make_pair(seed=8)
    y = torch.randn(2, 3, D, dtype=DT)
    mem = torch.randn(2, 5, D, dtype=DT)
    full, _ = ours(y, mem)
    cache = KVCache(static=True)
    first, _ = ours(y[:, :1], mem, cache=cache)
    k_ptr = cache.k.data_ptr()
    rest, _ = ours(y[:, 1:], None, cache=cache)  # no key_value needed any more
    assert cache.k.data_ptr() == k_ptr and cache.length == 5
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-12, rtol=0)


def test_kvcache_docstring_example():
    result = doctest.testmod(tinymt.attention)
    assert result.attempted > 0 and result.failed == 0


def test_bad_head_count_is_a_user_error():
    with pytest.raises(TinyMTError, match="divisible"):
        MultiHeadAttention(10, 3)


def test_sdpa_matches_explicit_with_float32_dropout_off():
    torch.manual_seed(9)
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    kpm = pad_mask([7, 3], 7)
    for causal in (False, True):
        a, _ = mha(x, key_padding_mask=kpm, causal=causal)
        b, _ = mha(x, key_padding_mask=kpm, causal=causal, need_weights=True)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
