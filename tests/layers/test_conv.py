"""GatedConvolution (the "conv" block): the formula, causality, pieces with a state, bad input."""

from __future__ import annotations

import pytest
import torch

from linattn.layers import GatedConvolution


def make(d_model: int = 6, kernel_size: int = 3) -> GatedConvolution:
    torch.manual_seed(0)
    return GatedConvolution(d_model, kernel_size).double()


def test_is_the_gated_causal_formula():
    layer = make()
    x = torch.randn(2, 9, 6, dtype=torch.float64)
    y, state = layer(x)
    assert state is None
    h = layer.conv.weight[:, 0, :]  # [d, k]
    W, b = layer.proj.weight, layer.proj.bias
    expected = torch.zeros_like(x)
    for t in range(9):
        window = torch.zeros_like(x[:, 0])
        for i in range(3):  # y_t = (W x_t + b) * sum_i h_i x_{t - k + 1 + i}
            s = t - 2 + i
            if s >= 0:
                window += h[:, i] * x[:, s]
        expected[:, t] = (x[:, t] @ W.T + b) * window
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-13)


def test_is_causal():
    layer = make()
    x = torch.randn(1, 10, 6, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6:] += 1.0
    y, _ = layer(x)
    y_changed, _ = layer(changed)
    torch.testing.assert_close(y_changed[:, :6], y[:, :6], rtol=0, atol=0)
    assert (y_changed[:, 6:] - y[:, 6:]).abs().max() > 0


@pytest.mark.parametrize("pieces", [(1,) * 8, (3, 1, 4), (2, 6), (8,)])
def test_pieces_with_a_state_match_one_call(pieces):
    layer = make(kernel_size=4)
    x = torch.randn(2, sum(pieces), 6, dtype=torch.float64)
    whole, _ = layer(x)
    state = layer.new_state(2, torch.float64)
    assert state["conv"].shape == (2, 6, 3)
    outs, start = [], 0
    for n in pieces:
        y, state = layer(x[:, start : start + n], state)
        outs.append(y)
        start += n
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=0, atol=1e-14)
    torch.testing.assert_close(state["conv"], x[:, -3:].transpose(1, 2))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="kernel_size must be an integer >= 1"):
        GatedConvolution(4, kernel_size=0)
    with pytest.raises(ValueError, match="d_model must be an integer >= 1"):
        GatedConvolution(0)
    layer = GatedConvolution(4)
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, 4\]"):
        layer(torch.randn(1, 3, 5))
    with pytest.raises(ValueError, match=r"state\['conv'\] has shape"):
        layer(torch.randn(1, 3, 4), {"conv": torch.zeros(1, 4, 3)})
