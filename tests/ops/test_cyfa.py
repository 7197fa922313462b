"""linattn.ops.cyfa: every form against the float64 loop of linattn.reference.cyfa,
packed sequences against the sequences one by one, a gradcheck, and refusals by name.
(tests/registry runs the forms against the oracle and their gradients against each other too.)"""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _native
from linattn.ops import cyfa as cyfa_op
from linattn.ops.cyfa import cyfa
from linattn.registry.cases import cyfa_case

NAMES = ("q", "k", "v", "g", "delta", "beta", "readout", "q_norm_weight", "k_norm_weight")
CASE = cyfa_case()


def _args(x):
    return [x[n] for n in NAMES]


def _state(x):
    return (x["S0_k"], x["S0_v"], x["S0_lambda"])


@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_forms_equal_the_reference_with_a_long_clock(mode):
    x = CASE.inputs(1, 11, 2, 4, 3, seed=7)
    x["S0_lambda"] = x["S0_lambda"] + 1234.5  # whole periods reduced before the cosine
    o_ref, S_ref = CASE.oracle(x, 0.5)
    o, S = CASE.call(x, mode, 4, 0.5)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-10)  # lambda ~ 1e3: its last bits


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_packed_sequences_equal_the_sequences_one_by_one(mode):
    x = CASE.inputs(1, 9, 2, 4, 3, seed=8)
    S0 = tuple(torch.cat([s] * 3) + i for i, s in enumerate(_state(x)))
    cu = torch.tensor([0, 1, 5, 9])
    o, S = cyfa(*_args(x), scale=0.4, mode=mode, chunk_size=2, initial_state=S0,
                output_final_state=True, cu_seqlens=cu)  # fmt: skip
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        piece = {k: (t[:, a:b] if t.dim() >= 3 and t.shape[1] == 9 and k not in ("readout",)
                     else t) for k, t in x.items()}  # fmt: skip
        o_n, S_n = cyfa(
            *_args(piece),
            scale=0.4,
            mode=mode,
            chunk_size=2,
            initial_state=tuple(s[n : n + 1] for s in S0),
            output_final_state=True,
        )
        torch.testing.assert_close(o[:, a:b], o_n, rtol=0, atol=1e-13)
        for s, s_n in zip(S, S_n, strict=True):
            torch.testing.assert_close(s[n : n + 1], s_n, rtol=0, atol=1e-13)


def test_gradcheck_of_the_chunk_form():
    x = CASE.inputs(1, 5, 1, 3, 2, seed=9)
    leaves = [t.clone().requires_grad_(True) for t in (*_args(x), *_state(x))]

    def f(*t):
        o, S = cyfa(*t[:9], scale=0.5, mode="chunk", chunk_size=2, initial_state=t[9:],
                    output_final_state=True)  # fmt: skip
        return o, *S

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize(
    ("name", "bad", "match"),
    [
        ("delta", torch.zeros(1, 4, 2), "delta must have shape"),
        ("readout", torch.zeros(2, 5, 5), "readout must have shape"),
        ("k_norm_weight", torch.zeros(3, 1), "k_norm_weight must have 1 dimensions"),
        ("g", torch.ones(1, 5, 1), "g must be <= 0"),
    ],
)
def test_bad_input_is_refused_by_name(name, bad, match):
    x = CASE.inputs(1, 5, 1, 3, 2, seed=1)
    x[name] = bad.double()
    with pytest.raises(ValueError, match=match):
        cyfa(*_args(x))


def test_a_bad_initial_state_is_refused_by_name():
    x = CASE.inputs(1, 5, 1, 3, 2, seed=1)
    S0 = (x["S0_k"], x["S0_v"], x["S0_lambda"][:, :, None])
    with pytest.raises(ValueError, match=r"initial_state\[2\] \(the clock lambda\)"):
        cyfa(*_args(x), initial_state=S0)


# --- the write and the readout in C++ (csrc/cyfa.cpp) against their PyTorch formulas ---------

native = pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")


