"""The chunk engine's internals: decay masks, safe exponents, the UT transform's terms."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _blockmath, _chunk_terms, delta_rule, linear_attention
from linattn.ops.chunk import chunk_terms
from linattn.ops.mechanism import Mechanism

from .cases import make_inputs


@pytest.mark.parametrize("buffered", [True, False])
def test_scalar_decay(buffered):
    # exp(G_i - G_j) on and below the diagonal, exactly 0 above it; G = cumsum([-1, -2, -4]).
    G = torch.tensor([[-1.0], [-3.0], [-7.0]], dtype=torch.float64)
    e = torch.exp(torch.tensor([-2.0, -6.0, -4.0], dtype=torch.float64)).tolist()
    expected = torch.tensor([[1, 0, 0], [e[0], 1, 0], [e[1], e[2], 1]], dtype=torch.float64)
    out = torch.full((3, 3), float("nan"), dtype=torch.float64) if buffered else None
    decay = _blockmath.scalar_decay(G, out=out, dtype=torch.float64)
    assert torch.equal(decay, expected)


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
    # products halve down to single tokens and every exponent evaluated is <= 0 (docs/design.md,
    # "Gates").
    x = make_inputs(T=150, gate=gate, rule="delta" if op == "delta" else "additive")
    g = x["g"] - 2.2 * _blockmath.factor_budget(torch.float64)
    seen, o = _largest_exponents(lambda: _run(op, x, g))
    assert max(seen) <= 0.0
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("mode", ["chunk", "parallel"])
def test_strong_decay_gradients_are_finite(gate, mode):
    # exp(G_i) exp(-G_j) would overflow here (|G| up to ~3000); differences inside a chunk do not.
    x = make_inputs(B=1, H=1, T=100, gate=gate, rule="delta", dtype=torch.float32)
    g = (x["g"] * 0 - 30.0).requires_grad_()
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    o, _ = delta_rule(q, k, v, x["beta"], g, mode=mode, chunk_size=100)
    o.square().sum().backward()
    for t in (q, k, v, g):
        assert torch.isfinite(t.grad).all()


def test_ut_transform_terms_are_the_inverse_formula():
    # Section 8: I + L with L_ti = beta_t k_t^T k_i (i < t), T = (I + L)^{-1} diag(beta),
    # W = T K and U0 = T V without decay: one chunk of 9 tokens of one head.
    x = make_inputs(B=1, H=1, T=9, rule="delta")
    k, v, beta = x["k"][0, :, 0], x["v"][0, :, 0], x["beta"][0, :, 0]
    L = torch.tril(beta[:, None] * (k @ k.T), -1)
    T = torch.linalg.inv(torch.eye(9, dtype=k.dtype) + L) @ torch.diag(beta)
    internal = [t.transpose(1, 2) for t in (x["k"], x["v"], x["beta"])]  # [B, H, T, ...]
    terms = chunk_terms(None, *internal, None, 9, Mechanism("delta", "none"))
    assert terms.A_qk is None  # no output terms without q
    torch.testing.assert_close(terms.I_plus_L[0, 0], torch.eye(9, dtype=k.dtype) + L, rtol=0,
                               atol=1e-14)  # fmt: skip
    torch.testing.assert_close(terms.W[0, 0], T @ k, rtol=0, atol=1e-12)
    torch.testing.assert_close(terms.U0[0, 0], T @ v, rtol=0, atol=1e-12)


def _exact(a, b, G, strict=False):
    """sum_c a_ic b_jc exp(G_ic - G_jc) on j <= i (j < i if strict), from the [C, C, K] tensor."""
    decay = torch.exp((G.unsqueeze(-2) - G.unsqueeze(-3)).clamp(max=0))  # [..., C, C, K]
    return torch.tril(torch.einsum("...ic,...jc,...ijc->...ij", a, b, decay), -1 if strict else 0)


@pytest.mark.parametrize("steep", [False, True])
@pytest.mark.parametrize("C", [17, 37, 64])
def test_differentiable_products_equal_the_exact_decay_tensor(C, steep):
    # The terms autograd records (the all-blocks form) against exp(G_i - G_j) built whole, for
    # chunks that are not powers of two; steep: beyond the direct blocks' budget (halving).
    gen = torch.Generator().manual_seed(C)
    a, b = torch.randn(2, 3, C, 5, generator=gen, dtype=torch.float64)
    g = -3.0 * torch.rand(3, C, 5, generator=gen, dtype=torch.float64) * (200 if steep else 1)
    G = torch.cumsum(g, dim=-2)
    for buffers in (_blockmath.differentiable, _blockmath.fresh):
        products = _chunk_terms.Products([a, b], b, G, [False, True], "channel", buffers)
        torch.testing.assert_close(products.As[0], _exact(a, b, G), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(products.As[1], _exact(b, b, G, True), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("gate", ["head", "channel", "steep"])
def test_differentiable_products_gradcheck(gate):
    # First and second derivatives through the recorded products (double backward runs them).
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 19, 2, generator=gen, dtype=torch.float64)
    g = -torch.rand(19, 1 if gate == "head" else 2, generator=gen, dtype=torch.float64) - 0.01
    g = g * (300 if gate == "steep" else 1)
    inputs = [t.clone().requires_grad_() for t in (a, b, g)]

    def products(a, b, g):
        G = torch.cumsum(g, dim=-2)
        kind = "head" if gate == "head" else "channel"
        found = _chunk_terms.Products([a, b], b, G, [False, True], kind, _blockmath.differentiable)
        return tuple(found.As)

    assert torch.autograd.gradcheck(products, inputs)
    assert torch.autograd.gradgradcheck(products, inputs)
