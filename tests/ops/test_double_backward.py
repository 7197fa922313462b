"""Second derivatives (``create_graph=True``) through every op form.

The chunk op's backward writes its first-order gradients into buffers (the group loop, and for
float32 on the CPU, C++); with grad mode on it recomputes them through plain autograd instead
(``chunk.differentiable_backward``). Checked here: ``gradgradcheck`` in float64 for every
mechanism of the mechanism table (docs/design.md) and every form, with an initial state, packed
sequences and the
normaliser, and float32 double backward (fused C++ forward and PyTorch loop) against float64.
"""

from __future__ import annotations

import pytest
import torch

from linattn.ops import chunk_affine_map, delta_rule, linear_attention, softmax_attention

from .cases import rel_rms

MECHANISMS = ["linear", "scalar_decay", "gla", "delta", "gated_delta", "kda"]
FORMS = ["parallel", "recurrent", "chunk"]
B, T, H, K, V = 1, 5, 1, 2, 2


def _inputs(mechanism: str, *, state: bool, dtype=torch.float64, seed: int = 0) -> dict:
    """Leaf tensors that require grad: q, k, v, and beta, g, S0 where the mechanism has them."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    x = {"q": rand(B, T, H, K) - 0.5, "k": rand(B, T, H, K) - 0.5, "v": rand(B, T, H, V) - 0.5}
    if mechanism in ("delta", "gated_delta", "kda"):
        x["beta"] = 0.2 + 1.5 * rand(B, T, H)  # inside (0, 2): numerical steps stay in range
    if mechanism in ("scalar_decay", "gated_delta"):
        x["g"] = -0.1 - rand(B, T, H)  # < 0: numerical steps stay <= 0
    if mechanism in ("gla", "kda"):
        x["g"] = -0.1 - rand(B, T, H, K)
    if state:
        x["S0"] = rand(B, H, K, V) - 0.5
    return {n: t.to(dtype).requires_grad_(True) for n, t in x.items()}


def _op(mechanism: str, names: list[str], mode: str, **options):
    """f(*tensors) -> (o, S) for the mechanism's op; tensors in the order of ``names``."""

    def f(*tensors):
        x = dict(zip(names, tensors, strict=True))
        common = dict(
            g=x.get("g"),
            mode=mode,
            chunk_size=2,
            initial_state=x.get("S0"),
            output_final_state=True,
            **options,
        )
        if "beta" in x:
            return delta_rule(x["q"], x["k"], x["v"], x["beta"], **common)
        return linear_attention(x["q"], x["k"], x["v"], **common)

    return f


@pytest.mark.parametrize("mode", FORMS)
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_gradgradcheck_every_mechanism_and_form(mechanism, mode):
    x = _inputs(mechanism, state=True)
    names = list(x)
    f = _op(mechanism, names, mode)
    assert torch.autograd.gradgradcheck(f, tuple(x.values()), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", FORMS)
@pytest.mark.parametrize("mechanism", ["linear", "kda"])
def test_gradgradcheck_packed_sequences(mechanism, mode):
    x = _inputs(mechanism, state=False)
    names = list(x)
    cu_seqlens = torch.tensor([0, 2, 5])
    f = _op(mechanism, names, mode, cu_seqlens=cu_seqlens)
    assert torch.autograd.gradgradcheck(f, tuple(x.values()), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", FORMS)
def test_gradgradcheck_normalized_linear_attention(mode):
    x = _inputs("scalar_decay", state=False)
    x["q"], x["k"] = (t.detach().add(0.6).requires_grad_(True) for t in (x["q"], x["k"]))
    names = list(x)
    f = _op("scalar_decay", names, mode, normalize=True)
    assert torch.autograd.gradgradcheck(f, tuple(x.values()), eps=1e-6, atol=1e-6)


def _second_derivatives(mechanism: str, mode: str, dtype) -> list[torch.Tensor]:
    """d/dx of <grad_x L, w> for L = <o, d_o> + <S, d_S>, every input x: a Hessian-vector
    product through create_graph=True, in ``dtype`` (same float64 values cast)."""
    x = _inputs(mechanism, state=True, dtype=dtype, seed=3)
    names = list(x)
    o, S = _op(mechanism, names, mode)(*x.values())
    gen = torch.Generator().manual_seed(4)
    d_o = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype)
    d_S = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad(
        (o * d_o).sum() + (S * d_S).sum(), list(x.values()), create_graph=True
    )
    w = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(dtype) for t in grads]
    total = sum((a * b).sum() for a, b in zip(grads, w, strict=True))
    return list(torch.autograd.grad(total, list(x.values())))


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_float32_chunk_double_backward_matches_float64(mechanism, native, monkeypatch):
    # Before the fix: zeros with a warning (fused C++) or an internal "out=..." error (loop).
    monkeypatch.setenv("LINATTN_NATIVE", native)
    ref = _second_derivatives(mechanism, "chunk", torch.float64)
    new = _second_derivatives(mechanism, "chunk", torch.float32)
    for a, b in zip(new, ref, strict=True):
        assert a.dtype == torch.float32
        assert rel_rms(a, b) < 1e-5
    assert all(bool(b.abs().max() > 0) for b in ref)  # a zero second derivative would not count


def test_first_order_gradients_with_create_graph_equal_the_plain_ones():
    x = _inputs("kda", state=True, dtype=torch.float32, seed=5)
    f = _op("kda", list(x), "chunk")
    o, S = f(*x.values())
    plain = torch.autograd.grad(o.sum() + S.sum(), list(x.values()), retain_graph=True)
    graphed = torch.autograd.grad(o.sum() + S.sum(), list(x.values()), create_graph=True)
    for a, b in zip(graphed, plain, strict=True):
        assert a.requires_grad
        assert rel_rms(a.detach(), b) < 1e-6


@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_gradgradcheck_chunk_affine_map(rule):
    x = _inputs("kda", state=False)
    names = ["k", "v", "g"] + (["beta"] if rule == "delta" else [])

    def f(*tensors):
        t = dict(zip(names, tensors, strict=True))
        return chunk_affine_map(t["k"], t["v"], t.get("beta"), t["g"])

    assert torch.autograd.gradgradcheck(f, tuple(x[n] for n in names), eps=1e-6, atol=1e-6)


def test_gradgradcheck_plain_softmax_attention():
    x = _inputs("linear", state=False)
    f = lambda *t: softmax_attention(*t, fused=False)  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (x["q"], x["k"], x["v"]), eps=1e-6, atol=1e-6)
