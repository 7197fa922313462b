"""compat.chunk_cyfa / fused_recurrent_cyfa vs fla 0.6.0: fla's token loop
``naive_recurrent_cyfa`` (forward and autograd gradients), and its two Triton kernels under
triton's interpreter (forward, and the chunk kernel's backward; fla's recurrent kernel is
inference-only), at T = 1, T not a multiple of fla's chunk of 64, packed sequences
with a length-1 piece, and initial states.

fla's CyFA kernels refuse CPU tensors (``require_cuda``) and call ``libdevice.fast_cosf`` /
``fast_sinf``, which the interpreter lacks: the fixture lifts the first and binds the second to
``tl.cos`` / ``tl.sin`` (the interpreter's numpy cosine), for these tests only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
chunk_module = pytest.importorskip("fla.ops.cyfa.chunk")
recurrent_module = pytest.importorskip("fla.ops.cyfa.fused_recurrent")
utils_module = pytest.importorskip("fla.ops.cyfa.utils")
naive_module = pytest.importorskip("fla.ops.cyfa.naive")


from linattn import compat  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")

NAMES = ("q", "k", "v", "g", "delta", "beta", "readout", "q_norm_weight", "k_norm_weight")


def inputs(T=19, H=2, K=16, V=16, M=8, N=1, B=1, dtype=torch.float32, seed=0):
    """The layer's recipe: g = -exp(A) softplus(.), delta and beta sigmoids, readout near I."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, H, K), "k": randn(B, T, H, K), "v": randn(B, T, H, V),
        "g": -F.softplus(randn(B, T, H)) * 0.5, "delta": randn(B, T, H).sigmoid(),
        "beta": randn(B, T, H).sigmoid(),
        "readout": torch.eye(M - 1, dtype=torch.float64) + 0.3 * randn(H, M - 1, M - 1),
        "q_norm_weight": 0.5 + randn(K).abs(), "k_norm_weight": 0.5 + randn(K).abs(),
    }  # fmt: skip
    state = (randn(N, H, K, M), randn(N, H, M, V), 4 * randn(N, H).abs())
    return {n: t.to(dtype) for n, t in x.items()}, tuple(s.to(dtype) for s in state)


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def assert_near(ours, theirs, tol):
    o, S = ours
    o_ref, S_ref = theirs
    assert o.shape == o_ref.shape and o.dtype == o_ref.dtype
    assert rel(o, o_ref) < tol, rel(o, o_ref)
    assert (S is None) == (S_ref is None)
    for a, b in zip(S or (), S_ref or (), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert rel(a, b) < tol, rel(a, b)


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """fla's CyFA kernels under the interpreter: no CUDA requirement, and a cosine it has."""
    fla_interpreter.cyfa_on_cpu(monkeypatch)


CASES = {
    "T1": dict(T=1, cu=None, state=False),
    "T19-state": dict(T=19, cu=None, state=True),
    "packed-state": dict(T=12, cu=[0, 1, 7, 12], state=True),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("name", ["chunk_cyfa", "fused_recurrent_cyfa"])
def test_equals_flas_naive_loop_and_its_gradients(name, case):
    spec = CASES[case]
    cu = None if spec["cu"] is None else torch.tensor(spec["cu"])
    N = 1 if cu is None else len(cu) - 1
    x, S0 = inputs(T=spec["T"], N=N)
    S0 = S0 if spec["state"] else None
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    kw = dict(scale=0.3, initial_state=S0, output_final_state=True, cu_seqlens=cu)
    ours = getattr(compat, name)(*(leaves[n] for n in NAMES), 1e-5, 1e-5, **kw)
    ref_leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    theirs = naive_module.naive_recurrent_cyfa(*(ref_leaves[n] for n in NAMES), 1e-5, 1e-5, **kw)
    assert_near(ours, theirs, 2e-6)
    weights = torch.randn(ours[0].shape, generator=torch.Generator().manual_seed(1))
    for o, S in (ours, theirs):
        ((o * weights).sum() + S[0].square().sum() + S[1].sum()).backward()
    for n in NAMES:
        assert rel(leaves[n].grad, ref_leaves[n].grad) < 2e-5, n


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("name", ["chunk_cyfa", "fused_recurrent_cyfa"])
def test_equals_flas_kernels(name, case, kernels_on_cpu):
    spec = CASES[case]
    cu = None if spec["cu"] is None else torch.tensor(spec["cu"])
    N = 1 if cu is None else len(cu) - 1
    x, S0 = inputs(T=spec["T"], N=N)
    kw = dict(scale=0.3, initial_state=S0 if spec["state"] else None, output_final_state=True,
              cu_seqlens=cu)  # fmt: skip
    fla_fn = getattr(chunk_module if name == "chunk_cyfa" else recurrent_module, name)
    with torch.no_grad():
        theirs = fla_fn(*(x[n] for n in NAMES), 1e-5, 1e-5, **kw)
        ours = getattr(compat, name)(*(x[n] for n in NAMES), 1e-5, 1e-5, **kw)
    assert_near(ours, theirs, 5e-6)


def test_defaults_float64_and_no_final_state():
    x, _ = inputs(T=5, dtype=torch.float64)
    o, S = compat.chunk_cyfa(*(x[n] for n in NAMES), 1e-5, 1e-5)
    assert S is None and o.dtype == torch.float64
    o_ref, _ = naive_module.naive_recurrent_cyfa(*(x[n] for n in NAMES), 1e-5, 1e-5)
    assert rel(o, o_ref) < 1e-6  # fla's naive loop computes in float32


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(g=torch.zeros(1, 5, 3)), "g must have shape"),
        (dict(readout=torch.zeros(2, 6, 6)), "P \\+ 1 \\(the slots\\) even"),
        (dict(q_norm_weight=torch.ones(3)), "q_norm_weight must have shape"),
        (dict(beta=torch.zeros(1, 5, 2, dtype=torch.long)), "beta must be a floating-point"),
        (dict(initial_state=(torch.zeros(1, 2, 16, 8),)), "initial_state must contain"),
        (dict(checkpoint_level=2), "checkpoint_level"),
    ],
)
def test_bad_input_is_refused_by_name(change, match):
    x, _ = inputs(T=5)
    args = {**x, "q_norm_eps": 1e-5, "k_norm_eps": 1e-5, **change}
    with pytest.raises((ValueError, TypeError), match=match):
        compat.chunk_cyfa(**args)


def test_gradients_equal_flas_chunk_kernel(kernels_on_cpu):
    x, S0 = inputs(T=19)
    weights = torch.randn(1, 19, 2, 16, generator=torch.Generator().manual_seed(3))
    grads = []
    for fn in (chunk_module.chunk_cyfa, compat.chunk_cyfa):
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        o, S = fn(*(leaves[n] for n in NAMES), 1e-5, 1e-5, scale=0.3, initial_state=S0,
                  output_final_state=True)  # fmt: skip
        ((o * weights).sum() + S[0].square().sum() + S[1].sum()).backward()
        grads.append({n: t.grad for n, t in leaves.items()})
    for n in NAMES:
        assert rel(grads[1][n], grads[0][n]) < 2e-5, n
