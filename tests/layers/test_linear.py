"""LinearAttention: feature maps, normaliser, decays, state layout, options."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import GatedLinearAttention, LinearAttention


def test_taylor_features_give_the_taylor_polynomial_of_exp():
    torch.manual_seed(0)
    layer = LinearAttention(32, 2, key_dim=4, feature_map="taylor", normalize=True).double()
    q, k = (
        torch.randn(3, 5, 2, 4, dtype=torch.float64),
        torch.randn(3, 5, 2, 4, dtype=torch.float64),
    )
    s = (q * k).sum(-1) / 2.0  # q^T k / sqrt(K), K = 4
    torch.testing.assert_close((layer.phi(q) * layer.phi(k)).sum(-1), 1 + s + s**2 / 2)
    assert layer.feature_dim() == 1 + 4 + 16
    assert layer.memory_shape() == (21, 17)  # 21 features, V = 16 plus the normaliser column


def test_favor_features_are_a_saved_buffer_and_estimate_the_softmax_kernel():
    torch.manual_seed(2)
    layer = LinearAttention(32, 2, feature_map="favor", normalize=True, num_features=4096).double()
    assert layer.memory_shape() == (4096, 17)
    assert "favor.W" in layer.state_dict()
    # 400 pairs with moderate scores: FAVOR+ is unbiased, so estimate / exact averages to 1.
    q = torch.randn(1, 200, 2, 16, dtype=torch.float64) / 2
    k = torch.randn(1, 200, 2, 16, dtype=torch.float64) / 2
    ratio = (layer.phi(q) * layer.phi(k)).sum(-1) / torch.exp((q * k).sum(-1) / 4.0)
    assert abs(ratio.mean().item() - 1) < 0.01 and (ratio - 1).abs().median() < 0.05
    y, state = layer(torch.randn(1, 5, 32, dtype=torch.float64), layer.new_state(1, torch.float64))
    assert y.shape == (1, 5, 32) and state["S"].shape == (1, 2, 4096, 17)


@pytest.mark.parametrize("feature_map", ["elu_plus_one", "relu", "taylor", "favor"])
def test_every_feature_map_runs_with_a_state(feature_map):
    torch.manual_seed(3)
    layer = LinearAttention(32, 2, key_dim=4, feature_map=feature_map).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    whole, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    first, state = layer(x[:, :4], state)
    rest, state = layer(x[:, 4:], state)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, rtol=0, atol=1e-12)


def test_normalised_elu_layer_state_has_the_normaliser_column():
    layer = LinearAttention(32, 2, feature_map="elu_plus_one", normalize=True)
    state = layer.new_state(2, torch.float32)
    assert state["S"].shape == (2, 2, 16, 17) and state["conv"].shape == (2, 2 * 48, 3)
    torch.manual_seed(1)
    _, state = layer(torch.randn(2, 6, 32), state)
    # z = sum of phi(k) over the 6 tokens is positive (elu + 1 > 0): the last column of S.
    assert (state["S"][..., -1] > 0).all()


@pytest.mark.parametrize(("decay", "shape"), [("scalar", (2, 5, 2)), ("gla", (2, 5, 2, 16))])
def test_decays_are_non_positive_log_gates(decay, shape):
    layer = LinearAttention(32, 2, feature_map="identity", decay=decay)
    g = layer.decay(torch.randn(2, 5, 32))
    assert g.shape == shape and (g <= 0).all()


def test_without_short_convolution_there_is_no_conv_state():
    layer = LinearAttention(32, 2, feature_map="identity", decay="scalar", short_conv=False)
    assert set(layer.new_state(1, torch.float32)) == {"S"}
    y, state = layer(torch.randn(1, 3, 32), layer.new_state(1, torch.float32))
    assert y.shape == (1, 3, 32) and set(state) == {"S"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(feature_map="cosine"), "feature_map must be one of"),
        (dict(decay="vector"), "decay must be one of"),
        (dict(feature_map="identity", normalize=True), "positive feature map"),
        (dict(feature_map="taylor", decay="gla"), "per-channel decay"),
        (dict(feature_map="favor", num_features=20, decay="channel"), "per-channel decay"),
        (dict(key_dim=0), "key_dim must be an integer >= 1"),
        (dict(chunk_size=0), "chunk_size must be an integer >= 1"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LinearAttention(32, 2, **kwargs)


def literal_gla(q, k, v, g):
    """S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t / sqrt(K), one token at a time."""
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype)
    out = []
    for t in range(T):
        S = g[:, t].exp()[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) / K**0.5)
    return torch.stack(out, 1)


def test_gla_is_the_papers_layer():
    """Keys d/2, values d over the heads, no convolution and no activation on q, k, v; output
    o_proj(rmsnorm(o) * w * silu(g_proj x)); against the literal recurrence in float64."""
    torch.manual_seed(0)
    layer = GatedLinearAttention(32, 2, chunk_size=4).double()
    assert (layer.key_dim, layer.head_dim, layer.conv, layer.o_norm.eps) == (8, 16, None, 1e-5)
    with torch.no_grad():
        layer.o_norm.weight.normal_()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    q, k = layer.q_proj(x).view(2, 11, 2, 8), layer.k_proj(x).view(2, 11, 2, 8)
    v = layer.v_proj(x).view(2, 11, 2, 16)
    g = torch.nn.functional.logsigmoid(layer.decay.a_proj(x)).view(2, 11, 2, 8) / 16
    o = torch.nn.functional.rms_norm(literal_gla(q, k, v, g), (16,), layer.o_norm.weight, 1e-5)
    o = o * torch.nn.functional.silu(layer.g_proj(x).view(2, 11, 2, 16))
    want = layer.o_proj(o.reshape(2, 11, 32))
    torch.testing.assert_close(layer(x)[0], want, rtol=0, atol=1e-12)


def test_gla_sizes_from_fla_expansions():
    layer = GatedLinearAttention(64, 4, expand_k=1.0, expand_v=2.0, short_conv=True)
    assert (layer.key_dim, layer.head_dim, layer.conv.channels) == (16, 32, 4 * (2 * 16 + 32))
    with pytest.raises(ValueError, match="expand_k"):
        GatedLinearAttention(36, 4)  # keys 36 / 2 / 4 = 4.5 per head


def test_linear_attention_without_convolution_keeps_its_silu():
    """``silu_without_conv`` is GLA's alone: LinearAttention feeds silu(q_proj x) to its op."""
    torch.manual_seed(1)
    layer = LinearAttention(16, 2, feature_map="identity", decay="scalar", short_conv=False)
    seen = {}
    run = layer.recurrence

    def recurrence(x_, q, *args, **kwargs):
        seen["q"] = q
        return run(x_, q, *args, **kwargs)

    layer.recurrence = recurrence
    x = torch.randn(1, 5, 16)
    layer(x)
    torch.testing.assert_close(
        seen["q"], torch.nn.functional.silu(layer.q_proj(x)).view(1, 5, 2, 8)
    )


@pytest.mark.parametrize("cls", [LinearAttention, GatedLinearAttention])
def test_grouped_value_heads_are_refused_by_name(cls):
    """Grouped value heads are the delta-rule layers'; here they are refused, naming the option
    (they used to be accepted and then fail inside the op with a gate-shape error)."""
    with pytest.raises(ValueError, match="num_v_heads"):
        cls(16, 2, num_v_heads=4)
