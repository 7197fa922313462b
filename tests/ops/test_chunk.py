"""The chunk engine's internals: segment sums, safe exponents, the UT transform."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _blockmath, _gates, delta_rule, linear_attention
from linattn.ops.chunk import ut_transform

from .cases import make_inputs


def test_segment_sums():
    g = torch.tensor([-1.0, -2.0, -4.0], dtype=torch.float64)
    inf = float("-inf")
    expected = torch.tensor([[0, inf, inf], [-2, 0, inf], [-6, -4, 0]], dtype=torch.float64)
    assert torch.equal(_gates.segment_sums(g), expected)


def _largest_exponents(run):
    """Run ``run()`` and return the largest argument of every exponential it evaluated."""
    seen = []

    def recording(real):
        def exp(t, *args, **kwargs):
            seen.append(t.detach().max().item())
            return real(t, *args, **kwargs)

        return exp

    with pytest.MonkeyPatch.context() as patch:  # undone on exit; the caller's patches stay
        patch.setattr(torch, "exp", recording(torch.exp))
        patch.setattr(torch.Tensor, "exp", recording(torch.Tensor.exp))
        patch.setattr(torch.Tensor, "exp_", recording(torch.Tensor.exp_))
        out = run()
    assert seen
    return seen, out


def _run(op, x, g):
    if op == "delta":
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], g, chunk_size=64)[0]
    return linear_attention(x["q"], x["k"], x["v"], g, chunk_size=64)[0]


@pytest.mark.parametrize("op", ["linear", "delta"])
@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_no_exponent_exceeds_the_budget(op, gate, dtype, pytorch_loop):
    # Gates from gentle to steep (log-decays down to about -100 per token): the only positive
    # exponents are the direct blocks' factors, within the budget (``_blockmath``). The PyTorch
    # loop (the fused forward's exponentials are in C++; ``test_native`` checks its steep gates).
    x = make_inputs(T=150, gate=gate, rule="delta" if op == "delta" else "additive", dtype=dtype)
    for g in (x["g"], 40 * x["g"]):
        seen, o = _largest_exponents(lambda g=g: _run(op, x, g))
        assert max(seen) <= _blockmath.factor_budget(dtype)
        assert torch.isfinite(o).all()


@pytest.mark.parametrize("op", ["linear", "delta"])
@pytest.mark.parametrize("gate", ["scalar", "channel"])
def test_every_exponent_is_non_positive_beyond_the_budget(op, gate):
    # Every log-decay below -2 budget: no two tokens fit a direct block, so the per-channel
    # products halve down to single tokens and every exponent evaluated is <= 0 (DESIGN.md).
    x = make_inputs(T=150, gate=gate, rule="delta" if op == "delta" else "additive")
    g = x["g"] - 2.2 * _blockmath.factor_budget(torch.float64)
    seen, o = _largest_exponents(lambda: _run(op, x, g))
    assert max(seen) <= 0.0
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("mode", ["chunk", "parallel"])
def test_strong_decay_gradients_are_finite(gate, mode):
    # exp(G_i) exp(-G_j) would overflow here (|G| up to ~3000); the masked segment sums do not.
    x = make_inputs(B=1, H=1, T=100, gate=gate, rule="delta", dtype=torch.float32)
    g = (x["g"] * 0 - 30.0).requires_grad_()
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    o, _ = delta_rule(q, k, v, x["beta"], g, mode=mode, chunk_size=100)
    o.square().sum().backward()
    for t in (q, k, v, g):
        assert torch.isfinite(t.grad).all()


def test_ut_transform_is_the_inverse_formula():
    # Section 8: T = (I + L)^{-1} diag(beta), W = T K and U0 = T V without decay.
    x = make_inputs(B=1, H=1, T=9, rule="delta")
    k, v, beta = x["k"][0, :, 0], x["v"][0, :, 0], x["beta"][0, :, 0]
    L = torch.tril(beta[:, None] * (k @ k.T), -1)
    T = torch.linalg.inv(torch.eye(9, dtype=k.dtype) + L) @ torch.diag(beta)
    W, U0 = ut_transform(k, v, beta, None, None)
    torch.testing.assert_close(W, T @ k, rtol=0, atol=1e-12)
    torch.testing.assert_close(U0, T @ v, rtol=0, atol=1e-12)


@pytest.mark.parametrize("C", [17, 37, 64])
def test_sub_blocks_equal_the_exact_decay_tensor(C):
    # The boundary trick between sub-blocks against exp(G_i - G_j) built whole, strong decay too.
    gen = torch.Generator().manual_seed(C)
    a, b = torch.randn(2, 3, C, 5, generator=gen, dtype=torch.float64)
    g = -3.0 * torch.rand(3, C, 5, generator=gen, dtype=torch.float64)
    exact = torch.tril(_gates._channel_products(a, b, g))
    torch.testing.assert_close(_gates.decayed_products(a, b, g), exact, rtol=1e-12, atol=1e-14)
    strict = _gates.decayed_products(a, b, g, strict=True)
    torch.testing.assert_close(strict, torch.tril(exact, -1), rtol=1e-12, atol=1e-14)


def test_sub_block_gradcheck():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 19, 2, generator=gen, dtype=torch.float64)
    g = -torch.rand(19, 2, generator=gen, dtype=torch.float64) - 0.01
    inputs = [t.clone().requires_grad_() for t in (a, b, g)]
    assert torch.autograd.gradcheck(_gates.decayed_products, inputs)
