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

from linattn.ops import _native
from linattn.ops import gated_oja_rule as module
from linattn.ops.gated_oja_rule import gated_oja_rule, gated_oja_rule_step
from linattn.reference.gated_oja import recurrence

from .native_calls import fused_calls, on_threads

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


# --- the compiled chunk form (csrc/oja.cpp) on float32 CPU tensors --------------------------

native = pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")


def _loss_and_grads(x, **options):
    """The outputs (o, S) and the gradients of a weighted loss of both with respect to every
    input (float64 weights, cast: the same loss for either dtype)."""
    leaves = {n: None if t is None else t.clone().requires_grad_() for n, t in x.items()}
    o, S = gated_oja_rule(**leaves, output_final_state=True, **options)
    gen = torch.Generator().manual_seed(7)
    w_o = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
    w_S = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(S.dtype)
    present = [t for t in leaves.values() if t is not None]
    grads = torch.autograd.grad((o * w_o).sum() + (S * w_S).sum(), present)
    return (o.detach(), S.detach()), grads


def _assert_float32_close(got, want, bound):
    """Each float32 tensor against its float64 counterpart: largest error relative to the
    largest entry (or to 1, the inputs' size, where every entry is smaller: the gate's gradient
    of a lone first token is 0, and float32 leaves its terms' rounding) below ``bound``."""
    for a, b in zip(got, want, strict=True):
        error = float((a.double() - b).abs().max() / b.abs().max().clamp_min(1.0))
        assert error < bound, error


def _packed(cu, gate=True, seed=0, steep=1.0):
    """make()'s inputs over the tokens of ``cu`` (the module's T is 29), one state a piece."""
    x = make(gate, seed=seed, N=len(cu) - 1)
    if gate:
        x["gv"] = x["gv"] * steep
    return x


@native
@pytest.mark.parametrize("gate", [True, False])
@pytest.mark.parametrize(
    "C,cu",
    [(8, None), (5, None), (64, None), (1, None), (8, [0, 1, 2, 12, 13, 29]), (4, [0, 28, 29])],
)
def test_the_compiled_form_equals_float64_and_its_gradients(monkeypatch, gate, C, cu):
    """float32 through the compiled kernels against the float64 chunk form (itself the
    reference's to 1e-12, the tests above): outputs, final states and every gradient, with
    grouped value heads, an initial state, T not a multiple of C (and C = 1, C > T), packed
    sequences with pieces of one token; the kernels run, forward and backward."""
    x = _packed([0, T] if cu is None else cu, gate)
    options = {"scale": 0.4, "mode": "chunk", "chunk_size": C}
    if cu is not None:
        options["cu_seqlens"] = torch.tensor(cu)
    want, want_grads = _loss_and_grads(x, **options)
    called = fused_calls(monkeypatch)
    x32 = {n: None if t is None else t.float() for n, t in x.items()}
    got, got_grads = _loss_and_grads(x32, **options)
    assert called == ["oja_forward", "oja_backward"]
    _assert_float32_close(got, want, 2e-6)
    _assert_float32_close(got_grads, want_grads, 2e-6)


@native
@pytest.mark.parametrize("T_", [1, 3])
def test_the_compiled_form_with_a_batch_and_few_tokens(monkeypatch, T_):
    """B = 3 sequences of T_ tokens (no cu_seqlens), no initial state: float64's numbers."""
    gen = torch.Generator().manual_seed(3)
    x = {
        "q": torch.randn(3, T_, 2, 5, generator=gen, dtype=torch.float64),
        "k": torch.randn(3, T_, 2, 5, generator=gen, dtype=torch.float64),
        "v": F.normalize(torch.randn(3, T_, 4, 6, generator=gen, dtype=torch.float64), dim=-1),
        "gv": F.logsigmoid(torch.randn(3, T_, 4, 6, generator=gen, dtype=torch.float64)),
        "beta": torch.rand(3, T_, 4, generator=gen, dtype=torch.float64),
    }
    want, want_grads = _loss_and_grads(x)
    called = fused_calls(monkeypatch)
    got, got_grads = _loss_and_grads({n: t.float() for n, t in x.items()})
    assert called == ["oja_forward", "oja_backward"]
    _assert_float32_close(got, want, 2e-6)
    _assert_float32_close(got_grads, want_grads, 2e-6)


@native
def test_steep_gates_within_the_limit_stay_in_the_compiled_form(monkeypatch):
    """Gates of about -6 a token (a chunk of 8 spans about 50 of the limit's 60: exp(-G) near
    1e21): the compiled form still serves them, and keeps float32's accuracy."""
    x = _packed([0, T])
    x["gv"] = -6.0 - 0.5 * torch.rand(x["gv"].shape, generator=torch.Generator().manual_seed(1),
                                       dtype=torch.float64)  # fmt: skip
    options = {"scale": 0.4, "mode": "chunk", "chunk_size": 8}
    want, want_grads = _loss_and_grads(x, **options)
    called = fused_calls(monkeypatch)
    got, got_grads = _loss_and_grads({n: t.float() for n, t in x.items()}, **options)
    assert called == ["oja_forward", "oja_backward"]
    _assert_float32_close(got, want, 1e-5)
    _assert_float32_close(got_grads, want_grads, 1e-5)


