"""The block algebra of the fast chunk form: per-channel decayed products and the inverse.

The per-channel products take direct blocks where the gates' spread fits the exponent budget and
halve where it does not (``_blockmath``'s docstring); every block size is checked against the
decay tensor built whole, forward and backward, in float64 and float32.
"""

import math

import pytest
import torch

from linattn.ops import _blockmath, delta_rule

from .cases import make_inputs


def _exact(a, b, G, strict):
    """sum_c a_ic b_jc exp(G_ic - G_jc) on j <= i (j < i if strict), from the [C, C, K] tensor."""
    decay = torch.exp((G.unsqueeze(-2) - G.unsqueeze(-3)).clamp(max=0))  # [..., C, C, K]
    full = torch.einsum("...ic,...jc,...ijc->...ij", a, b, decay)
    return torch.tril(full, -1 if strict else 0)


def _gates(shape, F, dtype, gen):
    """Cumulative per-channel gates G whose direct block size is exactly F (C for F = C).

    A block of F tokens with steps of about -s has a widest exponent of about F s / 2: steps of
    1.5 budget / F fit F (F s / 2 = 0.75 budget) but not 2 F (1.5 budget); F = 1 needs a step
    beyond the budget itself.
    """
    budget = _blockmath.factor_budget(dtype)
    step = 2.2 * budget if F == 1 else 1.5 * budget / F
    if F == shape[-2]:
        step = 0.5 * budget / F  # comfortably inside
    g = -step * (0.95 + 0.1 * torch.rand(*shape, generator=gen, dtype=torch.float64))
    return torch.cumsum(g, dim=-2).to(dtype)


