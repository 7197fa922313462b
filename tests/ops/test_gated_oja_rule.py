"""linattn.ops.gated_oja_rule: every form against the float64 token loop of
``linattn.reference.gated_oja`` with packed sequences (a length-1 piece), grouped value heads, an
initial state, with and without the gate; a reset (gv = -inf); the decoding step; float32's
error; gradients; bad input named. (tests/registry runs the registry's case too.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops import gated_oja_rule as module
from linattn.ops.gated_oja_rule import gated_oja_rule, gated_oja_rule_step
from linattn.reference.gated_oja import recurrence

B, T, H, HV, K, V = 1, 29, 1, 2, 8, 4


def make(gate=True, dtype=torch.float64, seed=0, N=1):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, H, K), "k": randn(B, T, H, K),
        "v": F.normalize(randn(B, T, HV, V), dim=-1),
        "gv": F.logsigmoid(randn(B, T, HV, V) + 2) if gate else None,
        "beta": torch.rand(B, T, HV, generator=gen, dtype=torch.float64),
        "initial_state": randn(N, HV, K, V),
    }  # fmt: skip
    return {n: (None if t is None else t.to(dtype)) for n, t in x.items()}


def oracle(x, scale, bounds):
    o = np.zeros((T, HV, V))
    S = np.zeros((len(bounds) - 1, HV, K, V))
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        for hv in range(HV):
            h = hv // (HV // H)
            gv = None if x["gv"] is None else x["gv"][0, s:e, hv].numpy()
            o[s:e, hv], S[n, hv] = recurrence(
                x["q"][0, s:e, h].numpy(), x["k"][0, s:e, h].numpy(), x["v"][0, s:e, hv].numpy(),
                gv, x["beta"][0, s:e, hv].numpy(), scale=scale,
                initial_state=x["initial_state"][n, hv].numpy(),
            )  # fmt: skip
    return torch.from_numpy(o)[None], torch.from_numpy(S)


@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize("mode,C", [("parallel", 1), ("recurrent", 1), ("chunk", 8), ("chunk", 5)])
def test_every_form_equals_the_reference_packed_and_grouped(gate, mode, C):
    cu = [0, 1, 12, 29]
    x = make(gate, N=3)
    got = gated_oja_rule(
        **x, scale=0.4, mode=mode, chunk_size=C, output_final_state=True,
        cu_seqlens=torch.tensor(cu),
    )  # fmt: skip
    for a, b in zip(got, oracle(x, 0.4, cu), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_reset_forgets_the_state_in_every_form():
    x = make()
    x["gv"][0, 10, :, :] = -math.inf
    want = gated_oja_rule(**x, mode="recurrent", output_final_state=True)
    assert want[0][0, 10:].isfinite().all()
    for mode in ("chunk", "parallel"):
        for a, b in zip(gated_oja_rule(**x, mode=mode, output_final_state=True), want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # after the reset the outputs do not depend on the initial state
    other = gated_oja_rule(**{**x, "initial_state": 2 * x["initial_state"]}, mode="recurrent")
    torch.testing.assert_close(other[0][:, 10:], want[0][:, 10:], rtol=0, atol=1e-12)


def test_the_step_equals_the_recurrent_form():
    x = make()
    o, S = gated_oja_rule(**x, mode="recurrent", output_final_state=True)
    state = x["initial_state"].clone()
    for t in range(T):
        o_t = gated_oja_rule_step(state, *(x[n][:, t] for n in ("q", "k", "v", "gv", "beta")))
        torch.testing.assert_close(o_t, o[:, t], rtol=0, atol=1e-12)
    torch.testing.assert_close(state, S, rtol=0, atol=1e-12)


def test_float32_relative_rms_error():
    """float32 against the float64 reference: relative RMS below 1e-6 (measured: about 2e-7)."""
    x = make()
    want = oracle(x, 0.4, [0, T])
    x32 = {n: t.float() for n, t in x.items()}
    for mode in ("recurrent", "chunk"):
        got = gated_oja_rule(**x32, scale=0.4, mode=mode, output_final_state=True)
        for a, b in zip(got, want, strict=True):
            error = float((a.double() - b).norm() / b.norm())
            assert error < 1e-6, (mode, error)


def test_chunk_gradients_equal_the_recurrent_form_s():
    x = make()
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}

    def grads(mode):
        o, S = gated_oja_rule(**leaves, mode=mode, chunk_size=8, output_final_state=True)
        loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
        return torch.autograd.grad(loss + S.square().sum(), list(leaves.values()))

    for a, b in zip(grads("chunk"), grads("recurrent"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_bad_input_is_named():
    x = make()
    with pytest.raises(ValueError, match="gv must have shape"):
        gated_oja_rule(**{**x, "gv": x["gv"][..., 0]})
    with pytest.raises(ValueError, match="gv is a log-decay"):
        gated_oja_rule(**{**x, "gv": -x["gv"]})
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\]"):
        gated_oja_rule(**{**x, "beta": x["beta"][:, :, :1]})
    with pytest.raises(ValueError, match="initial_state must have shape"):
        gated_oja_rule(**{**x, "initial_state": x["initial_state"][..., :2]})


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_steep_chunk_takes_the_exact_form(dtype):
    """A chunk whose decay spans more than the factored form's limit (exp(-G) would leave the
    dtype's range) is computed by the per-pair form: the same numbers as the reference."""
    x = make()
    x["gv"][0, 12, :, :] = -700.0  # finite, beyond float64's limit of 600 (and float32's 60)
    want = oracle(x, 0.4, [0, T])
    x = {n: (None if t is None else t.to(dtype)) for n, t in x.items()}
    got = gated_oja_rule(**x, scale=0.4, mode="chunk", chunk_size=8, output_final_state=True)
    for a, b in zip(got, want, strict=True):
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol)


@pytest.mark.parametrize("steep", [False, True])
def test_the_chunk_form_in_blocks_equals_the_reference_and_its_gradients_autograd_s(
    monkeypatch, steep
):
    """The factored chunk form two chunks a block (several blocks, the last one short), with
    and without a steep chunk in a middle block (that block alone takes the per-pair form, from
    the state the factored blocks before it leave): the reference's outputs and states, and the
    recurrent form's gradients."""
    C = 3
    x = make()
    if steep:
        x["gv"][0, 13, :, :] = -700.0  # chunk 4 of 10: the third block
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}

    def run(mode):
        o, S = gated_oja_rule(**leaves, scale=0.4, mode=mode, chunk_size=C, output_final_state=True)
        loss = (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum()
        return (o, S), torch.autograd.grad(loss + S.square().sum(), list(leaves.values()))

    monkeypatch.setattr(module, "BLOCK_NUMBERS", 2 * HV * C * C)  # two chunks a block
    got, grads = run("chunk")
    for a, b in zip(got, oracle(x, 0.4, [0, T]), strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-12)
    for a, b in zip(grads, run("recurrent")[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
