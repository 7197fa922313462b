"""linattn.layers.PaTHAttention: fla's layer's outputs with its weights, and generation from
fla's cache (carried keys, values, the gates' running sum)."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import PaTHAttention

OPTIONS = [{}, {"use_forget_gate": True, "use_qk_norm": True, "num_kv_heads": 1}]


@pytest.mark.parametrize("options", OPTIONS)
def test_equals_fla_s_layer_with_its_weights(options):
    from linattn.integrations import fla as fla_integration

    pytest.importorskip("tests.fla_interpreter")  # before fla

    fla_layers = pytest.importorskip("fla.layers")
    fla_integration.enable()
    try:
        torch.manual_seed(0)
        theirs = fla_layers.PaTHAttention(hidden_size=32, num_heads=2, **options)
        ours = PaTHAttention(32, 2, **options)
        ours.load_state_dict(theirs.state_dict())
        x = torch.randn(2, 9, 32)
        torch.testing.assert_close(ours(x)[0], theirs(x)[0], rtol=1e-5, atol=1e-5)
    finally:
        fla_integration.disable()


@pytest.mark.parametrize("options", OPTIONS)
def test_the_cache_continues_the_sequence(options):
    torch.manual_seed(1)
    layer = PaTHAttention(32, 2, **options)
    x = torch.randn(2, 10, 32)
    whole = layer(x)[0]
    state = layer.new_state(2, torch.float32)
    parts = []
    for a, b in ((0, 4), (4, 5), (5, 10)):
        y, state = layer(x[:, a:b], state)
        parts.append(y)
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-5, atol=1e-5)


def test_bad_heads_are_refused():
    with pytest.raises(ValueError, match="num_kv_heads must divide n_heads"):
        PaTHAttention(32, 4, num_kv_heads=3)
