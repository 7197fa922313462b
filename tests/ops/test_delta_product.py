"""Gated DeltaProduct: every form equals a float64 token loop of its definition (the
property suite's regions: forms x gates, hypothesis drawing the rest), n_h = 1 is the delta rule,
n_h writes are the delta rule on the interleaved rows read at each token's last write, the
generation step and chunk_affine_map, gradcheck and gradgradcheck, and the checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from linattn.ops import chunk_affine_map, delta_product_step, delta_rule, gated_delta_product
from linattn.reference.gated import delta_product as reference_delta_product

from .float64_recurrence import token_step
from .test_properties import ABSOLUTE, TOLERANCE, holds, loop, regions

GATE_KINDS = (None, "head", "channel")


def inputs(B=2, T=7, H=2, HV=4, K=5, V=3, n=3, gate="head", seed=0, dtype=torch.float64):
    """Random inputs in fla's layout: k, v, beta with T n rows; keys of unit length."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    g = None
    if gate is not None:
        g = F.logsigmoid(randn(B, T, HV, *((K,) if gate == "channel" else ())) + 1)
    x = {
        "q": randn(B, T, H, K),
        "k": F.normalize(randn(B, T * n, H, K), dim=-1),
        "v": randn(B, T * n, HV, V),
        "beta": 2 * torch.rand(B, T * n, HV, generator=gen, dtype=torch.float64),
        "g": g,
        "S0": randn(B, HV, K, V),
    }
    return {name: None if t is None else t.to(dtype) for name, t in x.items()}


