"""``linattn.ops.conv.short_conv``: the fused C++ short convolution (float32, CPU) against the
PyTorch formula in float64, every input's gradient, states and pieces, odd strides, second
derivatives, the registered ops' schemas and fake kernels, and bad input named."""

import pytest
import torch

from linattn.ops import _native
from linattn.ops.conv import _reference, short_conv

native = pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")

# (B, T, C, W, S): S the state's length (None: no state); sizes that are no multiple of a vector's
# width, T across the kernel's 64-token tasks, T shorter than the kernel, W = 1.
SHAPES = [
    (2, 7, 5, 4, None),
    (3, 70, 33, 3, 6),
    (1, 1, 8, 4, 3),
    (2, 130, 16, 4, 3),
    (2, 2, 3, 4, None),
    (1, 65, 9, 1, None),
    (1, 9, 4, 2, 1),
]


def inputs(B, T, C, W, S, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=gen, dtype=dtype)
    w = torch.randn(C, W, generator=gen, dtype=dtype)
    state = None if S is None else torch.randn(B, C, S, generator=gen, dtype=dtype)
    return x, w, state


def outputs_and_grads(x, w, state, activation, d_y, d_state):
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w)]
    leaves.append(None if state is None else state.detach().clone().requires_grad_(True))
    y, new_state = short_conv(leaves[0], leaves[1], leaves[2], activation)
    loss = (y * d_y.to(y.dtype)).sum() + (new_state * d_state.to(y.dtype)).sum()
    loss.backward()
    grads = [t.grad for t in leaves if t is not None]
    return [y, new_state, *grads]


@native
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_fused_equals_the_float64_formula_with_every_gradient(shape, activation):
    x, w, state = inputs(*shape)
    B, T, C, W, S = shape
    gen = torch.Generator().manual_seed(1)
    d_y = torch.randn(B, T, C, generator=gen, dtype=torch.float64)
    d_state = torch.randn(B, C, W - 1 if S is None else S, generator=gen, dtype=torch.float64)
    ours = outputs_and_grads(x.float(), w.float(), None if state is None else state.float(),
                             activation, d_y, d_state)  # fmt: skip
    exact = outputs_and_grads(x, w, state, activation, d_y, d_state)
    for a, b in zip(ours, exact, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape
        atol = 1e-5 * (1 + b.detach().abs().amax().item()) if b.numel() else 0.0
        torch.testing.assert_close(a.detach().double(), b.detach(), rtol=1e-5, atol=atol)


@native
def test_the_fused_path_runs_and_equals_pytorch_to_rounding():
    # the same float32 inputs through the C++ kernels and through the PyTorch formula
    x, w, state = (t.float() for t in inputs(3, 70, 33, 3, 6))
    y, _ = short_conv(x, w, state)
    torch.testing.assert_close(y, _reference(x, w, state, True), rtol=2e-6, atol=2e-6)
    calls = torch.ops.linattn_native.short_conv_forward.default(x, w, None, state, True)
    assert torch.equal(calls, y)


@native
def test_pieces_with_the_state_passed_along_equal_one_call():
    x, w, _ = (t.float() if t is not None else None for t in inputs(2, 50, 12, 4, None))
    whole, final = short_conv(x, w)
    state, pieces = None, []
    for lo, hi in [(0, 1), (1, 3), (3, 20), (20, 21), (21, 50)]:
        y, state = short_conv(x[:, lo:hi], w, state)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=0, atol=1e-6)
    torch.testing.assert_close(state, final, rtol=0, atol=0)


@native
def test_the_new_state_is_no_view_of_the_input():
    x, w, _ = (t.float() if t is not None else None for t in inputs(1, 10, 4, 4, None))
    _, new_state = short_conv(x, w)
    new_state.zero_()  # a cache updating its state in place
    assert x.abs().sum() > 0 and not torch.equal(x[:, -3:], torch.zeros_like(x[:, -3:]))


@native
def test_rows_read_with_strides_and_a_strided_output_gradient():
    # x a slice of a wider projection ([B, T, 3C] -> the middle C channels), d_y transposed
    wide, w, state = (t.float() for t in inputs(2, 40, 21, 4, 3))
    x = wide[..., 7:14]
    w = w[7:14]
    state = state[:, 7:14]
    x_, w_, s_ = (t.detach().clone().requires_grad_(True) for t in (x, w, state))
    y, _ = short_conv(x_, w_, s_)
    d_y = torch.randn(2, 7, 40).transpose(1, 2)
    y.backward(d_y)
    xc, wc, sc = (t.detach().clone().double().requires_grad_(True) for t in (x, w, state))
    yc = _reference(xc, wc, sc, True)
    yc.backward(d_y.double())
    torch.testing.assert_close(y.double(), yc, rtol=1e-5, atol=1e-5)
    for a, b in ((x_, xc), (w_, wc), (s_, sc)):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-5, atol=1e-5)


