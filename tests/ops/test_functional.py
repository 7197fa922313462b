"""The shared helpers (l2norm, the step size and decay gate, the causal depthwise convolution),
each against a plain computation written here, and their edges."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from linattn.ops.functional import (
    causal_conv1d,
    conv_activation,
    decay_gate,
    l2norm,
    step_size,
    write_strength,
)

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def randn(*shape, dtype=torch.float64, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def tol(dtype):
    """Rounding of one elementwise formula in dtype: a few units of its last place."""
    return {torch.float64: 1e-15, torch.float32: 1e-6, torch.bfloat16: 2e-2}[dtype]


# ------------------------------------------------------------------------------------- l2norm


@pytest.mark.parametrize("divide", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_l2norm_is_x_over_the_root_of_its_square_norm_plus_eps(dtype, divide):
    x = randn(3, 5, 2, 16, dtype=dtype, seed=1)
    x[0, 0, 0] = 0  # a zero row stays zero (eps keeps the root away from 0)
    x64 = x.double()
    expected = x64 / (x64.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    y = l2norm(x, divide=divide)
    assert y.dtype == dtype
    torch.testing.assert_close(y.double(), expected, rtol=tol(dtype), atol=tol(dtype))
    assert (y[0, 0, 0] == 0).all()


def test_l2norm_eps_sits_inside_the_root():
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)  # |x|^2 = 25
    torch.testing.assert_close(l2norm(x, eps=11.0), x / 6.0, rtol=1e-15, atol=0)
    torch.testing.assert_close(l2norm(x, 11.0, divide=True), x / 6.0, rtol=1e-15, atol=0)


def test_l2norm_of_empty_inputs():
    assert l2norm(torch.randn(2, 0, 3, 8)).shape == (2, 0, 3, 8)
    assert l2norm(torch.randn(2, 4, 0)).shape == (2, 4, 0)  # no channels: nothing to scale


def test_l2norm_keeps_its_public_paths():
    """``linattn.ops.delta_rule.l2norm`` and ``linattn.layers.modules.l2norm`` are this one."""
    assert importlib.import_module("linattn.ops.delta_rule").l2norm is l2norm
    assert importlib.import_module("linattn.layers.modules").l2norm is l2norm


# -------------------------------------------------------------------------- step size, gate


def softplus64(x: torch.Tensor) -> torch.Tensor:
    """softplus in float64, written out: log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), and x
    itself above 20 (torch's threshold, as Mamba-2's and fla's kernels: off by < exp(-20))."""
    return torch.where(x > 20, x, x.clamp(min=0) + torch.log1p(torch.exp(-x.abs())))


@pytest.mark.parametrize("dtype", DTYPES)
def test_step_size_is_the_softplus_of_x_plus_bias(dtype):
    x, bias = randn(2, 7, 4, dtype=dtype, seed=2, scale=8), randn(4, dtype=dtype, seed=3)
    expected = softplus64(x.double() + bias.double())
    dt = step_size(x, bias)
    assert dt.dtype == dtype and (dt >= 0).all()
    torch.testing.assert_close(dt.double(), expected, rtol=tol(dtype), atol=tol(dtype))
    torch.testing.assert_close(step_size(x).double(), softplus64(x.double()), rtol=tol(dtype),
                               atol=tol(dtype))  # fmt: skip


def test_step_size_adds_in_the_inputs_dtype_then_casts():
    """Mamba-2's layer: ``(dt + dt_bias)`` rounded in bfloat16, then the softplus in float32."""
    x, bias = randn(2, 7, 4, dtype=torch.bfloat16, seed=4), randn(4, dtype=torch.bfloat16, seed=5)
    dt = step_size(x, bias, dtype=torch.float32)
    assert dt.dtype == torch.float32
    assert torch.equal(dt, F.softplus((x + bias).float()))
    assert not torch.equal(dt, F.softplus(x.float() + bias.float()))  # the order is visible


def test_step_size_limit_and_without_softplus():
    x = torch.linspace(-30, 30, 61, dtype=torch.float64)
    clamped = step_size(x, limit=(0.01, 2.0))
    torch.testing.assert_close(clamped, softplus64(x).clamp(0.01, 2.0), rtol=1e-15, atol=0)
    assert clamped.min() == 0.01 and clamped.max() == 2.0
    assert torch.equal(step_size(x, softplus=False), x)  # the raw step, default limit: no clamp
    assert torch.equal(step_size(x, softplus=False, limit=(-1.0, 1.0)), x.clamp(-1, 1))
    assert step_size(torch.empty(2, 0, 4)).shape == (2, 0, 4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decay_gate_per_head_is_minus_exp_A_log_times_the_step(dtype):
    x = randn(2, 7, 4, dtype=dtype, seed=6, scale=8)
    A_log, bias = randn(4, dtype=dtype, seed=7), randn(4, dtype=dtype, seed=8)
    g = decay_gate(x, A_log, bias)
    expected = -torch.exp(A_log.double()) * softplus64(x.double() + bias.double())
    assert g.shape == (2, 7, 4) and g.dtype == dtype and (g <= 0).all()
    torch.testing.assert_close(g.double(), expected, rtol=4 * tol(dtype), atol=tol(dtype))


def test_decay_gate_per_channel_broadcasts_A_log_per_head_and_bias_per_channel():
    x = randn(2, 7, 3, 5, seed=9, scale=8)  # [B, T, H, K]
    A_log, bias = randn(3, seed=10), randn(3, 5, seed=11)
    g = decay_gate(x, A_log[:, None], bias)
    for h in range(3):
        for c in range(5):
            step = softplus64(x[:, :, h, c] + bias[h, c])
            torch.testing.assert_close(g[:, :, h, c], -math.exp(A_log[h]) * step, rtol=1e-14,
                                       atol=0)  # fmt: skip
    assert torch.equal(decay_gate(x, A_log[:, None]), -torch.exp(A_log[:, None]) * F.softplus(x))


def test_decay_gate_gradients():
    x, A_log, bias = randn(2, 3, 4, seed=12), randn(4, seed=13), randn(4, seed=14)
    inputs = [t.clone().requires_grad_() for t in (x, A_log, bias)]
    assert torch.autograd.gradcheck(decay_gate, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_strength_is_the_sigmoid_doubled_with_negative_eigenvalues(dtype):
    x = randn(2, 7, 4, dtype=dtype, seed=15, scale=6)
    beta = 1 / (1 + torch.exp(-x.double()))
    torch.testing.assert_close(write_strength(x).double(), beta, rtol=tol(dtype), atol=tol(dtype))
    both = write_strength(x, allow_neg_eigval=True)
    assert both.dtype == dtype and (both >= 0).all() and (both <= 2).all()  # rounded to 2
    torch.testing.assert_close(both.double(), 2 * beta, rtol=tol(dtype), atol=2 * tol(dtype))


# ------------------------------------------------------------------ causal depthwise convolution


def conv_by_padding(x, weight, bias=None):
    """The plain causal conv: W - 1 zeros padded on the left, then a valid depthwise conv."""
    D, W = weight.shape
    if x.shape[-1] == 0:  # conv1d refuses an input shorter than the kernel
        return x.clone()
    return F.conv1d(F.pad(x, (W - 1, 0)), weight[:, None], bias, groups=D)


def conv_by_loop(xs, weight, bias, T):
    """The formula, token by token, over xs = cat(state, x): the last T outputs."""
    D, W = weight.shape
    L = xs.shape[-1]
    y = torch.zeros(xs.shape[0], D, T, dtype=xs.dtype)
    for t in range(T):
        end = L - T + t + 1  # the window ends at x_t
        y[..., t] = (xs[..., end - W : end] * weight).sum(-1) + (0 if bias is None else bias)
    return y


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("T", [0, 1, 3, 9])
def test_causal_conv1d_from_zeros_is_the_padded_convolution(T, W):
    x, weight, bias = randn(2, 6, T, seed=15), randn(6, W, seed=16), randn(6, seed=17)
    y, state = causal_conv1d(x, weight, bias)
    assert y.shape == (2, 6, T) and state.shape == (2, 6, W - 1)
    torch.testing.assert_close(y, conv_by_padding(x, weight, bias), rtol=1e-15, atol=1e-15)
    xs = torch.cat([x.new_zeros(2, 6, W - 1), x], -1)
    torch.testing.assert_close(y, conv_by_loop(xs, weight, bias, T), rtol=1e-14, atol=1e-14)
    assert torch.equal(state, xs[..., xs.shape[-1] - (W - 1) :])  # the last W - 1 inputs
    y0, _ = causal_conv1d(x, weight)  # no bias
    torch.testing.assert_close(y0, conv_by_padding(x, weight), rtol=1e-15, atol=1e-15)
    leaf = x.clone().requires_grad_()
    causal_conv1d(leaf, weight, bias)[0].sum().backward()  # T = 0 too: y stays in the graph
    for t in range(T):  # d(sum y)/dx_t: the taps of the outputs t .. t + W - 1 that exist
        reach = min(T - 1, t + W - 1) - t
        expected = weight[:, W - 1 - reach :].sum(-1).expand(2, 6)
        torch.testing.assert_close(leaf.grad[..., t], expected, rtol=1e-15, atol=1e-15)
    assert leaf.grad.shape == x.shape


@pytest.mark.parametrize("S", [3, 4, 6])
def test_causal_conv1d_with_a_state_reads_its_last_inputs_only(S):
    """A state of S >= W - 1 inputs: y reads its last W - 1; the new state is the last S
    entries of cat(state, x) (transformers keeps S = W, fla W, linattn W - 1)."""
    W, T = 4, 5
    x, weight, bias = randn(2, 6, T, seed=18), randn(6, W, seed=19), randn(6, seed=20)
    state = randn(2, 6, S, seed=21)
    y, new = causal_conv1d(x, weight, bias, state)
    xs = torch.cat([state, x], -1)
    torch.testing.assert_close(y, conv_by_loop(xs, weight, bias, T), rtol=1e-14, atol=1e-14)
    assert torch.equal(new, xs[..., -S:])
    older = state.clone()
    older[..., : S - (W - 1)] = 1e6  # slots no output reads
    assert torch.equal(causal_conv1d(x, weight, bias, older)[0], y)


def test_causal_conv1d_in_pieces_equals_one_call_and_the_step_is_its_last_output():
    W, T = 4, 11
    x, weight, bias = randn(2, 6, T, seed=22), randn(6, W, seed=23), randn(6, seed=24)
    whole, whole_state = causal_conv1d(x, weight, bias)
    outs, state = [], None
    for a, b in [(0, 0), (0, 2), (2, 3), (3, 3), (3, 10)]:  # empty pieces included
        y, state = causal_conv1d(x[..., a:b], weight, bias, state)
        outs.append(y)
    y, state = causal_conv1d(x[..., 10:], weight, bias, state)  # the decoding step, T = 1
    torch.testing.assert_close(y, whole[..., -1:], rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(torch.cat(outs, -1), whole[..., :10], rtol=1e-15, atol=1e-15)
    assert torch.equal(state, whole_state)


def test_causal_conv1d_empty_time_keeps_the_state():
    weight, state = randn(6, 4, seed=25), randn(2, 6, 3, seed=26)
    y, new = causal_conv1d(torch.empty(2, 6, 0, dtype=torch.float64), weight, None, state)
    assert y.shape == (2, 6, 0) and torch.equal(new, state)


def test_causal_conv1d_refuses_a_state_shorter_than_the_kernel_reads():
    with pytest.raises(ValueError, match="state holds 2 inputs"):
        causal_conv1d(torch.randn(1, 3, 5), torch.randn(3, 4), None, torch.randn(1, 3, 2))


def test_causal_conv1d_gradients():
    x, weight, bias, state = randn(2, 3, 5, seed=27), randn(3, 4, seed=28), randn(3, seed=29), \
        randn(2, 3, 4, seed=30)  # fmt: skip
    inputs = [t.clone().requires_grad_() for t in (x, weight, bias, state)]
    assert torch.autograd.gradcheck(lambda *a: causal_conv1d(*a), inputs)


def test_conv_activation_is_none_or_silu():
    y = randn(2, 3, 5, seed=31)
    assert conv_activation(y, None) is y
    for name in ("silu", "swish"):
        torch.testing.assert_close(conv_activation(y, name), y / (1 + torch.exp(-y)), rtol=1e-15,
                                   atol=1e-15)  # fmt: skip
    with pytest.raises(ValueError, match="activation must be None, 'silu' or 'swish', got 'relu'"):
        conv_activation(y, "relu")
