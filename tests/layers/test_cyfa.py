"""linattn.layers.cyfa: fla's CyclicFlowAttention layer with its weights loaded
(``from_fla``) computes what fla's layer computes under ``enable()`` (forward and gradients),
decoding with the state equals the whole sequence, and bad options are refused by name."""

from __future__ import annotations

import pytest
import torch

from linattn.layers.cyfa import CyclicFlowAttention


def test_decoding_with_the_state_equals_the_whole_sequence():
    torch.manual_seed(0)
    layer = CyclicFlowAttention(16, n_heads=2, head_dim=8, num_slots=6).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    y, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    y1, state = layer(x[:, :5], state)
    steps = [y1]
    for t in range(5, 9):
        y_t, state = layer(x[:, t : t + 1], state)
        steps.append(y_t)
    torch.testing.assert_close(torch.cat(steps, dim=1), y, rtol=0, atol=1e-12)


def test_bad_options_are_refused_by_name():
    with pytest.raises(ValueError, match="num_slots must be a positive even integer"):
        CyclicFlowAttention(16, 2, 8, num_slots=5)
    with pytest.raises(ValueError, match="head_dim \\* expand_k"):
        CyclicFlowAttention(16, 2, 8, expand_k=0.3)
    with pytest.raises(ValueError, match="x must have shape"):
        CyclicFlowAttention(16, 2, 8, num_slots=4)(torch.zeros(1, 3, 8))


def test_equals_flas_layer_under_enable():
    pytest.importorskip("tests.fla_interpreter")  # before fla
    fla_layers = pytest.importorskip("fla.layers")
    from linattn.integrations import fla as linattn_fla

    torch.manual_seed(0)
    theirs = fla_layers.CyclicFlowAttention(
        hidden_size=32, head_dim=16, num_heads=2, num_slots=8, layer_idx=0
    ).train()
    with torch.no_grad():  # away from the identity readout and the unit norms
        theirs.readout.add_(0.2 * torch.randn_like(theirs.readout))
        theirs.q_norm.weight.add_(0.3 * torch.rand_like(theirs.q_norm.weight))
    ours = CyclicFlowAttention.from_fla(theirs)
    x = torch.randn(2, 19, 32)
    w = torch.randn(2, 19, 32)
    results = []
    linattn_fla.enable()
    try:
        for layer in (theirs, ours):
            xi = x.clone().requires_grad_(True)
            y = layer(xi)[0]
            (y * w).sum().backward()
            grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
            results.append((y.detach(), xi.grad, grads))
            layer.zero_grad()
    finally:
        linattn_fla.disable()
    (y_ref, dx_ref, g_ref), (y, dx, g) = results

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp_min(1e-30))

    assert rel(y, y_ref) < 1e-5 and rel(dx, dx_ref) < 1e-5
    assert g.keys() == g_ref.keys()
    for name in g:
        assert rel(g[name], g_ref[name]) < 1e-4, name
