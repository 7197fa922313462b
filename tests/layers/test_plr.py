"""``IPLR`` and ``DPLR``: their recurrence written out token by token, the forms, generation in
pieces against one call (float64), IPLR as DeltaNet's rule when lambda is one beta, what they
refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.layers import DPLR, IPLR
from tests.layers.pieces import check_pieces


def _memory_outputs(layer, x):
    """The module docstring's recurrence, token by token: o [B, T, H, V] before the norm (q, k
    L2-normalised with eps 1e-6 inside the root, as fla's and linattn's l2norm)."""
    B, T, _ = x.shape
    H, K, V = layer.n_heads, layer.key_dim, layer.head_dim
    qkv = torch.cat([layer.q_proj(x), layer.k_proj(x), layer.v_proj(x)], -1)
    qkv, _ = layer.conv(qkv)  # short convolution + SiLU
    q, k, v = qkv.split([H * K, H * K, H * V], -1)
    q, k = q.view(B, T, H, K), k.view(B, T, H, K)
    q, k = (t / (t.square().sum(-1, keepdim=True) + 1e-6).sqrt() for t in (q, k))  # fla's eps
    v = v.view(B, T, H, V)
    rate = torch.sigmoid(layer.rate_proj(x)).view(B, T, H, K) * (2 if layer.allow_neg_eigval else 1)
    alpha = None if layer.decay is None else layer.decay(x).exp()
    S, outs = torch.zeros(B, H, K, V, dtype=x.dtype), []
    for t in range(T):
        kl = k[:, t] * rate[:, t]  # [B, H, K]
        read = torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        decayed = S if alpha is None else alpha[:, t, :, :, None] * S
        S = decayed - kl[..., None] * read[:, :, None] + kl[..., None] * v[:, t, :, None]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] / K**0.5, S))
    return torch.stack(outs, 1)


@pytest.mark.parametrize("cls", [IPLR, DPLR])
@pytest.mark.parametrize("neg", [False, True])
def test_equals_its_recurrence_in_every_form(cls, neg):
    torch.manual_seed(0)
    layer = cls(16, 2, allow_neg_eigval=neg, chunk_size=4).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    with torch.no_grad():
        o = _memory_outputs(layer, x)
        gate = layer.g_proj(x).view(2, 11, 2, 8)
        want = layer.o_proj(layer.o_norm(o, gate).reshape(2, 11, 16))
        for mode in ("chunk", "recurrent", "parallel"):
            layer.mode = mode
            torch.testing.assert_close(layer(x)[0], want, rtol=0, atol=1e-12)


def test_iplr_with_one_rate_per_head_is_deltanet_s_rule():
    torch.manual_seed(3)
    B, T, H, K, V = 2, 9, 2, 4, 3
    q, k = (F.normalize(torch.randn(B, T, H, K, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, dtype=torch.float64)
    beta = torch.rand(B, T, H, dtype=torch.float64)
    written = k * beta[..., None]
    from linattn import ops

    ours, _ = ops.generalized_delta_rule(q, written, v, -written, k, mode="recurrent")
    delta, _ = ops.delta_rule(q, k, v, beta, mode="recurrent")
    torch.testing.assert_close(ours, delta, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cls", [IPLR, DPLR])
def test_generation_in_pieces_equals_one_call_in_float64(cls):
    torch.manual_seed(1)
    layer = cls(16, 2, chunk_size=4).double()
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    check_pieces(layer, x, [5, 6, 7, 11])
    check_pieces(layer, x, [1, 2, 3])


def test_bad_options_and_inputs_are_refused():
    with pytest.raises(ValueError, match="takes no grouped value heads"):
        DPLR(16, 2, num_v_heads=4)
    with pytest.raises(TypeError, match="allow_neg_eigval must be a bool"):
        IPLR(16, 2, allow_neg_eigval=1)
    with pytest.raises(ValueError, match="dt_range must be a pair"):
        DPLR(16, 2, dt_init_range=(0.1, 0.01))
    layer = IPLR(16, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match=r"state\['S'\] has shape"):
        layer(torch.randn(2, 3, 16), layer.new_state(3, torch.float32))
