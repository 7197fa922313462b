"""SoftmaxAttention: rotary embeddings by absolute position, attention with a KV cache."""

from __future__ import annotations

import pytest
import torch

from linattn.layers.softmax import SoftmaxAttention, rotary


def naive_causal_attention(q, k, v):
    """The definition (spec section 2) with a causal mask, one head at a time."""
    B, T, H, D = q.shape
    out = torch.empty_like(q)
    for b in range(B):
        for h in range(H):
            scores = q[b, :, h] @ k[b, :, h].T / D**0.5
            scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
            out[b, :, h] = scores.softmax(-1) @ v[b, :, h]
    return out


def test_rotary_scores_depend_only_on_the_offset():
    torch.manual_seed(0)
    q, k = (
        torch.randn(1, 1, 1, 8, dtype=torch.float64),
        torch.randn(1, 1, 1, 8, dtype=torch.float64),
    )
    # q at position m, k at position n: the score depends on m - n only.
    s1 = (rotary(q, 7) * rotary(k, 3)).sum()
    s2 = (rotary(q, 104) * rotary(k, 100)).sum()
    torch.testing.assert_close(s1, s2)
    # A rotation keeps the norm; position 0 is the identity.
    torch.testing.assert_close(rotary(q, 5).norm(), q.norm())
    torch.testing.assert_close(rotary(q, 0), q)


def test_rotary_of_an_odd_dimension_leaves_the_last_channel():
    x = torch.randn(1, 3, 2, 5, dtype=torch.float64)
    torch.testing.assert_close(rotary(x, 4)[..., 4], x[..., 4])


def test_layer_is_causal_multi_head_attention():
    torch.manual_seed(1)
    layer = SoftmaxAttention(16, 2, rope=False).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    q, k, v = (p(x).view(2, 9, 2, 8) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    expected = layer.o_proj(naive_causal_attention(q, k, v).reshape(2, 9, 16))
    torch.testing.assert_close(layer(x)[0], expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rope", [True, False])
def test_layer_with_a_kv_cache_matches_one_call(rope):
    torch.manual_seed(2)
    layer = SoftmaxAttention(16, 2, rope=rope).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    whole, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    pieces = []
    for start, stop in [(0, 4), (4, 5), (5, 11)]:
        y, state = layer(x[:, start:stop], state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=0, atol=1e-12)
    assert state["k"].shape == (2, 11, 2, 8)


def test_layer_rejects_bad_input():
    layer = SoftmaxAttention(16, 2)
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, 16\]"):
        layer(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="divisible"):
        SoftmaxAttention(15, 2)
    state = layer.new_state(3, torch.float32)
    with pytest.raises(ValueError, match="batch size 2"):
        layer(torch.randn(2, 3, 16), state)


def test_short_convolution_runs_before_attention():
    torch.manual_seed(4)
    layer = SoftmaxAttention(16, 2, rope=False, short_conv=True, conv_size=3).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    qkv = torch.cat([p(x) for p in (layer.q_proj, layer.k_proj, layer.v_proj)], dim=-1)
    qkv, _ = layer.conv(qkv)  # the causal convolution + SiLU, tested in test_common
    q, k, v = (t.reshape(2, 9, 2, 8) for t in qkv.split(16, dim=-1))
    expected = layer.o_proj(naive_causal_attention(q, k, v).reshape(2, 9, 16))
    torch.testing.assert_close(layer(x)[0], expected, rtol=0, atol=1e-12)
    # Without the convolution the layer's output differs: the option is not a no-op.
    plain = SoftmaxAttention(16, 2, rope=False).double()
    plain.load_state_dict({n: t for n, t in layer.state_dict().items() if n != "conv.weight"})
    assert (plain(x)[0] - expected).abs().max() > 1e-3


@pytest.mark.parametrize("rope", [True, False])
def test_short_convolution_with_a_cache_matches_one_call(rope):
    torch.manual_seed(5)
    layer = SoftmaxAttention(16, 2, rope=rope, short_conv=True).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    whole, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    assert state["conv"].shape == (2, 48, 3)
    pieces = []
    for start, stop in [(0, 2), (2, 3), (3, 4), (4, 11)]:
        y, state = layer(x[:, start:stop], state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=0, atol=1e-12)
    assert state["k"].shape == (2, 11, 2, 8) and state["conv"].shape == (2, 48, 3)
