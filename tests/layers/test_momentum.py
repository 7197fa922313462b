"""linattn.layers.MomentumDeltaNet: with fla's weights (``from_fla``) it computes fla's
``MomentumDeltaNet`` layer (run on the CPU through ``linattn.integrations.fla``), forward and
gradients, and its two states (the memory and the momentum) carry a prefill into token-by-token
decoding exactly."""

from __future__ import annotations

import pytest
import torch

from linattn.layers.momentum import MomentumDeltaNet

D = 32


def test_decoding_with_both_states_equals_the_whole_sequence():
    torch.manual_seed(0)
    layer = MomentumDeltaNet(D, 2, 16, num_v_heads=4).double()
    x = torch.randn(2, 11, D, dtype=torch.float64)
    y, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    assert set(state) == {"S", "M", "conv"}
    ys = []
    y0, state = layer(x[:, :6], state)
    ys.append(y0)
    for t in range(6, 11):
        y_t, state = layer(x[:, t : t + 1], state)
        ys.append(y_t)
    torch.testing.assert_close(torch.cat(ys, 1), y, rtol=0, atol=1e-12)


def test_equals_flas_layer_with_its_weights():
    pytest.importorskip("tests.fla_interpreter")
    pytest.importorskip("fla.layers")
    from fla.layers.momentum_deltanet import MomentumDeltaNet as FlaMomentumDeltaNet

    from linattn.integrations import fla as linattn_fla

    torch.manual_seed(0)
    theirs = FlaMomentumDeltaNet(hidden_size=D, head_dim=16, num_heads=2, layer_idx=0).train()
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours = MomentumDeltaNet.from_fla(theirs)
    x = torch.randn(2, 20, D)
    linattn_fla.enable()
    try:
        want = theirs(x)[0]
    finally:
        linattn_fla.disable()
    got = ours(x)[0]
    assert float((got - want).norm() / want.norm()) < 1e-5
    got.square().sum().backward()
    want.square().sum().backward()
    for name, p in ours.named_parameters():
        if name == "conv.weight":
            continue
        ref = dict(theirs.named_parameters())[name].grad
        assert float((p.grad - ref).norm() / ref.norm()) < 1e-4, name


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="min_log_mu must be None or a number <= 0"):
        MomentumDeltaNet(D, 2, 16, min_log_mu=1.0)
