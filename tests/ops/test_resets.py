"""Resets and steep gates: every form against the float64 recurrence.

A reset is a log-gate far below anything exp can represent (-1e3 ... -1e38) or -inf, where the
decay is exactly 0 and the state is forgotten; ordinary gates follow it in the same chunk. The
chunk form used to sum the gates of a chunk in float32, losing the small gates after a large one
(relative errors 1e-4 at -1e3 up to 0.84 at -1e7, NaN at -1e38). Each case here runs every form
(parallel, recurrent, chunk with chunk sizes 1 to beyond T, the fused C++ loop and the PyTorch
loop) and compares outputs, final states and the gradients of q, k, v, beta, g and the initial
state with the float64 recurrence: the numpy oracle (``cases.oracle``) for the forward pass, float64
autograd through the recurrent form for the gradients.
"""

from __future__ import annotations

import math

import pytest
import torch

from linattn.ops import _native, chunk_affine_map, delta_rule, linear_attention

from .cases import oracle, rel_rms
from .reset_cases import T, reset_inputs

RESETS = [-1e3, -1e4, -1e6, -1e7, -1e38, -math.inf]
CHUNKS = [1, 7, 16, 64, 100]  # 64 and 100: longer than T
FLOAT32_RMS = 2e-6  # the other tests' bound for float32 rounding (the contract asks for 1e-5)
FLOAT64_RMS = 1e-10
NAMES = ("q", "k", "v", "beta", "g", "S0")


def run(x: dict, rule: str, mode: str, chunk_size: int, dtype: torch.dtype, cu_seqlens=None):
    """o, S and the gradients of a fixed weighted loss, for inputs cast to ``dtype``."""
    leaves = {n: x[n].to(dtype, copy=True).requires_grad_() for n in NAMES if x[n] is not None}
    common = dict(
        mode=mode,
        chunk_size=chunk_size,
        initial_state=leaves["S0"],
        output_final_state=True,
        scale=0.5,
        cu_seqlens=cu_seqlens,
    )
    q, k, v, g = (leaves[n] for n in ("q", "k", "v", "g"))
    if rule == "additive":
        o, S = linear_attention(q, k, v, g, **common)
    else:
        o, S = delta_rule(q, k, v, leaves["beta"], g, **common)
    gen = torch.Generator().manual_seed(1)
    w_o = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype)
    w_S = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(dtype)
    ((o * w_o).sum() + (S * w_S).sum()).backward()
    return o.detach(), S.detach(), {n: t.grad for n, t in leaves.items()}


def reference(x: dict, rule: str, cu_seqlens=None):
    """The float64 recurrence: o, S from the numpy oracle, gradients from float64 autograd."""
    _, _, grads = run(x, rule, "recurrent", 1, torch.float64, cu_seqlens)
    if cu_seqlens is None:
        o, S = oracle(*(x[n] for n in NAMES), rule=rule, scale=0.5)
        return o, S, grads
    outs, states = [], []
    bounds = cu_seqlens.tolist()
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        part = [None if x[m] is None else x[m][:, a:b] for m in NAMES[:-1]]
        o, S = oracle(*part, x["S0"][n : n + 1], rule=rule, scale=0.5)
        outs.append(o)
        states.append(S)
    return torch.cat(outs, dim=1), torch.cat(states), grads


def assert_agrees(got, ref, bound: float, label: str) -> None:
    o, S, grads = got
    o_ref, S_ref, grads_ref = ref
    pairs = {"o": (o, o_ref), "S": (S, S_ref)}
    pairs.update({f"d{n}": (grads[n], grads_ref[n]) for n in grads_ref})
    for name, (a, b) in pairs.items():
        assert torch.isfinite(a).all(), f"{label}: {name} not finite"
        if not b.any():  # nothing reaches it (a reset at the first token: dS0 = 0)
            assert not a.any(), f"{label}: {name} should be 0"
            continue
        err = rel_rms(a, b)
        assert err <= bound, f"{label}: {name} relative RMS {err:.2e} > {bound:.0e}"


def loops():
    """The loops that serve float32 chunk forms here: (name, LINATTN_NATIVE value)."""
    return [("fused", "1")] * _native.available() + [("pytorch", "0")]


