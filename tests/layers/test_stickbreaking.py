"""``StickBreakingAttention``: fla 0.6.0's layer with the same weights (on the CPU under
``linattn.integrations.fla``), the weights written out, generation with its KV cache in pieces
against one call (float64), what it refuses."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import StickBreakingAttention
from tests.layers.pieces import check_from_fla, check_pieces


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "attend_current": True,
                                          "num_kv_heads": 1, "qkv_bias": True}])  # fmt: skip
def test_equals_fla_s_layer_with_its_weights(options):
    check_from_fla("StickBreakingAttention", StickBreakingAttention, 32, num_heads=2, **options)


@pytest.mark.parametrize("attend_current", [False, True])
def test_equals_its_formula(attend_current):
    torch.manual_seed(0)
    layer = StickBreakingAttention(16, 2, attend_current=attend_current, chunk_size=4).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        y, _ = layer(x)
        q, k, v = (p(x).view(2, 7, 2, 8) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
        beta = torch.sigmoid(torch.einsum("bthd,bshd->bhts", q, k) / 8**0.5)
        A = torch.zeros_like(beta)
        for t in range(7):
            for s in range(t + 1 if attend_current else t):
                end = t + 1 if attend_current else t
                A[:, :, t, s] = beta[:, :, t, s] * (1 - beta[:, :, t, s + 1 : end]).prod(-1)
        want = layer.o_proj(torch.einsum("bhts,bshd->bthd", A, v).reshape(2, 7, 16))
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attend_current", [False, True])
def test_generation_in_pieces_equals_one_call_in_float64(attend_current):
    torch.manual_seed(1)
    layer = StickBreakingAttention(16, 4, num_kv_heads=2, qk_norm=True, chunk_size=4,
                                   attend_current=attend_current).double()  # fmt: skip
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    state = check_pieces(layer, x, [5, 6, 7, 11])
    assert state["k"].shape == (2, 13, 2, 4)
    check_pieces(layer, x, [1, 2, 3])


def test_bad_options_and_inputs_are_refused():
    with pytest.raises(ValueError, match="num_kv_heads must divide n_heads"):
        StickBreakingAttention(16, 4, num_kv_heads=3)
    with pytest.raises(TypeError, match="attend_current must be a bool"):
        StickBreakingAttention(16, 2, attend_current="yes")
    with pytest.raises(TypeError, match="fla's StickBreakingAttention"):
        StickBreakingAttention.from_fla(StickBreakingAttention(16, 2))
    layer = StickBreakingAttention(16, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        layer(torch.randn(2, 3, 15))
    with pytest.raises(ValueError, match=r"state\['k'\] has shape"):
        layer(torch.randn(2, 3, 16), StickBreakingAttention(16, 4).new_state(2, torch.float32))