def _run(x, mode, chunk_size, cu_seqlens=None, S0=None):
    """o, the state and every input's gradient of a weighted sum of all outputs (float64)."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items() if n in NAMES}
    S0 = _state(x) if S0 is None else S0
    S0 = tuple(s.detach().clone().requires_grad_(True) for s in S0)
    o, S = cyfa(*(leaves[n] for n in NAMES), scale=0.5, mode=mode, chunk_size=chunk_size,
                initial_state=S0, output_final_state=True, cu_seqlens=cu_seqlens)  # fmt: skip
    gen = torch.Generator().manual_seed(3)
    weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (o, *S)]
    loss = sum((w * t.double()).sum() for w, t in zip(weights, (o, *S), strict=True))
    grads = torch.autograd.grad(loss, [*leaves.values(), *S0])
    return o, S, grads


STEEP = "steep"


@native
@pytest.mark.parametrize(
    ("T", "chunk_size", "lengths", "gate"),
    [
        (1, 4, None, "drawn"),  # T = 1
        (11, 4, None, "drawn"),  # T not a multiple of the chunk
        (9, 64, None, STEEP),  # steep gates (log-decays down to -30)
        (9, 3, [1, 4, 1, 3], "drawn"),  # packed, with length-1 pieces
        (7, 2, [1, 1, 5], STEEP),
    ],
)
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("slots", [4, 6, 8])
def test_the_kernels_equal_the_pytorch_formulas_in_float64(
    T, chunk_size, lengths, gate, mode, slots, monkeypatch
):
    case = cyfa_case(slots)
    x = case.inputs(1, T, 3, 5, 4, seed=T + slots)
    x["S0_lambda"] = x["S0_lambda"] + 1234.5  # a long clock
    x["delta"] = 2.7 * x["delta"]  # a few whole turns per token too
    if gate == STEEP:
        x["g"] = -30 * torch.rand(x["g"].shape, generator=torch.Generator().manual_seed(1),
                                  dtype=torch.float64)  # fmt: skip
    cu, S0 = None, None
    if lengths is not None:
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        S0 = tuple(torch.cat([s] * len(lengths)) + 0.1 * i for i, s in enumerate(_state(x)))
    kernels = _run(x, mode, chunk_size, cu, S0)
    monkeypatch.setattr(cyfa_op, "_token_kernels", lambda x: False)
    formulas = _run(x, mode, chunk_size, cu, S0)
    torch.testing.assert_close(kernels[0], formulas[0], rtol=0, atol=1e-12)
    for a, b in zip(kernels[1], formulas[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)  # lambda ~ 1e3: its last bits
    for a, b in zip(kernels[2], formulas[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def _errors(run, reference):
    """The largest errors of o, of the states and of the gradients (relative to 1 + |x|)."""
    o = (run[0].double() - reference[0]).abs().max().item()
    S = max((a.double() - b).abs().max().item() for a, b in zip(run[1], reference[1], strict=True))
    grads = max(
        ((a.double() - b).abs() / (1 + b.abs())).max().item()
        for a, b in zip(run[2], reference[2], strict=True)
    )
    return o, S, grads


@native
@pytest.mark.parametrize("T", [1, 70, 133])
def test_the_kernels_in_float32_are_close_to_float64(T, monkeypatch):
    """The float32 path (polynomial exp and sincos in the kernels) against float64: o, the
    states and every gradient. With a long clock, lambda itself is rounded in float32 (its ulp
    at 1234 is 1e-4), so there the kernels are held to the float32 PyTorch formulas' own error."""
    x = CASE.inputs(1, T, 2, 8, 8, seed=T)
    x32 = {n: t.float() for n, t in x.items()}
    o32, S32, g32 = kernels = _run(x32, "chunk", 64)
    assert o32.dtype == torch.float32 and all(s.dtype == torch.float32 for s in S32)
    o, S, grads = _errors(kernels, _run(x, "chunk", 64))
    assert o < 2e-5 and S < 2e-5 and grads < 1e-4
    x["S0_lambda"] = x["S0_lambda"] + 1234.5
    x32 = {n: t.float() for n, t in x.items()}
    reference = _run(x, "chunk", 64)
    kernel_errors = _errors(_run(x32, "chunk", 64), reference)
    monkeypatch.setattr(cyfa_op, "_token_kernels", lambda x: False)
    formula_errors = _errors(_run(x32, "chunk", 64), reference)
    for mine, theirs in zip(kernel_errors, formula_errors, strict=True):
        assert mine <= 1.25 * theirs + 1e-6


def _op_args(dtype, B=2, T=5, H=3, M=6, W=16):
    gen = torch.Generator().manual_seed(0)

    def rand(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)

    lam, beta, r = 40 * rand(B, T, H), rand(B, T, H), rand(B, T, H).abs()
    z, table = rand(B, H, T, W), rand(H, M - 1, M)
    return lam, beta, r, z, table, rand(B, H, T, M), rand(B, H, T, W)


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_the_registered_ops(dtype):
    lam, beta, r, z, table, dkeys, dvalues = _op_args(dtype)
    ops = torch.ops.linattn_native
    torch.library.opcheck(ops.cyfa_write.default, (lam, beta, r, 6, 16))
    torch.library.opcheck(ops.cyfa_write_backward.default, (lam, beta, r, dkeys, dvalues))
    torch.library.opcheck(ops.cyfa_readout.default, (z, r, lam, table))
    torch.library.opcheck(ops.cyfa_readout_backward.default, (z, r, lam, table, dkeys))
    # strided gradients (a transposed view, as the chunk backward may hand them) read in place
    strided = dkeys.transpose(1, 2).contiguous().transpose(1, 2)
    torch.library.opcheck(ops.cyfa_readout_backward.default, (z, r, lam, table, strided))
    x = z.transpose(1, 2)  # [B, T, H, K], strided rows
    w = z[0, 0, 0]
    y, rx = ops.cyfa_norm(x, w, 1e-5)
    torch.library.opcheck(ops.cyfa_norm.default, (x, w, 1e-5))
    for dy, dr in ((x.flip(1), rx), (None, rx), (x, None)):
        torch.library.opcheck(ops.cyfa_norm_backward.default, (x, w, rx, dy, dr))


