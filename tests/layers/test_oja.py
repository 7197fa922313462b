"""linattn.layers.GatedOja: a prefill and token-by-token decoding equal one call (grouped value
heads too), the chunk and recurrent forms agree, every parameter gets a gradient, and bad
options are refused by name. fla has no layer for the gated Oja rule (its op is pinned in
tests/compat/test_gated_oja_rule.py)."""

from __future__ import annotations

import pytest
import torch

from linattn import registry
from linattn.layers import GatedOja

D = 16


@pytest.mark.parametrize("num_v_heads", [None, 4])
def test_decoding_with_the_state_equals_the_whole_sequence(num_v_heads):
    torch.manual_seed(0)
    layer = GatedOja(D, 2, 8, num_v_heads=num_v_heads, chunk_size=4).double()
    x = torch.randn(2, 11, D, dtype=torch.float64)
    with torch.no_grad():
        y, _ = layer(x)
        state = layer.new_state(2, torch.float64)
        assert set(state) == {"S", "conv"}
        ys = []
        y0, state = layer(x[:, :6], state)
        ys.append(y0)
        for t in range(6, 11):
            y_t, state = layer(x[:, t : t + 1], state)
            ys.append(y_t)
    torch.testing.assert_close(torch.cat(ys, 1), y, rtol=0, atol=1e-12)


def test_chunk_and_recurrent_forms_agree_and_every_parameter_learns():
    torch.manual_seed(0)
    layer = GatedOja(D, 2, 8, expand_v=2.0).double()
    x = torch.randn(2, 13, D, dtype=torch.float64)
    layer.mode = "recurrent"
    y_recurrent, _ = layer(x)
    layer.mode = None
    y, _ = layer(x)
    torch.testing.assert_close(y, y_recurrent, rtol=0, atol=1e-12)
    y.square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_the_registry_names_the_layer():
    assert registry.get("gated_oja").layer is GatedOja


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="head_dim \\* expand_v must be a whole number"):
        GatedOja(D, 2, 8, expand_v=0.3)
    with pytest.raises(ValueError, match="num_v_heads \\(3\\) must be a multiple of n_heads"):
        GatedOja(D, 2, 8, num_v_heads=3)
    with pytest.raises(ValueError, match="dt_init_range"):
        GatedOja(D, 2, 8, dt_init_range=(0.1, 0.01))
    with pytest.raises(ValueError, match="x must have shape \\[B, T, 16\\]"):
        GatedOja(D, 2, 8)(torch.zeros(1, 3, 8))