@native
def test_second_derivatives_go_through_the_formula():
    x, w, state = (t.float().requires_grad_(True) for t in inputs(2, 9, 5, 3, 2))
    y, _ = short_conv(x, w, state)
    (gx,) = torch.autograd.grad((y**2).sum(), x, create_graph=True)
    (ggw,) = torch.autograd.grad(gx.sum(), w)
    x64, w64, s64 = (t.detach().double().requires_grad_(True) for t in (x, w, state))
    (gx64,) = torch.autograd.grad((_reference(x64, w64, s64, True) ** 2).sum(), x64,
                                  create_graph=True)  # fmt: skip
    (ggw64,) = torch.autograd.grad(gx64.sum(), w64)
    torch.testing.assert_close(ggw.double(), ggw64, rtol=1e-4, atol=1e-4)


def test_float64_and_empty_sequences_take_the_formula():
    x, w, state = inputs(2, 6, 3, 4, 3)
    y, _ = short_conv(x, w, state)
    torch.testing.assert_close(y, _reference(x, w, state, True), rtol=0, atol=0)
    y, new_state = short_conv(x[:, :0].float(), w.float(), state.float())
    assert y.shape == (2, 0, 3) and torch.equal(new_state, state.float())
    torch.autograd.gradcheck(
        lambda x, w, s: short_conv(x, w, s)[0],
        tuple(t.requires_grad_(True) for t in inputs(1, 5, 2, 3, 2)),
    )


@native
@pytest.mark.parametrize("with_state", [False, True])
def test_opcheck_the_registered_ops(with_state):
    x, w, state = (t.float() for t in inputs(2, 9, 5, 3, 4))
    state = state if with_state else None
    for bias in (None, torch.randn(5)):
        torch.library.opcheck(
            torch.ops.linattn_native.short_conv_forward.default, (x, w, bias, state, True)
        )
        d_y = torch.randn(2, 9, 5)
        torch.library.opcheck(
            torch.ops.linattn_native.short_conv_backward.default,
            (d_y, x, w, bias, state, False),
        )


@native
def test_the_kernels_bias_against_the_formula():
    x, w, state = (t.float() for t in inputs(2, 9, 5, 3, 4))
    bias = torch.randn(5)
    op = torch.ops.linattn_native
    y = op.short_conv_forward(x, w, bias, state, True)
    x64, w64, b64, s64 = (t.double().requires_grad_(True) for t in (x, w, bias, state))
    ref = torch.nn.functional.silu(_reference(x64, w64, s64, False) + b64)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
    d_y = torch.randn(2, 9, 5)
    dx, dw, db, ds = op.short_conv_backward(d_y, x, w, bias, state, True)
    ref.backward(d_y.double())
    for a, b in ((dx, x64), (dw, w64), (db, b64), (ds, s64)):
        torch.testing.assert_close(a.double(), b.grad, rtol=1e-5, atol=1e-5)


@native
@pytest.mark.parametrize(
    "args, message",
    [
        (lambda x, w, s: (x.double(), w, None, s, True), "x must be float32"),
        (lambda x, w, s: (x[0], w, None, s, True), r"x must be a \[B, T, C\] tensor"),
        (lambda x, w, s: (x.transpose(1, 2), w, None, s, True), "unit stride over C"),
        (lambda x, w, s: (x, w[:4], None, s, True), r"weight must be of shape \[C, W\]"),
        (lambda x, w, s: (x, w, torch.zeros(4), s, True), r"bias must be of shape \[C\]"),
        (lambda x, w, s: (x, w, None, s[..., :1], True), r"state must be of shape \[B, C, S\]"),
        (lambda x, w, s: (x, w, None, s.double(), True), "state must be float32"),
    ],
)
def test_bad_input_is_named(args, message):
    x, w, state = (t.float() for t in inputs(2, 9, 5, 3, 4))
    with pytest.raises(RuntimeError, match=message):
        torch.ops.linattn_native.short_conv_forward(*args(x, w, state))


def test_an_unknown_activation_is_refused():
    x, w, _ = inputs(1, 3, 2, 2, None)
    with pytest.raises(ValueError, match="activation must be"):
        short_conv(x, w, activation="gelu")