@native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_norm_kernels_equal_the_formula(dtype):
    """y = x w, r = (mean x^2 + eps)^-1/2 and their gradients, against autograd of the formula."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 3, 10, generator=gen, dtype=torch.float64)
    w = torch.rand(10, generator=gen, dtype=torch.float64) + 0.5
    dy, dr = torch.randn(x.shape, generator=gen, dtype=x.dtype), torch.randn(2, 7, 3, dtype=x.dtype)
    x64, w64 = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y64, r64 = x64 * w64, (x64.square().mean(-1) + 1e-5).rsqrt()
    dx64, dw64 = torch.autograd.grad((y64 * dy).sum() + (r64 * dr).sum(), (x64, w64))
    ops = torch.ops.linattn_native
    y, r = ops.cyfa_norm(x.to(dtype), w.to(dtype), 1e-5)
    dx, dw = ops.cyfa_norm_backward(x.to(dtype), w.to(dtype), r, dy.to(dtype), dr.to(dtype))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for mine, theirs in ((y, y64), (r, r64), (dx, dx64), (dw, dw64)):
        assert mine.dtype == dtype
        torch.testing.assert_close(mine.double(), theirs, rtol=tol, atol=tol)


@native
def test_the_ops_refuse_bad_input_by_name():
    lam, beta, r, z, table, dkeys, _ = _op_args(torch.float32)
    ops = torch.ops.linattn_native
    with pytest.raises(RuntimeError, match="beta must be"):
        ops.cyfa_write(lam, beta[:, :1], r, 6, 16)
    with pytest.raises(RuntimeError, match="the slots M must be even"):
        ops.cyfa_write(lam, beta, r, 5, 16)
    with pytest.raises(RuntimeError, match="table must be"):
        ops.cyfa_readout(z, r, lam, table[:, :2])
    with pytest.raises(RuntimeError, match="lam must be float32 or float64"):
        ops.cyfa_readout(z, r, lam.half(), table)
    with pytest.raises(RuntimeError, match="du must have 6 columns"):
        ops.cyfa_readout_backward(z, r, lam, table, z)


@native
@pytest.mark.parametrize("weight", [0.0, 1e-13])
def test_query_weights_near_zero_are_not_folded_into_the_keys(weight, monkeypatch):
    """A query-norm weight of 0 (or below ``FOLD_MIN_WEIGHT``) cannot be divided out of the key
    memory's state: the kernels then scale q itself, with the same outputs and gradients."""
    x = CASE.inputs(1, 9, 2, 5, 4, seed=11)
    x["q_norm_weight"][1] = weight
    assert not cyfa_op._foldable(x["q_norm_weight"])
    kernels = _run(x, "chunk", 4)
    monkeypatch.setattr(cyfa_op, "_token_kernels", lambda x: False)
    formulas = _run(x, "chunk", 4)
    for a, b in zip((kernels[0], *kernels[1], *kernels[2]),
                    (formulas[0], *formulas[1], *formulas[2]), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@native
def test_the_kernels_equal_the_formulas_over_a_batch_and_several_tiles(monkeypatch):
    """B = 2 sequences of 150 tokens (the kernels' tiles of 64 tokens: two whole, one partial)."""
    x = CASE.inputs(2, 150, 3, 6, 5, seed=12)
    kernels = _run(x, "chunk", 32)
    monkeypatch.setattr(cyfa_op, "_token_kernels", lambda x: False)
    formulas = _run(x, "chunk", 32)
    for a, b in zip((kernels[0], *kernels[1], *kernels[2]),
                    (formulas[0], *formulas[1], *formulas[2]), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@native
def test_the_kernels_sums_over_threads_equal_one_threads():
    """dtable and the norm's dw are summed per thread, then over the threads: two threads give
    one thread's sums (float64, to rounding)."""
    lam, beta, r, z, table, dkeys, _ = _op_args(torch.float64, B=2, T=300, H=3)
    x, w = z.transpose(1, 2), z[0, 0, 0]
    ops = torch.ops.linattn_native
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            _, rx = ops.cyfa_norm(x, w, 1e-5)
            results.append(
                (
                    *ops.cyfa_readout_backward(z, r, lam, table, dkeys),
                    *ops.cyfa_norm_backward(x, w, rx, x.flip(1), rx),
                )  # fmt: skip
            )
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
