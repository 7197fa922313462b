"""compat.chunk_ttt_linear / fused_chunk_ttt_linear vs fla 0.6.0: fla's naive
reference ``chunk_ttt_linear_ref`` (forward and autograd gradients), and its two Triton kernels
under triton's interpreter (forward, and the chunk kernel's backward), at T = 1, T not a multiple
of the mini-batch, packed sequences with a length-1 piece, and initial states."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tests.fla_interpreter")
ttt_module = pytest.importorskip("fla.ops.ttt")
naive_module = pytest.importorskip("fla.ops.ttt.naive")

from linattn import compat  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

NAMES = ("q", "k", "v", "w", "b", "eta")


def inputs(T=19, H=2, D=16, N=1, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(1, T, H, D), "k": F.normalize(randn(1, T, H, D), dim=-1),
        "v": randn(1, T, H, D), "w": 1 + 0.3 * randn(H, D), "b": 0.1 * randn(H, D),
        "eta": 0.1 * randn(1, T, H, 1).sigmoid(),
    }  # fmt: skip
    state = (0.1 * randn(N, H, D, D), 0.1 * randn(N, H, 1, D))
    return {n: t.to(dtype) for n, t in x.items()}, tuple(s.to(dtype) for s in state)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def assert_near(ours, theirs, tol):
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype
            assert rel(a, b) < tol, rel(a, b)


CASES = {
    "T1": dict(T=1, cu=None, state=False),
    "T19-state": dict(T=19, cu=None, state=True),
    "packed-state": dict(T=19, cu=[0, 1, 18, 19], state=True),
}


def _grads(result, leaves, weights):
    o, h, hb = result
    ((o * weights).sum() + h.square().sum() + hb.sum()).backward()
    return {n: t.grad for n, t in leaves.items()}


@pytest.mark.parametrize("name", ["chunk_ttt_linear", "fused_chunk_ttt_linear"])
def test_equals_flas_naive_reference_and_its_gradients(name):
    x, S0 = inputs(T=19)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    S0 = tuple(s.clone().requires_grad_(True) for s in S0)
    kw = dict(scale=0.3, chunk_size=8, initial_state=S0[0], initial_state_bias=S0[1],
              output_final_state=True)  # fmt: skip
    ours = getattr(compat, name)(*(leaves[n] for n in NAMES), **kw)
    ref_leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    ref_S0 = tuple(s.detach().clone().requires_grad_(True) for s in S0)
    kw.update(initial_state=ref_S0[0], initial_state_bias=ref_S0[1], mini_batch_size=8)
    del kw["chunk_size"]
    # fla's naive reference scales q in place: it gets a copy (q * 1) of the leaf
    theirs = naive_module.chunk_ttt_linear_ref(*(ref_leaves[n] * 1 for n in NAMES), **kw)
    assert_near(ours, theirs, 1e-6)
    weights = torch.randn(ours[0].shape, generator=torch.Generator().manual_seed(1))
    mine = _grads(ours, {**leaves, "h0": S0[0], "hb0": S0[1]}, weights)
    want = _grads(theirs, {**ref_leaves, "h0": ref_S0[0], "hb0": ref_S0[1]}, weights)
    for n in mine:
        assert rel(mine[n], want[n]) < 1e-5, n


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("name", ["chunk_ttt_linear", "fused_chunk_ttt_linear"])
def test_equals_flas_kernels(name, case):
    spec = CASES[case]
    cu = None if spec["cu"] is None else torch.tensor(spec["cu"])
    x, S0 = inputs(T=spec["T"], N=1 if cu is None else len(cu) - 1)
    kw = dict(scale=0.3, output_final_state=True, cu_seqlens=cu)
    if spec["state"]:
        kw.update(initial_state=S0[0], initial_state_bias=S0[1])
    with torch.no_grad():
        theirs = getattr(ttt_module, name)(*(x[n] for n in NAMES), **kw)
    ours = getattr(compat, name)(*(x[n] for n in NAMES), **kw)
    assert_near(ours, theirs, 2e-6)


def test_gradients_equal_flas_chunk_kernel():
    x, S0 = inputs(T=19)
    weights = torch.randn(1, 19, 2, 16, generator=torch.Generator().manual_seed(2))
    grads = []
    for fn in (ttt_module.chunk_ttt_linear, compat.chunk_ttt_linear):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        states = {n: s.clone().requires_grad_(True) for n, s in zip(("h0", "hb0"), S0, strict=True)}
        result = fn(*(leaves[n] for n in NAMES), scale=0.3, initial_state=states["h0"],
                    initial_state_bias=states["hb0"], output_final_state=True)  # fmt: skip
        grads.append(_grads(result, {**leaves, **states}, weights))
    for n in grads[0]:
        assert rel(grads[1][n], grads[0][n]) < 1e-5, n


def test_a_float_eta_and_no_state():
    x, _ = inputs(T=5)
    o, h, hb = compat.chunk_ttt_linear(*(x[n] for n in NAMES[:-1]), 0.05)
    assert h is None and hb is None
    o_ref, _, _ = naive_module.chunk_ttt_linear_ref(*(x[n].clone() for n in NAMES[:-1]), 0.05)
    assert rel(o, o_ref) < 1e-6


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(v=torch.zeros(1, 5, 2, 8)), "DK must equal to DV"),
        (dict(w=torch.zeros(2, 8)), "w must have shape"),
        (dict(eta=torch.zeros(1, 5, 2)), "eta must have"),
        (dict(scale=-1.0), "scale must be positive"),
        (dict(chunk_size=0), "mini_batch_size must be >= 1"),
        (dict(initial_state=torch.zeros(1, 2, 16, 8)), r"initial_state\[0\] \(W\) must have"),
    ],
)
def test_bad_input_is_refused_by_name(change, match):
    x, _ = inputs(T=5)
    with pytest.raises((ValueError, TypeError), match=match):
        compat.chunk_ttt_linear(**{**x, **change})
