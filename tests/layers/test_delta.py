"""The delta-rule layers: what each builds, and the recurrence it runs against a literal loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.layers import DeltaNet, GatedDeltaNet, KimiDeltaAttention


def literal_recurrence(q, k, v, beta, g):
    """S <- Diag(alpha) S; S <- S + beta k (v - S^T k)^T; o = S^T q / sqrt(K) (DESIGN.md)."""
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


@pytest.mark.parametrize("cls", [DeltaNet, GatedDeltaNet, KimiDeltaAttention])
def test_layer_runs_the_gated_delta_rule_on_normalised_keys(cls):
    """Capture q, k, v as the layer builds them; check the op's output against the loop."""
    torch.manual_seed(0)
    layer = cls(16, 2, chunk_size=4).double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    seen = {}
    original = layer.recurrence

    def recurrence(x_, q, k, v, mode, S, keep):
        seen.update(q=q, k=k, v=v)
        return original(x_, q, k, v, mode, S, keep)

    layer.recurrence = recurrence
    layer(x)
    q, k = F.normalize(seen["q"], dim=-1), F.normalize(seen["k"], dim=-1)
    beta = layer.beta(x)
    g = None if layer.decay is None else layer.decay(x)
    o, _ = original(x, seen["q"], seen["k"], seen["v"], "chunk", None, False)
    torch.testing.assert_close(o, literal_recurrence(q, k, seen["v"], beta, g), rtol=0, atol=1e-12)


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
    """fla's DeltaNet: no output gate, eps 1e-5; Gated DeltaNet and KDA keep their gates."""
    plain = DeltaNet(16, 2)
    assert plain.g_proj is None and plain.o_norm.eps == 1e-5 and plain.conv is not None
    assert DeltaNet(16, 2, output_gate=True, norm_eps=1e-6).g_proj is not None
    for cls in (GatedDeltaNet, KimiDeltaAttention):
        layer = cls(16, 2)
        assert layer.g_proj is not None and layer.o_norm.eps == 1e-6
    with pytest.raises(TypeError, match="DeltaNet.from_fla"):
        GatedDeltaNet.from_fla(plain)
