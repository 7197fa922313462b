"""``recurrent_step``: one token of every mechanism, in place, equal to the ops' recurrent form."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import delta_rule, linear_attention, recurrent_step
from linattn.ops.step import fused_step

from .step_cases import MECHANISMS, B, H, K, V, inputs


def op_step(x: dict, S0: torch.Tensor, scale: float | None):
    """The same token through the public sequence op, T = 1: (o [B, H, V], new state)."""
    seq = {n: None if t is None else t.unsqueeze(1) for n, t in x.items()}  # [B, 1, H, ...]
    common = dict(scale=scale, mode="recurrent", initial_state=S0, output_final_state=True)
    if x["beta"] is None:
        o, S = linear_attention(seq["q"], seq["k"], seq["v"], g=seq["g"], **common)
    else:
        o, S = delta_rule(seq["q"], seq["k"], seq["v"], seq["beta"], g=seq["g"], **common)
    return o[:, 0], S


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("scale", [None, 0.7])
def test_step_equals_the_recurrent_form_and_updates_in_place(mechanism, scale):
    x = inputs(mechanism)
    S0 = torch.randn(B, H, K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected_o, expected_S = op_step(x, S0, scale)
    state = S0.clone()
    memory = state.data_ptr()
    o = recurrent_step(state, **x, scale=scale)
    assert state.data_ptr() == memory  # the same memory, overwritten
    torch.testing.assert_close(o, expected_o, rtol=0, atol=1e-14)
    torch.testing.assert_close(state, expected_S, rtol=0, atol=1e-14)


@pytest.mark.parametrize("mechanism", ["delta", "kda"])
def test_many_steps_equal_one_recurrent_call(mechanism):
    T = 7
    steps = [inputs(mechanism, seed=s) for s in range(T)]
    seq = {n: None if steps[0][n] is None else torch.stack([s[n] for s in steps], 1)
           for n in steps[0]}  # fmt: skip
    o_seq, S_seq = delta_rule(seq["q"], seq["k"], seq["v"], seq["beta"], g=seq["g"],
                              mode="chunk", chunk_size=3, output_final_state=True)  # fmt: skip
    state = torch.zeros(B, H, K, V, dtype=torch.float64)
    outs = [recurrent_step(state, **s) for s in steps]
    torch.testing.assert_close(torch.stack(outs, 1), o_seq, rtol=0, atol=1e-13)
    torch.testing.assert_close(state, S_seq, rtol=0, atol=1e-13)


@pytest.mark.parametrize("mechanism", ["scalar_decay", "gla", "gated_delta", "kda"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("native", ["1", "0"])
def test_a_reset_forgets_the_state(mechanism, dtype, native, monkeypatch):
    # g = -inf: alpha = 0 exactly, the state before the token is forgotten. float32
    # runs the fused step where it is available ("1") and the PyTorch step ("0").
    monkeypatch.setenv("LINATTN_NATIVE", native)
    x = inputs(mechanism, dtype=dtype)
    x["g"] = torch.full_like(x["g"], float("-inf"))
    state = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(1)).to(dtype)
    o = recurrent_step(state, **x, scale=1.0)
    fresh = torch.zeros(B, H, K, V, dtype=dtype)
    o_fresh = recurrent_step(fresh, **{**x, "g": None}, scale=1.0)
    assert torch.equal(state, fresh) and torch.equal(o, o_fresh)


def test_low_precision_inputs_are_computed_in_the_state_dtype():
    x = inputs("gated_delta", dtype=torch.bfloat16)
    state = torch.zeros(B, H, K, V, dtype=torch.float32)
    o = recurrent_step(state, **x)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    reference = torch.zeros(B, H, K, V, dtype=torch.float64)
    o64 = recurrent_step(reference, **{n: None if t is None else t.double() for n, t in x.items()})
    torch.testing.assert_close(state.double(), reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(o.double(), o64, rtol=2e-2, atol=2e-2)


def bad(name: str, value):
    x = inputs("kda")
    x[name] = value
    return x


@pytest.mark.parametrize(
    "x, state, error, message",
    [
        (bad("q", torch.randn(B, H, K + 1, dtype=torch.float64)), None, ValueError, "q must have"),
        (bad("v", torch.randn(B, H, K, dtype=torch.float64)), None, ValueError, "v must have"),
        (bad("k", torch.full((B, H, K), float("nan"), dtype=torch.float64)), None, ValueError,
         "k contains non-finite"),
        (bad("beta", torch.full((B, H), 2.5, dtype=torch.float64)), None, ValueError,
         r"beta must lie in \[0, 2\]"),
        (bad("g", torch.full((B, H, K), 0.1, dtype=torch.float64)), None, ValueError,
         "g is a log-decay"),
        (bad("g", torch.full((B, H, K), float("nan"), dtype=torch.float64)), None, ValueError,
         "g contains NaN"),
        (bad("g", torch.full((B, H, K), float("inf"), dtype=torch.float64)), None, ValueError,
         "g is a log-decay"),
        (bad("g", torch.zeros(B, H, K + 1, dtype=torch.float64)), None, ValueError,
         r"g must be None, \[B, H\] = \(2, 3\) or \[B, H, K\] = \(2, 3, 5\)"),
        (bad("beta", torch.full((B, H), float("nan"), dtype=torch.float64)), None, ValueError,
         "beta contains non-finite"),
        (bad("beta", torch.rand(B, H + 1, dtype=torch.float64)), None, ValueError,
         r"beta must have shape \[B, H\]"),
        (bad("q", [1.0]), None, TypeError, "q must be a torch.Tensor"),
        (bad("q", torch.zeros(B, H, K, dtype=torch.int64)), None, TypeError, "q must be float"),
        (inputs("kda"), torch.full((B, H, K, V), float("inf"), dtype=torch.float64), ValueError,
         "state contains non-finite"),
        (inputs("kda"), torch.zeros(B, H, K, V, dtype=torch.bfloat16), TypeError,
         "state must be float32 or float64"),
        (inputs("kda"), torch.zeros(B, H, K, dtype=torch.float64), ValueError, "state must have"),
        (inputs("kda"), torch.zeros(B, H, K, V, dtype=torch.float64, requires_grad=True),
         ValueError, "state requires grad and is a leaf"),
    ],
)  # fmt: skip
def test_bad_input_is_named_and_leaves_the_state_untouched(x, state, error, message):
    state = torch.zeros(B, H, K, V, dtype=torch.float64) if state is None else state
    before = state.detach().clone()
    with pytest.raises(error, match=message):
        recurrent_step(state, **x)
    assert torch.equal(state.detach(), before) or not torch.isfinite(before).all()


@pytest.mark.parametrize(
    "mechanism, name, value, message",
    [
        ("kda", "g", 1e-3, "g is a log-decay"),
        ("kda", "g", float("nan"), "g contains NaN"),
        ("gated_delta", "g", 1e-3, "g is a log-decay"),
        ("kda", "beta", 2.0001, r"beta must lie in \[0, 2\]"),
        ("kda", "beta", -1e-6, r"beta must lie in \[0, 2\]"),
        ("gated_delta", "beta", float("nan"), "beta contains non-finite"),
    ],
)
@pytest.mark.parametrize("where", [0, "middle", -1])
def test_one_float32_value_out_of_range_is_found_by_the_fused_step(mechanism, name, value, message,
                                                                   where):  # fmt: skip
    # The fused step's checks count the values outside the range in one branch-free pass: one
    # value anywhere (the first, one inside a vector's lanes, the last) must be found.
    Bq, Hq, Kq = 3, 4, 37  # sizes that are no multiple of a vector's width
    gen = torch.Generator().manual_seed(0)
    x = {n: torch.randn(Bq, Hq, Kq, generator=gen) for n in ("q", "k", "v")}
    x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    x["beta"] = torch.rand(Bq, Hq, generator=gen) * 2
    x["g"] = -torch.rand(Bq, Hq, *([Kq] if mechanism == "kda" else []), generator=gen)
    flat = x[name].view(-1)
    flat[flat.numel() // 2 if where == "middle" else where] = value
    state = torch.randn(Bq, Hq, Kq, Kq)
    before = state.clone()
    with pytest.raises(ValueError, match=message):
        recurrent_step(state, **x)
    assert torch.equal(state, before)


def _leaves(x: dict, dtype) -> dict:
    """The same values in ``dtype``, as fresh leaves that require grad."""
    return {n: None if t is None else t.to(dtype).requires_grad_(True) for n, t in x.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_step_gradients_equal_the_recurrent_forms(mechanism, dtype):
    # the fused float32 CPU step returned no gradient (q.grad was None).
    gen = torch.Generator().manual_seed(2)
    S0 = torch.randn(B, H, K, V, dtype=torch.float64, generator=gen)
    w = torch.randn(B, H, V, dtype=torch.float64, generator=gen)
    ref = _leaves(inputs(mechanism), torch.float64)
    o_ref, _ = op_step(ref, S0, None)
    (o_ref * w).sum().backward()
    new = _leaves(inputs(mechanism), dtype)
    state = S0.to(dtype)
    o = recurrent_step(state, **new)
    (o * w.to(dtype)).sum().backward()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for name, t in new.items():
        if t is not None:
            assert t.grad is not None, name
            torch.testing.assert_close(t.grad.double(), ref[name].grad, rtol=tol, atol=tol)
    torch.testing.assert_close(o.detach().double(), o_ref.detach(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mechanism", ["gla", "kda"])
def test_steps_differentiate_through_the_state_like_one_recurrent_call(mechanism, dtype):
    # Three steps from a copy of S0 that requires grad: every step's inputs and S0 get the
    # gradients of the recurrent form over the three tokens (loss on the outputs and the state).
    T = 3
    steps = [_leaves(inputs(mechanism, seed=s), dtype) for s in range(T)]
    S0 = torch.randn(B, H, K, V, dtype=dtype, generator=torch.Generator().manual_seed(9))
    S0.requires_grad_(True)
    state = S0.clone()
    o = torch.stack([recurrent_step(state, **s) for s in steps], 1)
    (o.square().sum() + state.sum()).backward()
    seq = {n: None if steps[0][n] is None else
           torch.stack([s[n].detach().double() for s in steps], 1).requires_grad_(True)
           for n in steps[0]}  # fmt: skip
    S0_ref = S0.detach().double().requires_grad_(True)
    common = dict(mode="recurrent", initial_state=S0_ref, output_final_state=True)
    if seq["beta"] is None:
        o_ref, S_ref = linear_attention(seq["q"], seq["k"], seq["v"], g=seq["g"], **common)
    else:
        o_ref, S_ref = delta_rule(seq["q"], seq["k"], seq["v"], seq["beta"], g=seq["g"], **common)
    (o_ref.square().sum() + S_ref.sum()).backward()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(S0.grad.double(), S0_ref.grad, rtol=tol, atol=tol)
    for name, ref in seq.items():
        if ref is not None:
            got = torch.stack([s[name].grad for s in steps], 1).double()
            torch.testing.assert_close(got, ref.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("mechanism", ["scalar_decay", "gated_delta", "kda"])
def test_step_gradcheck_and_gradgradcheck(mechanism):
    x = inputs(mechanism)
    if x["beta"] is not None:
        x["beta"] = 0.2 + 0.8 * x["beta"]  # inside (0, 2): numerical steps stay in range
    names = [n for n, t in x.items() if t is not None]
    S0 = torch.randn(B, H, K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    tensors = [x[n].clone().requires_grad_(True) for n in names] + [S0.requires_grad_(True)]

    def f(*args):
        state = args[-1].clone()
        o = recurrent_step(state, **dict(zip(names, args[:-1], strict=True)))
        return o, state

    assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-8)
    assert torch.autograd.gradgradcheck(f, tensors, eps=1e-6, atol=1e-7)


def test_no_grad_steps_stay_in_place_and_out_of_the_graph():
    x = _leaves(inputs("kda"), torch.float32)
    state = torch.zeros(B, H, K, V)
    with torch.no_grad():
        o = recurrent_step(state, **x)
    assert not o.requires_grad and not state.requires_grad


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_out_receives_the_step_and_the_state_is_kept(mechanism, dtype):
    # out= writes S_t elsewhere (the fused step reads the state and writes out in one
    # pass), the state left as it was: the same o and S_t as the step in place.
    x = {n: None if t is None else t.to(dtype) for n, t in inputs(mechanism).items()}
    S0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(4)).to(dtype)
    state, out = S0.clone(), torch.full_like(S0, float("nan"))
    o = recurrent_step(state, **x, out=out)
    in_place = S0.clone()
    o_in_place = recurrent_step(in_place, **x)
    assert torch.equal(state, S0)
    assert torch.equal(out, in_place) and torch.equal(o, o_in_place)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda S: S, "out must not overlap the state"),
        (lambda S: torch.zeros(B, H, K, V + 1, dtype=S.dtype), "out must be a"),
        (lambda S: torch.zeros(B, H, V, K, dtype=S.dtype).mT, "out must be contiguous"),
        (lambda S: torch.zeros(B, H, K, V, dtype=torch.float32), "out must be a torch.float64"),
    ],
)
def test_a_bad_out_is_refused_before_any_work(make, message):
    state = torch.randn(B, H, K, V, dtype=torch.float64)
    before = state.clone()
    with pytest.raises(ValueError, match=message):
        recurrent_step(state, **inputs("kda"), out=make(state))
    assert torch.equal(state, before)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_cached_forward_of_a_few_tokens_takes_the_fused_steps(mechanism, monkeypatch):
    # the ops' recurrent form with a state and T <= tuning.DECODE_TOKENS (the layers'
    # decoding, a few tokens of speculative decoding) runs the fused step token by token in
    # float32 on the CPU (where the extension is available), equal to float64, the state kept.
    from linattn.ops import _engine, _native, tuning

    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return fused_step(*args, **kwargs)

    monkeypatch.setattr(_engine, "fused_step", spy)
    T = tuning.DECODE_TOKENS
    steps = [inputs(mechanism, seed=s) for s in range(T)]
    seq = {n: None if steps[0][n] is None else torch.stack([s[n] for s in steps], 1)
           for n in steps[0]}  # fmt: skip
    S0 = torch.randn(B, H, K, V, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    results = []
    for dtype in (torch.float32, torch.float64):
        x = {n: None if t is None else t.to(dtype) for n, t in seq.items()}
        S = S0.to(dtype)
        common = dict(mode="recurrent", initial_state=S, output_final_state=True)
        if x["beta"] is None:
            o, S_T = linear_attention(x["q"], x["k"], x["v"], g=x["g"], **common)
        else:
            o, S_T = delta_rule(x["q"], x["k"], x["v"], x["beta"], g=x["g"], **common)
        assert torch.equal(S, S0.to(dtype))  # the initial state is kept
        results.append((o, S_T))
    (o, S_T), (o64, S64) = results
    torch.testing.assert_close(o.double(), o64, rtol=0, atol=1e-5)
    torch.testing.assert_close(S_T.double(), S64, rtol=0, atol=1e-5)
    assert len(calls) == (T if _native.available() else 0)


def test_a_cached_forward_of_the_generalized_rule_takes_the_fused_steps(monkeypatch):
    # The same for the dplr rule ([a | b] in beta's slot), per-channel gate, grouped heads off.
    from linattn.ops import _engine, _native, generalized_delta_rule, tuning

    calls = []

    def spy(*args, **kwargs):
        calls.append(kwargs.get("rule", args[8] if len(args) > 8 else None))
        return fused_step(*args, **kwargs)

    monkeypatch.setattr(_engine, "fused_step", spy)
    T, gen = tuning.DECODE_TOKENS, torch.Generator().manual_seed(6)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v, g = torch.randn(B, T, H, V, generator=gen), -torch.rand(B, T, H, K, generator=gen)
    b = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    a = -0.5 * b
    S0 = torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)
    results = []
    for dtype in (torch.float32, torch.float64):
        x = [t.to(dtype) for t in (q, k, v, a, b, g)]
        S = S0.to(dtype)
        o, S_T = generalized_delta_rule(
            *x[:5], x[5], mode="recurrent", initial_state=S, output_final_state=True
        )
        assert torch.equal(S, S0.to(dtype))
        results.append((o, S_T))
    (o, S_T), (o64, S64) = results
    torch.testing.assert_close(o.double(), o64, rtol=0, atol=1e-5)
    torch.testing.assert_close(S_T.double(), S64, rtol=0, atol=1e-5)
    assert calls == (["dplr"] * T if _native.available() else [])


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_fast_path_calls_the_step_bound_directly_with_the_ops_bits(mechanism, monkeypatch):
    # float32 on the CPU, nothing to differentiate, recurrent_step takes its fast path
    # in one call bound directly (``_native.fast_step``, csrc/python.cpp), not through torch.ops'
    # schema parsing; the scale, rule and gate inferred there as in Python; the same step as the
    # registered op (step.cpp), so the same bits.
    from linattn.ops import _native

    if not _native.available():
        pytest.skip("the fused CPU code is unavailable")
    direct, calls = _native.fast_step(), []

    def spy(*args):
        calls.append(args)
        return direct(*args)

    monkeypatch.setitem(_native._state, "step", spy)
    x = {n: None if t is None else t.float() for n, t in inputs(mechanism, seed=3).items()}
    S0 = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(4))
    S_fast, S_op = S0.clone(), S0.clone()
    o_fast = recurrent_step(S_fast, x["q"], x["k"], x["v"], x["beta"], x["g"])
    assert len(calls) == 1 and calls[0][0] is S_fast
    gate = "none" if x["g"] is None else "head" if x["g"].dim() == 2 else "channel"
    rule = "additive" if x["beta"] is None else "delta"
    op = torch.ops.linattn_native.recurrent_step.default
    o_op = op(S_op, x["q"], x["k"], x["v"], x["beta"], x["g"], K**-0.5, rule, gate)
    assert torch.equal(o_fast, o_op) and torch.equal(S_fast, S_op)
    monkeypatch.setenv("LINATTN_NATIVE", "0")  # switched off: no direct call
    recurrent_step(S0.clone(), x["q"], x["k"], x["v"], x["beta"], x["g"])
    assert len(calls) == 1


def _low_rank_and_bonus(rule: str) -> dict:
    gen = torch.Generator().manual_seed(7)
    if rule == "dplr":
        a = -torch.nn.functional.normalize(torch.randn(B, H, K, generator=gen), dim=-1)
        return {"a": a, "b": -0.5 * a}
    return {"bonus": torch.randn(H, K, generator=gen)} if rule == "bonus" else {}


@pytest.mark.parametrize("mechanism", [*MECHANISMS, "dplr", "bonus"])
@pytest.mark.parametrize("native", ["1", "0"])
def test_out_on_the_state_is_refused_on_both_paths(mechanism, native, monkeypatch):
    # The fused step (float32, the extension loaded by a first step) ran out=state in place,
    # where the PyTorch step refused it: both refuse it, the state untouched.
    monkeypatch.setenv("LINATTN_NATIVE", native)
    base = "linear" if mechanism in ("dplr", "bonus") else mechanism
    x = inputs(base, dtype=torch.float32) | _low_rank_and_bonus(mechanism)
    state = torch.randn(B, H, K, V)
    recurrent_step(state.clone(), **x)  # loads the kernels where they are used
    before = state.clone()
    with pytest.raises(ValueError, match="out must not overlap the state"):
        recurrent_step(state, **x, out=state)
    assert torch.equal(state, before)


@pytest.mark.parametrize("name", ["beta", "g"])
@pytest.mark.parametrize("mechanism", ["gated_delta", "dplr"])
def test_a_list_for_beta_or_g_is_refused_by_name(name, mechanism):
    x = inputs("gated_delta") | _low_rank_and_bonus(mechanism)
    if mechanism == "dplr":
        if name == "beta":
            return  # the generalized rule has no beta
        x["beta"] = None
    x[name] = x[name].tolist()
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor, got list"):
        recurrent_step(torch.randn(B, H, K, V, dtype=torch.float64), **x)