@native
def test_a_chunk_beyond_the_limit_falls_back_to_the_pytorch_form(monkeypatch):
    """A chunk whose decay spans float32's limit (a gate of -70, finite): the kernel says so
    (steep > 0) and the op runs its PyTorch forms instead, outputs and gradients float64's."""
    x = _packed([0, 12, 29])
    x["gv"][0, 20, 1, :] = -70.0
    x32 = {n: t.float() for n, t in x.items()}
    flat = [x32[n][0].contiguous() for n in ("q", "k", "v", "gv", "beta")]
    *_, steep = torch.ops.linattn_native.oja_forward(
        *flat, x32["initial_state"], [0, 12, 29], 0.4, 8, 60.0, False
    )
    assert int(steep) > 0
    options = {"scale": 0.4, "chunk_size": 8, "cu_seqlens": torch.tensor([0, 12, 29])}
    want, want_grads = _loss_and_grads(x, **options)
    called = fused_calls(monkeypatch)
    got, got_grads = _loss_and_grads(x32, **options)
    assert called == ["oja_forward"]  # the forward only: its result set aside
    _assert_float32_close(got, want, 1e-5)
    _assert_float32_close(got_grads, want_grads, 1e-5)


@native
def test_a_chunk_larger_than_the_kernels_take_runs_the_pytorch_form(monkeypatch):
    x = _packed([0, T])
    called = fused_calls(monkeypatch)
    x32 = {n: t.float() for n, t in x.items()}
    options = {"scale": 0.4, "chunk_size": module.FUSED_MAX_CHUNK + 1}
    got = gated_oja_rule(**x32, **options, output_final_state=True)
    assert called == []
    _assert_float32_close(got, oracle(x, 0.4, [0, T]), 2e-6)


@native
def test_a_reset_in_float32_takes_the_token_loop(monkeypatch):
    x = _packed([0, T])
    x["gv"][0, 10] = -math.inf
    called = fused_calls(monkeypatch)
    got = gated_oja_rule(**{n: t.float() for n, t in x.items()}, scale=0.4,
                         output_final_state=True)  # fmt: skip
    assert called == []
    _assert_float32_close(got, oracle(x, 0.4, [0, T]), 2e-6)


@native
def test_opcheck_the_compiled_ops():
    """Schema, fake (Meta) kernels and the dispatcher's checks of both ops."""
    x = {n: t.float() for n, t in _packed([0, 1, 12, 29]).items()}
    flat = [x[n][0].contiguous() for n in ("q", "k", "v", "gv", "beta")]
    bounds = [0, 1, 12, 29]
    op = torch.ops.linattn_native
    utils = ("test_schema", "test_faketensor")
    args = (*flat, x["initial_state"], bounds, 0.4, 8, 60.0, True)
    torch.library.opcheck(op.oja_forward.default, args, test_utils=utils)
    o, _, states, _ = op.oja_forward(*args)
    d_o, dS = torch.randn_like(o), torch.randn_like(x["initial_state"])
    for d_state in (dS, None):
        back = (*flat, states, o, d_o, d_state, bounds, 0.4, 8, 60.0)
        torch.library.opcheck(op.oja_backward.default, back, test_utils=utils)


@native
def test_the_compiled_ops_name_bad_input():
    x = {n: t.float() for n, t in _packed([0, T]).items()}
    q, k, v, gv, beta = (x[n][0].contiguous() for n in ("q", "k", "v", "gv", "beta"))
    S0 = x["initial_state"]
    op = torch.ops.linattn_native.oja_forward
    with pytest.raises(RuntimeError, match="bounds must run from 0 to 29"):
        op(q, k, v, gv, beta, S0, [0, 28], 0.4, 8, 60.0, False)
    with pytest.raises(RuntimeError, match="gv must be float32"):
        op(q, k, v, gv.double(), beta, S0, [0, T], 0.4, 8, 60.0, False)
    with pytest.raises(RuntimeError, match="gv must have v's shape"):
        op(q, k, v, gv[:, :, :2].contiguous(), beta, S0, [0, T], 0.4, 8, 60.0, False)
    with pytest.raises(RuntimeError, match="S0 must have shape"):
        op(q, k, v, gv, beta, S0[..., :2].contiguous(), [0, T], 0.4, 8, 60.0, False)
    with pytest.raises(RuntimeError, match="C .the chunk size. must be in"):
        op(q, k, v, gv, beta, S0, [0, T], 0.4, 0, 60.0, False)


@native
def test_the_compiled_form_gives_the_same_bits_on_two_threads():
    """The kernels split the (sequence, head)s between threads, each computed alone: two
    threads give one thread's numbers exactly, forward and backward."""
    x = {n: t.float() for n, t in _packed([0, 1, 12, 29]).items()}
    options = {"scale": 0.4, "chunk_size": 8, "cu_seqlens": torch.tensor([0, 1, 12, 29])}
    one, two = on_threads(lambda: _loss_and_grads(x, **options), 1, 2)
    for a, b in zip([*one[0], *one[1]], [*two[0], *two[1]], strict=True):
        assert torch.equal(a, b)
