"""The delta-rule layers: what each builds, and the recurrence it runs against a literal loop."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import DeltaNet, GatedDeltaNet, KimiDeltaAttention


def literal_recurrence(q, k, v, beta, g):
    """S <- Diag(alpha) S; S <- S + beta k (v - S^T k)^T; o = S^T q / sqrt(K) (docs/design.md,
    "The mechanism table")."""
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=q.dtype)
    out = []
    for t in range(T):
        if g is not None:
            alpha = g[:, t].exp()  # [B, H] or [B, H, K]
            S = S * (alpha[..., None, None] if alpha.dim() == 2 else alpha[..., None])
        kt, vt, bt = k[:, t], v[:, t], beta[:, t]
        error = vt - torch.einsum("bhkv,bhk->bhv", S, kt)
        S = S + bt[..., None, None] * kt[..., :, None] * error[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) / K**0.5)
    return torch.stack(out, 1)


LAYERS = [
    lambda: DeltaNet(16, 2, chunk_size=4),
    lambda: GatedDeltaNet(16, 2, chunk_size=4),
    lambda: GatedDeltaNet(16, 2, 4, num_v_heads=4, chunk_size=4),  # grouped value heads
    lambda: KimiDeltaAttention(16, 2, chunk_size=4),
    lambda: KimiDeltaAttention(16, 2, num_v_heads=4, expand_v=0.5, chunk_size=4),
]


@pytest.mark.parametrize("make", LAYERS)
def test_layer_runs_the_gated_delta_rule_on_normalised_keys(make):
    """Capture q, k, v as the layer builds them; check the op's output against the loop, with q
    and k normalised as fla does (x / sqrt(|x|^2 + 1e-6)) and each query/key head repeated for
    its group of value heads (fla's and Qwen3-Next's grouped layout)."""
    torch.manual_seed(0)
    layer = make().double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    seen = {}
    original = layer.recurrence

    def recurrence(x_, q, k, v, mode, S, keep):
        seen.update(q=q, k=k, v=v)
        return original(x_, q, k, v, mode, S, keep)

    layer.recurrence = recurrence
    layer(x)
    G = layer.num_v_heads // layer.n_heads
    q, k = (
        (t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)).repeat_interleave(G, dim=2)
        for t in (seen["q"], seen["k"])
    )
    beta = layer.beta(x)
    g = None if layer.decay is None else layer.decay(x)
    o, _ = original(x, seen["q"], seen["k"], seen["v"], "chunk", None, False)
    torch.testing.assert_close(o, literal_recurrence(q, k, seen["v"], beta, g), rtol=0, atol=1e-12)


def test_value_expansion_and_grouped_heads_widths():
    """fla's sizes: V = head_dim * expand_v (2 for Gated DeltaNet, 1 for KDA), HV value heads."""
    gdn = GatedDeltaNet(32, 2, 8, num_v_heads=4)
    assert (gdn.n_heads, gdn.num_v_heads, gdn.key_dim, gdn.head_dim) == (2, 4, 8, 16)
    assert gdn.q_proj.out_features == 16 and gdn.v_proj.out_features == 64
    assert gdn.b_proj.out_features == 4 and gdn.decay.A_log.shape == (4,)
    assert gdn.new_state(3, torch.float32)["S"].shape == (3, 4, 8, 16)
    kda = KimiDeltaAttention(32, 2, 8)
    assert (kda.key_dim, kda.head_dim) == (8, 8) and kda.decay.dt_bias.shape == (16,)
    assert kda.g_proj[1].bias is None  # transformers' g_b_proj; fla's layer: gate_bias=True
    assert KimiDeltaAttention(32, 2, 8, gate_bias=True).g_proj[1].bias is not None
    with pytest.raises(ValueError, match="num_v_heads"):
        GatedDeltaNet(32, 2, num_v_heads=3)
    with pytest.raises(ValueError, match="expand_v"):
        GatedDeltaNet(32, 2, 8, expand_v=0.3)


def test_decay_initialisation_follows_fla():
    """A ~ U(0, 16) in Gated DeltaNet (fla), U(1, 16) in KDA; dt_bias in Mamba-2's range."""
    torch.manual_seed(0)
    A_gdn = GatedDeltaNet(16, 2, num_v_heads=512).decay.A_log.exp()
    A_kda = KimiDeltaAttention(16, 2, num_v_heads=512).decay.A_log.exp()
    assert A_gdn.min() < 0.5 and A_gdn.max() < 16
    assert A_kda.min() >= 1 and A_kda.max() < 16
    dt = torch.nn.functional.softplus(KimiDeltaAttention(16, 2).decay.dt_bias)
    assert dt.min() >= 1e-3 - 1e-9 and dt.max() <= 0.1 + 1e-9


def test_gates_per_head_and_per_channel():
    x = torch.randn(2, 3, 16)
    assert GatedDeltaNet(16, 2).decay(x).shape == (2, 3, 2)
    kda = KimiDeltaAttention(16, 2)
    assert kda.decay(x).shape == (2, 3, 2, 8)
    assert kda.o_norm.activation == "sigmoid" and isinstance(kda.g_proj, torch.nn.Sequential)
    assert DeltaNet(16, 2).decay is None


def test_negative_eigenvalues_double_beta():
    torch.manual_seed(1)
    plain, doubled = DeltaNet(16, 2), DeltaNet(16, 2, allow_neg_eigval=True)
    doubled.load_state_dict(plain.state_dict())
    x = torch.randn(1, 5, 16)
    beta = plain.beta(x)
    assert ((beta > 0) & (beta < 1)).all()
    torch.testing.assert_close(doubled.beta(x), 2 * beta)
    assert not torch.allclose(plain(x)[0], doubled(x)[0])


def test_deltanet_defaults_are_flas_and_the_gated_subclasses_keep_theirs():
    """fla's DeltaNet: no output gate, eps 1e-5; Gated DeltaNet and KDA keep their output gates
    (fla's use_gate=True, eps 1e-5 as theirs)."""
    plain = DeltaNet(16, 2)
    assert plain.g_proj is None and plain.o_norm.eps == 1e-5 and plain.conv is not None
    assert DeltaNet(16, 2, output_gate=True, norm_eps=1e-6).g_proj is not None
    for cls in (GatedDeltaNet, KimiDeltaAttention):
        layer = cls(16, 2)
        assert layer.g_proj is not None and layer.o_norm.eps == 1e-5
    with pytest.raises(TypeError, match="fla's GatedDeltaNet"):
        GatedDeltaNet.from_fla(plain)