def token_loop(q, k, v, beta, g, S0, n, scale):
    """The definition, token by token in float64: the decay once, n writes, one read."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    q, k = (x.repeat_interleave(HV // H, dim=2) for x in (q, k))  # value head j reads j // G
    S = q.new_zeros(B, HV, K, v.shape[-1]) if S0 is None else S0
    outs = []
    for t in range(T):
        for j in range(n):
            r = t * n + j
            gate = g[:, t] if (g is not None and j == 0) else None
            o_t, S = token_step(S, scale * q[:, t], k[:, r], v[:, r], beta[:, r], gate)
        outs.append(o_t)
    return torch.stack(outs, dim=1), S


def packed_loop(x, n, scale, bounds):
    """The token loop of each packed sequence from its own initial state."""
    outs, states = [], []
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        g = None if x["g"] is None else x["g"][:, s:e]
        S0 = None if x["S0"] is None else x["S0"][i : i + 1]
        rows = slice(s * n, e * n)
        o, S = token_loop(x["q"][:, s:e], x["k"][:, rows], x["v"][:, rows], x["beta"][:, rows],
                          g, S0, n, scale)  # fmt: skip
        outs.append(o)
        states.append(S)
    return torch.cat(outs, dim=1), torch.cat(states)


def rel_rms(got, want):
    err = (got.double() - want).pow(2).mean().sqrt()
    return float(err / want.pow(2).mean().sqrt().clamp_min(1e-30))


@st.composite
def problems(draw):
    n = draw(st.integers(1, 4))
    H = draw(st.integers(1, 2))
    lengths = draw(st.one_of(st.none(), st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    T = draw(st.integers(1, 9)) if lengths is None else sum(lengths)
    return {
        "n": n, "B": 1 if lengths is not None else draw(st.integers(1, 2)), "T": T, "H": H,
        "HV": H * draw(st.sampled_from([1, 2])), "K": draw(st.integers(1, 6)),
        "V": draw(st.integers(1, 4)), "lengths": lengths, "state": draw(st.booleans()),
        "chunk": draw(st.integers(1, 3 * T * n + 2)), "l2norm": draw(st.booleans()),
        "dtype": draw(st.sampled_from([torch.float64, torch.float32])),
        "seed": draw(st.integers(0, 2**16)),
    }  # fmt: skip


@pytest.mark.parametrize(
    "form,gate,profile",
    regions(
        "delta_product", ("parallel", "recurrent", "chunk", "chunk_torch"), GATE_KINDS
    ),  # fmt: skip
)
def test_every_form_equals_the_float64_token_loop(form, gate, profile):
    def check(p):
        x = inputs(p["B"], p["T"], p["H"], p["HV"], p["K"], p["V"], p["n"], gate, p["seed"])
        if not p["state"]:
            x["S0"] = None
        elif p["lengths"] is not None:
            x["S0"] = x["S0"][:1].expand(len(p["lengths"]), -1, -1, -1).clone()
        bounds = [0, p["T"]] if p["lengths"] is None else np.cumsum([0, *p["lengths"]]).tolist()
        cu = None if p["lengths"] is None else torch.tensor(bounds)
        q, k = x["q"], x["k"]
        if p["l2norm"]:
            q, k = (y * torch.rsqrt((y * y).sum(-1, keepdim=True) + 1e-6) for y in (q, k))
        want = packed_loop({**x, "q": q, "k": k}, p["n"], 0.5, bounds)
        if p["B"] > 1:  # equal-length sequences: one loop over the batch
            want = token_loop(q, k, x["v"], x["beta"], x["g"], x["S0"], p["n"], 0.5)
        d = p["dtype"]
        args = {n_: (None if t is None else t.to(d)) for n_, t in x.items()}
        with loop(form):
            got = gated_delta_product(
                args["q"], args["k"], args["v"], args["beta"], args["g"],
                num_householder=p["n"], scale=0.5, mode=form.removesuffix("_torch"),
                chunk_size=p["chunk"], initial_state=args["S0"], output_final_state=True,
                cu_seqlens=cu, use_qk_l2norm=p["l2norm"],
            )  # fmt: skip
        magnitude = max(float(w.pow(2).mean().sqrt()) for w in want)
        for a, b in zip(got, want, strict=True):
            err = float((a.double() - b).pow(2).mean().sqrt())
            assert err <= max(TOLERANCE[d] * float(b.pow(2).mean().sqrt()),
                              ABSOLUTE[d] * magnitude)  # fmt: skip

    holds(profile, problems(), check)


def test_the_numpy_reference_equals_the_op():
    """linattn.reference.gated.delta_product (per head, literal matrices) against the op."""
    x = inputs(B=1, H=1, HV=1, gate="channel")
    o, S = gated_delta_product(x["q"], x["k"], x["v"], x["beta"], x["g"], num_householder=3,
                               scale=0.5, initial_state=x["S0"], output_final_state=True,
                               chunk_size=4)  # fmt: skip
    want_o, want_S = reference_delta_product(
        x["q"][0, :, 0], x["k"][0, :, 0], x["v"][0, :, 0], x["beta"][0, :, 0], x["g"][0, :, 0],
        num_householder=3, scale=0.5, initial_state=x["S0"][0, 0].numpy(),
    )  # fmt: skip
    np.testing.assert_allclose(o[0, :, 0].numpy(), want_o, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(S[0, 0].numpy(), want_S, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("gate", GATE_KINDS)
@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
def test_one_write_is_the_delta_rule(gate, mode):
    x = inputs(n=1, gate=gate)
    beta = x["beta"] / 2
    got = gated_delta_product(x["q"], x["k"], x["v"], beta, x["g"], num_householder=1,
                              mode=mode, chunk_size=3, initial_state=x["S0"],
                              output_final_state=True)  # fmt: skip
    want = delta_rule(x["q"], x["k"], x["v"], beta, x["g"], mode=mode, chunk_size=3,
                      initial_state=x["S0"], output_final_state=True)  # fmt: skip
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("gate", GATE_KINDS)
def test_n_writes_are_the_delta_rule_on_the_interleaved_rows(gate):
    """The delta rule on the T n rows, the gate at each token's first write, read at its last."""
    n, T = 3, 7
    x = inputs(n=n, T=T, gate=gate)
    q_rows = x["q"].repeat_interleave(n, dim=1)  # any query: only the last write's is read
    g_rows = None
    if gate is not None:
        g_rows = torch.zeros_like(x["g"].repeat_interleave(n, dim=1))
        g_rows[:, ::n] = x["g"]
    o_rows, S_rows = delta_rule(q_rows, x["k"], x["v"], x["beta"], g_rows, chunk_size=5,
                                initial_state=x["S0"], output_final_state=True)  # fmt: skip
    o, S = gated_delta_product(x["q"], x["k"], x["v"], x["beta"], x["g"], num_householder=n,
                               chunk_size=5, initial_state=x["S0"],
                               output_final_state=True)  # fmt: skip
    torch.testing.assert_close(o, o_rows[:, n - 1 :: n], rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_rows, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gate", GATE_KINDS)
def test_prefill_then_steps_equal_one_forward(gate, dtype):
    """delta_product_step: n writes, one read, in place (float32: the fused C++ step)."""
    n, T, P = 2, 6, 3
    x = inputs(n=n, T=T, gate=gate, dtype=dtype)
    o, S_T = gated_delta_product(x["q"], x["k"], x["v"], x["beta"], x["g"], num_householder=n,
                                 initial_state=x["S0"], output_final_state=True)  # fmt: skip
    _, S = gated_delta_product(x["q"][:, :P], x["k"][:, : P * n], x["v"][:, : P * n],
                               x["beta"][:, : P * n], None if gate is None else x["g"][:, :P],
                               num_householder=n, initial_state=x["S0"],
                               output_final_state=True)  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for t in range(P, T):
        rows = slice(t * n, t * n + n)
        g_t = None if gate is None else x["g"][:, t]
        o_t = delta_product_step(S, x["q"][:, t], x["k"][:, rows], x["v"][:, rows],
                                 x["beta"][:, rows], g_t)  # fmt: skip
        torch.testing.assert_close(o_t, o[:, t], rtol=tol, atol=tol)
    torch.testing.assert_close(S, S_T, rtol=tol, atol=tol)


def test_step_checks_every_write_before_any():
    x = inputs(n=2, gate="head")
    S = x["S0"].clone()
    beta = x["beta"][:, :2].clone()
    beta[:, 1] = 2.5  # the second write is out of range: the first must not have run
    with pytest.raises(ValueError, match="beta must lie in"):
        delta_product_step(S, x["q"][:, 0], x["k"][:, :2], x["v"][:, :2], beta, x["g"][:, 0])
    assert torch.equal(S, x["S0"])


@pytest.mark.parametrize("gate", GATE_KINDS)
def test_chunk_affine_map_of_the_writes(gate):
    """S_out = M S_in + N for a block of tokens with n writes each."""
    n = 3
    x = inputs(n=n, gate=gate)
    HV = x["v"].shape[2]
    k = x["k"].repeat_interleave(HV // x["k"].shape[2], dim=2)
    M, N = chunk_affine_map(k, x["v"], x["beta"], x["g"], num_householder=n)
    q = torch.zeros_like(k[:, ::n])
    _, S = gated_delta_product(q, k, x["v"], x["beta"], x["g"], num_householder=n,
                               initial_state=x["S0"], output_final_state=True)  # fmt: skip
    torch.testing.assert_close(M @ x["S0"] + N, S, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
@pytest.mark.parametrize("gate", ["head", "channel"])
def test_gradcheck_and_gradgradcheck(mode, gate):
    x = inputs(B=1, T=3, H=1, HV=2, K=3, V=2, n=2, gate=gate)
    x["beta"] = x["beta"].clamp(0.1, 1.9)  # away from the range's ends (finite differences)
    leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "g", "S0")]

    def f(q, k, v, beta, g, S0):
        return gated_delta_product(q, k, v, beta, g, num_householder=2, mode=mode, chunk_size=2,
                                   initial_state=S0, output_final_state=True)  # fmt: skip

    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradgradcheck(f, leaves)


def test_float32_gradients_equal_float64():
    """The fused C++ chunk backward (float32) against float64 autograd of the token loop."""
    x = inputs(n=2, gate="channel")
    leaves64 = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "g", "S0")]
    o, S = token_loop(*leaves64[:5], leaves64[5], 2, 0.5)
    (o.sin().sum() + S.cos().sum()).backward()
    leaves32 = [t.detach().float().requires_grad_() for t in leaves64]
    o, S = gated_delta_product(*leaves32[:5], num_householder=2, scale=0.5, chunk_size=4,
                               initial_state=leaves32[5], output_final_state=True)  # fmt: skip
    (o.sin().sum() + S.cos().sum()).backward()
    for a, b in zip(leaves32, leaves64, strict=True):
        assert rel_rms(a.grad, b.grad) < 1e-5