@pytest.mark.parametrize("C", [1, 6, 16, 64])
def test_channel_products_equal_the_exact_decay_tensor(C):
    gen = torch.Generator().manual_seed(C)
    a, b = (torch.randn(3, C, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    G = torch.cumsum(-3 * torch.rand(3, C, 5, generator=gen, dtype=torch.float64), dim=-2)
    products = _blockmath.ChannelProducts([a, b], b, G, [False, True])
    torch.testing.assert_close(products.As[0], _exact(a, b, G, False), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(products.As[1], _exact(b, b, G, True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_direct_block_size_follows_the_spread(dtype):
    # Constant steps -s: a block of F tokens with reference row F / 2 spans F s / 2 above it.
    budget = _blockmath.factor_budget(dtype)
    assert budget == pytest.approx(math.log(torch.finfo(dtype).max) / 4)
    for s in (0.01, 1.0, 5.0, 30.0, 0.9 * budget, 1.1 * budget):
        G = torch.cumsum(torch.full((2, 64, 3), -s, dtype=dtype), dim=-2)
        expected = max([1] + [F for F in (2, 4, 8, 16, 32, 64) if F / 2 * s <= budget])
        assert _blockmath.direct_block_size(G) == expected, s


@pytest.mark.parametrize("F", [64, 32, 8, 4, 2, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_block_size_equals_the_exact_decay_tensor(F, dtype):
    gen = torch.Generator().manual_seed(F)
    a, b = (torch.randn(4, 64, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    G = _gates((4, 64, 8), F, dtype, gen)
    products = _blockmath.ChannelProducts([a.to(dtype), b.to(dtype)], b.to(dtype), G, [False, True])
    assert products.F == F
    G64 = G.double()
    exact = [_exact(a, b, G64, False), _exact(b, b, G64, True)]
    for A, ref in zip(products.As, exact, strict=True):
        assert A.dtype == dtype and torch.isfinite(A).all()
        if dtype == torch.float64:
            torch.testing.assert_close(A, ref, rtol=1e-12, atol=1e-12)
        else:  # rounding of float32 relative to the largest entry
            assert (A.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


class _Products(torch.autograd.Function):
    """A_qk, A_kk of ``ChannelProducts`` with its own backward (dG as the chunk terms form it)."""

    @staticmethod
    def forward(ctx, q, k, G):
        ctx.products = _blockmath.ChannelProducts([q, k], k, G, [False, True])
        ctx.save_for_backward(q, k)
        return tuple(ctx.products.As)

    @staticmethod
    def backward(ctx, dA_qk, dA_kk):
        q, k = ctx.saved_tensors
        (dq, dk_left), dk = ctx.products.backward([dA_qk, dA_kk])
        # A = sum_c a_ic b_jc exp(G_ic - G_jc): dG = sum_p a_p * da_p - b * db
        dG = q * dq + k * dk_left - k * dk
        return dq, dk + dk_left, dG


@pytest.mark.parametrize("F", [8, 4, 2, 1])
def test_every_block_size_gradcheck(F):
    gen = torch.Generator().manual_seed(10 + F)
    q, k = (torch.randn(2, 8, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    G = _gates((2, 8, 3), F, torch.float64, gen)
    assert _blockmath.direct_block_size(G) == F
    inputs = [t.requires_grad_() for t in (q, k, G)]
    # Steep gates: entries span many orders of magnitude, so the comparison is relative.
    assert torch.autograd.gradcheck(_Products.apply, inputs, eps=1e-6, atol=1e-9, rtol=1e-6)


def test_unit_lower_inverse():
    gen = torch.Generator().manual_seed(0)
    L = torch.tril(0.3 * torch.randn(4, 50, 50, generator=gen, dtype=torch.float64), -1)
    A = L + torch.eye(50, dtype=torch.float64)
    X = _blockmath.unit_lower_inverse(A)
    torch.testing.assert_close(X @ A, torch.eye(50, dtype=torch.float64).expand_as(A))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decays_below_the_normal_range_are_flushed_to_zero(dtype):
    floor = _blockmath.subnormal_floor(dtype)
    x = torch.tensor([0.0, -1.0, floor + 0.5, floor - 0.5, 3 * floor], dtype=dtype)
    expected = torch.exp(x)
    expected[3:] = 0.0  # subnormal (or zero) exponentials become exact zeros
    torch.testing.assert_close(_blockmath.decay_exp(x, floor), expected, rtol=0, atol=0)
    assert torch.equal(_blockmath.decay_exp(x), torch.exp(x))  # no floor: plain exp
    y = x.clone()
    assert torch.equal(_blockmath.decay_exp_(y, floor), expected) and torch.equal(y, expected)
    smallest = torch.finfo(dtype).tiny
    kept = _blockmath.decay_exp(x, floor)
    assert ((kept == 0) | (kept >= smallest)).all()  # nothing subnormal


@pytest.mark.parametrize("gate", ["scalar", "channel"])
def test_steep_gates_in_float32_match_float64(gate):
    # Log-decays down to about -400 per token: chunks decay far past the subnormal range, where
    # the float32 chunk form flushes decays to zero (float64 keeps them down to 1e-308).
    x = make_inputs(B=1, T=200, H=2, K=8, V=4, gate=gate, rule="delta")
    g = 100 * x["g"]
    ref, _ = delta_rule(x["q"], x["k"], x["v"], x["beta"], g, chunk_size=64)
    out, _ = delta_rule(*(x[n].float() for n in ("q", "k", "v", "beta")), g.float(), chunk_size=64)
    assert torch.isfinite(out).all()
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gate_floor_decays_to_exactly_zero(dtype):
    floor = _blockmath.gate_floor(dtype)
    assert torch.exp(torch.tensor(floor, dtype=dtype)) == 0  # flooring changes no decay
    assert torch.exp(torch.tensor(floor + 2, dtype=dtype)) > 0  # and is not far below it


@pytest.mark.parametrize("F", [64, 8, 1])
def test_float64_gates_keep_float32_products_exact(F):
    # Far from zero (G about -1e4, as after resets) a float32 G keeps about 3 digits of each
    # difference; a float64 G, its differences rounded once, keeps float32's accuracy.
    gen = torch.Generator().manual_seed(F)
    a, b = (torch.randn(4, 64, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    G = _gates((4, 64, 8), F, torch.float32, gen).double() - 1e4  # spread for float32's budget
    products = _blockmath.ChannelProducts([a.float(), b.float()], b.float(), G, [False, True])
    assert products.F == F
    for A, left, strict in zip(products.As, (a, b), (False, True), strict=True):
        ref = _exact(left, b, G, strict)
        assert A.dtype == torch.float32
        assert (A.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_unit_lower_inverse_of_strict_forward_and_backward():
    """The inverse of I + tril(N, -1) whatever N's diagonal and upper triangle hold, and its
    products backward equal to autograd through the inverse built whole (float64)."""
    gen = torch.Generator().manual_seed(3)
    N = torch.randn(2, 3, 6, 6, generator=gen, dtype=torch.float64) * 0.4
    dY = torch.randn(2, 3, 6, 6, generator=gen, dtype=torch.float64)
    a, b = N.clone().requires_grad_(), N.clone().requires_grad_()
    got = _blockmath.unit_lower_inverse_of_strict(a)
    want = torch.linalg.inv(torch.eye(6, dtype=torch.float64) + b.tril(-1))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    (got * dY).sum().backward()
    (want * dY).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-12)
    assert torch.count_nonzero(a.grad.triu()) == 0  # the implied entries get no gradient
    assert torch.autograd.gradcheck(_blockmath.unit_lower_inverse_of_strict, (N.requires_grad_(),))
