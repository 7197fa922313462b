"""``linattn.ops.diagonal``: the element-wise recurrence h_t = exp(g_t) h_{t-1} + x_t in chunks,
against the token loop in float64 (values and every gradient), at lengths that leave a partial
chunk, one chunk, and chunks of chunks."""

from __future__ import annotations

import pytest
import torch

from linattn.ops.diagonal import diagonal_recurrence


def _loop(x, g, h0):
    h = torch.zeros_like(x[:, 0]) if h0 is None else h0
    out = []
    for t in range(x.shape[1]):
        h = g[:, t].exp() * h + x[:, t]
        out.append(h)
    return torch.stack(out, 1)


def _inputs(T, with_state, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, 3, 5, generator=gen, dtype=torch.float64)
    g = -2 * torch.rand(2, T, 3, 5, generator=gen, dtype=torch.float64)
    h0 = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64) if with_state else None
    return x, g, h0


def _value_and_grads(fn, x, g, h0):
    leaves = [t.clone().requires_grad_(True) for t in (x, g, h0) if t is not None]
    h = fn(*leaves, *([None] if h0 is None else []))
    weights = torch.linspace(-1, 1, h.numel(), dtype=h.dtype).view_as(h)
    ((h * weights).sum() + h[:, -1].square().sum()).backward()
    return [h.detach(), *(t.grad for t in leaves)]


@pytest.mark.parametrize("T", [1, 7, 16, 37, 300])
@pytest.mark.parametrize("chunk_size", [1, 4, 16])
@pytest.mark.parametrize("with_state", [True, False], ids=["h0", "no_h0"])
def test_the_chunk_form_equals_the_token_loop_in_float64(T, chunk_size, with_state):
    x, g, h0 = _inputs(T, with_state)
    ours = _value_and_grads(lambda *t: diagonal_recurrence(*t, chunk_size=chunk_size), x, g, h0)
    loop = _value_and_grads(_loop, x, g, h0)
    for a, b in zip(ours, loop, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_decay_constant_over_the_tokens_may_be_an_expanded_view():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 50, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    w = (-torch.rand(6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    h = diagonal_recurrence(x, w.expand(2, 50, 6), chunk_size=4)
    ref = _loop(x, w.expand(2, 50, 6), None)
    torch.testing.assert_close(h, ref, rtol=0, atol=1e-12)
    ours = torch.autograd.grad(h.sum(), (x, w))
    theirs = torch.autograd.grad(ref.sum(), (x, w))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_a_reset_forgets_the_state():
    x, g, h0 = _inputs(20, True)
    g[:, 9] = float("-inf")
    h = diagonal_recurrence(x, g, h0, chunk_size=4)
    torch.testing.assert_close(h, _loop(x, g, h0), rtol=0, atol=1e-12)
    fresh = diagonal_recurrence(x[:, 9:], g[:, 9:].clamp(min=-1e300), None, chunk_size=4)
    torch.testing.assert_close(h[:, 9:], fresh, rtol=0, atol=1e-12)


def test_float32_is_near_float64():
    x, g, h0 = _inputs(333, True)
    h32 = diagonal_recurrence(x.float(), g.float(), h0.float(), chunk_size=16)
    assert h32.dtype == torch.float32
    error = (h32.double() - _loop(x, g, h0)).norm() / _loop(x, g, h0).norm()
    assert error < 1e-6


def test_no_tokens_gives_an_empty_output():
    x, g, h0 = _inputs(0, True)
    assert diagonal_recurrence(x, g, h0).shape == (2, 0, 3, 5)


def test_bad_arguments_are_refused_by_name():
    x, g, h0 = _inputs(5, True)
    with pytest.raises(ValueError, match="g is a log-decay and must be <= 0"):
        diagonal_recurrence(x, -g)
    with pytest.raises(ValueError, match="g contains NaN"):
        diagonal_recurrence(x, torch.full_like(g, float("nan")))
    with pytest.raises(ValueError, match="g must have x's shape"):
        diagonal_recurrence(x, g[..., :2])
    with pytest.raises(ValueError, match="x contains non-finite"):
        diagonal_recurrence(torch.full_like(x, float("inf")), g)
    with pytest.raises(ValueError, match="initial_state must have shape"):
        diagonal_recurrence(x, g, h0[:, :1])
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        diagonal_recurrence(x, g, chunk_size=0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        diagonal_recurrence([1.0], g)
