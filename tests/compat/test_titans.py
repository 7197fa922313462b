"""compat.chunk_titans_linear vs fla 0.6.0. fla's Titans is PyTorch only
(``fla.ops.titans.naive``, no Triton kernel): its chunk form (the exported name, forward and
autograd gradients), its token loop, and its padded reference for T not a multiple of the chunk
(outputs; its final state then comes from its padding tokens), with T = 1 and initial states.
fla has no packed sequences for Titans."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

titans_module = pytest.importorskip("fla.ops.titans")
naive_module = pytest.importorskip("fla.ops.titans.naive")

from linattn import compat  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

NAMES = ("q", "k", "v", "w", "b", "theta", "alpha", "eta")
HEAD_FIRST = ("q", "k", "v", "theta", "alpha", "eta")


def inputs(T=16, H=2, D=8, dtype=torch.float32, seed=0):
    """Head-first [B, H, T, D], rates [B, H, T, 1] (theta, alpha small; eta in (0.05, 0.95))."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(1, H, T, D), "k": F.normalize(randn(1, H, T, D), dim=-1),
        "v": randn(1, H, T, D), "w": 1 + 0.3 * randn(H, D), "b": 0.1 * randn(H, D),
        "theta": 0.05 * randn(1, H, T, 1).sigmoid(), "alpha": 0.2 * randn(1, H, T, 1).sigmoid(),
        "eta": 0.05 + 0.9 * randn(1, H, T, 1).sigmoid(),
    }  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}, (0.3 * randn(1, H, D, D)).to(dtype)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def test_equals_flas_chunk_form_and_its_gradients():
    x, M0 = inputs(T=16)
    results, grads = [], []
    weights = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(1))
    for fn in (titans_module.chunk_titans_linear, compat.chunk_titans_linear):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        leaves["M0"] = M0.clone().requires_grad_(True)
        o, M = fn(*(leaves[n] for n in NAMES), 1e-6, 4, leaves["M0"], True)
        ((o * weights).sum() + M.square().sum()).backward()
        results.append((o, M))
        grads.append({n: t.grad for n, t in leaves.items()})
    (o, M), (o_ref, M_ref) = results[1], results[0]
    assert o.shape == o_ref.shape and o.dtype == o_ref.dtype and M.dtype == M_ref.dtype
    assert rel(o, o_ref) < 1e-6 and rel(M, M_ref) < 1e-6
    for n in grads[0]:
        assert rel(grads[1][n], grads[0][n]) < 1e-5, n


def _ref(x, M0, T, use_chunk):
    """fla's padded reference (layout [B, T, H, D])."""
    moved = {n: (x[n][:, :, :T].transpose(1, 2) if n in HEAD_FIRST else x[n]) for n in NAMES}
    o, M = naive_module.chunk_titans_linear_ref(
        *(moved[n] for n in NAMES), 1e-6, 4, None if M0 is None else M0.clone(), True,
        use_chunk=use_chunk,
    )  # fmt: skip
    return o.transpose(1, 2), M


@pytest.mark.parametrize("T", [1, 11, 16])
@pytest.mark.parametrize("state", [False, True])
def test_equals_flas_token_loop_and_padded_reference(T, state):
    x, M0 = inputs(T=16)
    M0 = M0 if state else None
    o, M = compat.chunk_titans_linear(
        *(x[n][:, :, :T] if n in HEAD_FIRST else x[n] for n in NAMES), 1e-6, 4, M0, True
    )
    for use_chunk in (False, True):
        o_ref, M_ref = _ref(x, M0, T, use_chunk)
        assert rel(o, o_ref) < 1e-6, use_chunk
        if T % 4 == 0:  # no padding: the same final memory
            assert rel(M, M_ref) < 1e-6, use_chunk


def test_no_final_state_and_float64():
    x, M0 = inputs(T=8, dtype=torch.float64)
    o, M = compat.chunk_titans_linear(*(x[n] for n in NAMES), 1e-6, 4, M0, False)
    assert M is None and o.dtype == torch.float64
    o_ref, _ = titans_module.chunk_titans_linear(*(x[n] for n in NAMES), 1e-6, 4, M0, False)
    assert rel(o, o_ref) < 1e-6  # fla computes its chunk's coefficients in float32


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(v=torch.zeros(1, 2, 16, 4)), "v must have the keys' width"),
        (dict(eta=torch.zeros(1, 2, 16)), "eta must have shape \\[B, H, T, 1\\]"),
        (dict(b=torch.zeros(2, 4)), "b must have shape"),
        (dict(initial_state=torch.zeros(2, 8, 8)), "initial_state must have shape"),
        (dict(chunk_size=0), "chunk_size must be >= 1"),
    ],
)
def test_bad_input_is_refused_by_name(change, match):
    x, _ = inputs(T=16)
    args = {**x, "eps": 1e-6, "chunk_size": 4, "initial_state": None, "output_final_state": True}
    with pytest.raises((ValueError, TypeError), match=match):
        compat.chunk_titans_linear(**{**args, **change})