@pytest.mark.parametrize("reset", RESETS)
@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_resets_in_every_form_equal_the_float64_recurrence(rule, gate, reset, monkeypatch):
    x = reset_inputs(rule, gate, reset)
    ref = reference(x, rule)
    for loop, env in loops():
        monkeypatch.setenv("LINATTN_NATIVE", env)
        for C in CHUNKS:
            got = run(x, rule, "chunk", C, torch.float32)
            assert_agrees(got, ref, FLOAT32_RMS, f"float32 chunk {C} ({loop} loop)")
    for C in CHUNKS:
        assert_agrees(run(x, rule, "chunk", C, torch.float64), ref, FLOAT64_RMS, f"float64 {C}")
    for mode in ("parallel", "recurrent"):
        assert_agrees(run(x, rule, mode, 64, torch.float32), ref, FLOAT32_RMS, f"float32 {mode}")
        assert_agrees(run(x, rule, mode, 64, torch.float64), ref, FLOAT64_RMS, f"float64 {mode}")


@pytest.mark.parametrize("reset", [-1e7, -math.inf])
@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_resets_in_packed_sequences(rule, gate, reset, monkeypatch):
    # Sequences of 13, 16 and 11 tokens (B = 1), each from its own initial state: the resets
    # fall at other places in their chunks than in one long sequence.
    x = reset_inputs(rule, gate, reset, B=1)
    x["S0"] = torch.randn(3, *x["S0"].shape[1:], generator=torch.Generator().manual_seed(2))
    cu = torch.tensor([0, 13, 29, T])
    ref = reference(x, rule, cu)
    for loop, env in loops():
        monkeypatch.setenv("LINATTN_NATIVE", env)
        for C in (7, 16):
            got = run(x, rule, "chunk", C, torch.float32, cu)
            assert_agrees(got, ref, FLOAT32_RMS, f"float32 chunk {C} ({loop} loop)")
    assert_agrees(run(x, rule, "chunk", 7, torch.float64, cu), ref, FLOAT64_RMS, "float64")


def steep_gates(gate: str, *, B=2, H=4, K=8, seed=3) -> torch.Tensor:
    """Gated DeltaNet's g = -exp(A_log) softplus(x + dt_bias), A = exp(A_log) from 1 to 16 per head,
    large pre-activations x ~ N(0, 8^2) and dt_bias = softplus^-1(dt), dt in [0.001, 0.1] (the
    Mamba-2 initialisation); ``channel``: KDA's version, one gate per key channel."""
    gen = torch.Generator().manual_seed(seed)
    A = torch.linspace(1.0, 16.0, H, dtype=torch.float64)
    dt = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(0.1), generator=gen))
    dt_bias = (dt + torch.log(-torch.expm1(-dt))).double()  # softplus^-1(dt)
    shape = (B, T, H) if gate == "scalar" else (B, T, H, K)
    x = 8 * torch.randn(*shape, generator=gen, dtype=torch.float64)
    per_head = (slice(None),) + (None,) * (gate == "channel")  # A [H] or [H, 1]
    return -torch.log(A)[per_head].exp() * torch.nn.functional.softplus(x + dt_bias[per_head])


@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_steep_realistic_gates(rule, gate, monkeypatch):
    x = reset_inputs(rule, gate, -0.05, H=4)  # the "reset" of -0.05 is an ordinary gate
    x["g"] = steep_gates(gate)
    assert x["g"].min() < -100 and x["g"].max() > -0.05  # steep, and some gentle ones
    ref = reference(x, rule)
    for loop, env in loops():
        monkeypatch.setenv("LINATTN_NATIVE", env)
        for C in (7, 16, 64):
            got = run(x, rule, "chunk", C, torch.float32)
            assert_agrees(got, ref, FLOAT32_RMS, f"float32 chunk {C} ({loop} loop)")
    assert_agrees(run(x, rule, "chunk", 16, torch.float64), ref, FLOAT64_RMS, "float64")


@pytest.mark.parametrize("reset", [-1e6, -1e38, -math.inf])
@pytest.mark.parametrize("gate", ["scalar", "channel"])
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_affine_map_with_resets(rule, gate, reset):
    # M S0 + N is the state the float64 recurrence reaches from S0.
    x = reset_inputs(rule, gate, reset)
    _, S_ref = oracle(*(x[n] for n in NAMES), rule=rule)
    for dtype, bound in ((torch.float32, FLOAT32_RMS), (torch.float64, FLOAT64_RMS)):
        beta = None if x["beta"] is None else x["beta"].to(dtype)
        M, N = chunk_affine_map(x["k"].to(dtype), x["v"].to(dtype), beta, x["g"].to(dtype))
        S = M.double() @ x["S0"] + N.double()
        assert torch.isfinite(S).all() and rel_rms(S, S_ref) <= bound, dtype
