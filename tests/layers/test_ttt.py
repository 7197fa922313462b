"""linattn.layers.TTTLinear and Titans: the whole sequence equals a prefill and decoding in any
pieces (across mini-batch boundaries, with and without the convolution and the gate), the
gradients through a state equal those of one call, gradcheck in float64, and bad options and
states are refused by name. fla has no layer for either (its ops are pinned in
tests/compat/test_ttt.py and test_titans.py)."""

from __future__ import annotations

import pytest
import torch

from linattn import registry
from linattn.layers import Titans, TTTLinear

D = 16
LAYERS = [TTTLinear, Titans]
SPLITS = {
    "prefill": [15],
    "prefill-then-steps": [6, 1, 1, 1, 5, 1],
    "steps": [1] * 15,
    "pieces": [3, 9, 3],
}


def _layer(cls, **kwargs):
    torch.manual_seed(0)
    return cls(D, 2, 8, chunk_size=4, **kwargs).double()


def _pieces(layer, x, split):
    state = layer.new_state(x.shape[0], x.dtype)
    ys, start = [], 0
    for n in split:
        y, state = layer(x[:, start : start + n], state)
        ys.append(y)
        start += n
    return torch.cat(ys, dim=1), state


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("cls", LAYERS)
def test_pieces_with_the_state_equal_the_whole_sequence(cls, split):
    """Mini-batches of 4: pieces that start and end inside one, and whole ones in between."""
    layer = _layer(cls)
    x = torch.randn(2, 15, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y, none = layer(x)
        y_pieces, state = _pieces(layer, x, SPLITS[split])
    assert none is None
    torch.testing.assert_close(y_pieces, y, rtol=0, atol=1e-12)
    assert state["offset"].tolist() == [15, 15]


@pytest.mark.parametrize("cls", LAYERS)
def test_without_convolution_and_gate(cls):
    layer = _layer(cls, short_conv=False, output_gate=False)
    assert "conv" not in layer.new_state(1, torch.float64) and layer.g_proj is None
    x = torch.randn(1, 9, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(_pieces(layer, x, [2, 1, 5, 1])[0], layer(x)[0], rtol=0,
                                   atol=1e-12)  # fmt: skip


@pytest.mark.parametrize("cls", LAYERS)
def test_gradients_through_the_state_equal_one_call(cls):
    """A prefill and three steps, and the whole sequence: the gradients of x and of every
    parameter agree; every parameter gets one."""
    layer = _layer(cls)
    x = torch.randn(2, 10, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    w = torch.randn(2, 10, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    grads = []
    for run in (lambda t: layer(t)[0], lambda t: _pieces(layer, t, [7, 1, 1, 1])[0]):
        layer.zero_grad()
        xi = x.clone().requires_grad_(True)
        (run(xi) * w).sum().backward()
        grads.append({"x": xi.grad, **{n: p.grad.clone() for n, p in layer.named_parameters()}})
    whole, pieces = grads
    for name, g in whole.items():
        assert g is not None and g.abs().sum() > 0, name
        torch.testing.assert_close(pieces[name], g, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("cls", LAYERS)
def test_gradcheck(cls):
    torch.manual_seed(0)
    layer = cls(8, 2, 4, chunk_size=2).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: layer(t)[0], (x,))


@pytest.mark.parametrize("cls", LAYERS)
def test_float32_layer_float32_states(cls):
    torch.manual_seed(0)
    layer = cls(D, 2, 8, chunk_size=4)
    x = torch.randn(2, 6, D)
    y, state = layer(x, layer.new_state(2, torch.float32))
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert all(t.dtype == torch.float32 for n, t in state.items() if n != "offset")
    assert state["offset"].dtype == torch.int64


def test_the_registry_names_the_layers():
    assert registry.get("ttt_linear").layer is TTTLinear
    assert registry.get("titans").layer is Titans


@pytest.mark.parametrize("cls", LAYERS)
def test_bad_options_and_states_are_refused_by_name(cls):
    with pytest.raises(ValueError, match="chunk_size must be an integer >= 1"):
        cls(D, 2, 8, chunk_size=0)
    with pytest.raises(ValueError, match="d_model \\(16\\) must be divisible by n_heads \\(3\\)"):
        cls(D, 3)
    with pytest.raises(ValueError, match="base_lr must be a number > 0"):
        cls(D, 2, 8, base_lr=0.0)
    with pytest.raises(ValueError, match="inner_eps must be a number >= 0"):
        cls(D, 2, 8, inner_eps=-1.0)
    with pytest.raises(TypeError, match="short_conv must be a bool"):
        cls(D, 2, 8, short_conv="yes")
    layer = _layer(cls)
    with pytest.raises(ValueError, match="x must have shape \\[B, T, 16\\]"):
        layer(torch.zeros(1, 3, 8, dtype=torch.float64))
    state = layer.new_state(2, torch.float64)
    state["offset"] = torch.tensor([0, 3])
    with pytest.raises(ValueError, match="state\\['offset'\\] must be the same for every sequence"):
        layer(torch.zeros(2, 1, D, dtype=torch.float64), state)
    with pytest.raises(ValueError, match="state\\['offset'\\] has dtype"):
        layer(torch.zeros(2, 1, D, dtype=torch.float64),
              {**layer.new_state(2, torch.float64), "offset": torch.zeros(2)})  # fmt: skip