def test_checks_name_the_argument():
    x = inputs(n=2)
    q, k, v, beta, g = x["q"], x["k"], x["v"], x["beta"], x["g"]
    with pytest.raises(ValueError, match=r"k must have T \* num_householder = 7 \* 3 rows"):
        gated_delta_product(q, k, v, beta, g, num_householder=3)
    with pytest.raises(ValueError, match=r"beta must have T \* num_householder"):
        gated_delta_product(q, k, v, beta[:, :-1], g, num_householder=2)
    with pytest.raises(ValueError, match=r"g must be None, \[B, T, H\] = \(2, 7, 4\)"):
        gated_delta_product(q, k, v, beta, g.repeat_interleave(2, 1), num_householder=2)
    with pytest.raises(ValueError, match="num_householder must be an int >= 1"):
        gated_delta_product(q, k, v, beta, g, num_householder=0)
    with pytest.raises(TypeError, match="num_householder must be an int"):
        gated_delta_product(q, k, v, beta, g, num_householder=2.0)
    with pytest.raises(ValueError, match="beta must lie in"):
        gated_delta_product(q, k, v, beta + 1, g, num_householder=2)
    with pytest.raises(ValueError, match="g is a log-decay"):
        gated_delta_product(q, k, v, beta, -g, num_householder=2)
    with pytest.raises(ValueError, match="v contains non-finite"):
        gated_delta_product(q, k, v * float("nan"), beta, g, num_householder=2)
    k, v, beta = k[:, :13], v[:, :13, :2], beta[:, :13, :2]  # H = HV = 2, 13 rows
    with pytest.raises(ValueError, match="rows, a multiple of 3, got 13"):
        chunk_affine_map(k, v, beta, num_householder=3)
