"""RWKV-6 (ops.rwkv6): every form equals a float64 token loop of its definition, in the
property suite's regions (gates gentle, resets, -inf, steep; forward and gradients; packed
sequences), grouped value heads, gradcheck and gradgradcheck, its reductions to linear attention,
the generation step with a bonus, and its checks.

    o_t = S_{t-1}^T (scale q_t) + scale (q_t^T Diag(u) k_t) v_t
    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T
"""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from linattn.ops import _native, linear_attention, recurrent_step, rwkv6

from .test_properties import (
    FORMS,
    GATES,
    _replace,
    assert_agrees,
    assert_no_work,
    build,
    cu_seqlens,
    gradients,
    holds,
    layouts_of,
    loop,
    problems,
    regions,
    rms,
)

MODES = [("recurrent", 64), ("parallel", 64), ("chunk", 1), ("chunk", 5), ("chunk", 16)]


def rwkv6_loop(q, k, v, g, u, S0=None, *, scale=None, bounds=None):
    """The definition token by token in float64, each packed sequence (``bounds``) alone from its
    own row of S0: o_t = (S_{t-1} + Diag(u) k_t v_t^T)^T (scale q_t), then
    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T. q, k [B, T, H, K]; v [B, T, HV, V]; g None,
    [B, T, HV] or [B, T, HV, K]; u [HV, K]. Returns (o [B, T, HV, V], S [N, HV, K, V])."""
    q, k, v, u = (x.double() for x in (q, k, v, u))
    B, T, H, K = q.shape
    HV = v.shape[2]
    G = HV // H if H else 1
    q, k = q.repeat_interleave(G, 2), k.repeat_interleave(G, 2)  # value head j reads j // G
    if g is not None:
        g = g.double()
        g = g.unsqueeze(-1) if g.dim() == 3 else g
    scale = K**-0.5 if scale is None else scale
    bounds = [0, T] if bounds is None else bounds
    outs, states = [], []
    for n, (start, end) in enumerate(itertools.pairwise(bounds)):
        first = S0 if bounds == [0, T] else (None if S0 is None else S0[n : n + 1])
        S = torch.zeros(B, HV, K, v.shape[-1], dtype=torch.float64) if first is None else first
        S = S.double()
        for t in range(start, end):
            kv = k[:, t, :, :, None] * v[:, t, :, None, :]  # [B, HV, K, V]
            read = S + u[None, :, :, None] * kv
            outs.append(torch.einsum("bhk,bhkv->bhv", scale * q[:, t], read))
            decay = 1.0 if g is None else g[:, t, :, :, None].exp()
            S = decay * S + kv
        states.append(S)
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, HV, v.shape[-1]).double()
    return o, torch.cat(states, 0)


def _inputs(B=2, T=19, H=2, HV=4, K=6, V=5, gate="channel", seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    g = {"channel": (B, T, HV, K), "head": (B, T, HV), None: None}[gate]
    x = {
        "q": randn(B, T, H, K), "k": randn(B, T, H, K), "v": randn(B, T, HV, V),
        "g": None if g is None else F.logsigmoid(randn(*g) + 1.0), "u": randn(HV, K),
        "S0": randn(B, HV, K, V),
    }  # fmt: skip
    return {n: None if t is None else t.to(dtype) for n, t in x.items()}


def _close(got, want, tol=1e-12):
    for a, b in zip(got, want, strict=True):
        a, b = a.detach().double(), b.detach().double()
        assert a.shape == b.shape, (a.shape, b.shape)
        if b.numel():
            assert float((a - b).abs().max()) <= tol * max(float(b.abs().max()), 1.0)


@pytest.mark.parametrize("gate", ["channel", "head", None])
@pytest.mark.parametrize("mode,C", MODES)
def test_every_form_equals_the_token_loop(mode, C, gate):
    x = _inputs(gate=gate)
    got = rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], scale=0.7, mode=mode, chunk_size=C,
                initial_state=x["S0"], output_final_state=True)  # fmt: skip
    _close(got, rwkv6_loop(x["q"], x["k"], x["v"], x["g"], x["u"], x["S0"], scale=0.7))


@pytest.mark.parametrize("mode,C", MODES)
def test_packed_sequences_without_initial_state(mode, C):
    x = _inputs(B=1, T=17)
    bounds = [0, 1, 7, 17]
    got = rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], mode=mode, chunk_size=C,
                cu_seqlens=torch.tensor(bounds), output_final_state=True)  # fmt: skip
    _close(got, rwkv6_loop(x["q"], x["k"], x["v"], x["g"], x["u"], bounds=bounds))


def test_float32_chunk_forward_and_gradients_equal_the_float64_loop():
    """The fused C++ loop (float32 on the CPU), several chunks, against the float64 loop."""
    x = _inputs(B=2, T=100, H=2, HV=2, K=8, V=8, dtype=torch.float32)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    leaves64 = {n: t.double().requires_grad_() for n, t in x.items()}
    o, S = rwkv6(*(leaves[n] for n in "qkvgu"), chunk_size=16, initial_state=leaves["S0"],
                 output_final_state=True)  # fmt: skip
    o64, S64 = rwkv6_loop(*(leaves64[n] for n in "qkvgu"), leaves64["S0"])
    for name, a, b in (("o", o, o64), ("S", S, S64)):
        assert_agrees(name, a.detach(), b.detach(), max(rms(o64.detach()), rms(S64.detach())))
    found = gradients([o, S], leaves, seed=3)
    expected = gradients([o64, S64], leaves64, seed=3)
    magnitude = max(rms(e) for e in expected.values())
    for n in expected:
        assert_agrees(f"d{n}", found[n], expected[n], magnitude)


@pytest.mark.parametrize("mode,C", [("recurrent", 64), ("parallel", 64), ("chunk", 3)])
def test_gradcheck_and_gradgradcheck(mode, C):
    x = _inputs(B=1, T=7, H=1, HV=2, K=3, V=2, seed=1)
    names = ("q", "k", "v", "g", "u", "S0")
    leaves = [x[n].clone().requires_grad_() for n in names]

    def f(q, k, v, g, u, S0):
        return rwkv6(q, k, v, g, u, mode=mode, chunk_size=C, initial_state=S0,
                     output_final_state=True)  # fmt: skip

    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradgradcheck(f, leaves)


def test_no_decay_with_unit_bonus_is_linear_attention():
    """g None: S_{t-1} + k_t v_t^T = S_t, so u = 1 reads what linear attention reads, and u = 0
    reads one term less, scale (q_t . k_t) v_t."""
    x = _inputs(gate=None)
    common = dict(scale=0.5, initial_state=x["S0"], output_final_state=True)
    ones = torch.ones_like(x["u"])
    o, S = rwkv6(x["q"], x["k"], x["v"], None, ones, **common)
    o_la, S_la = linear_attention(x["q"], x["k"], x["v"], **common)
    _close((o, S), (o_la, S_la))
    o0, _ = rwkv6(x["q"], x["k"], x["v"], None, torch.zeros_like(x["u"]), **common)
    qk = (x["q"] * x["k"]).sum(-1).repeat_interleave(2, 2)  # [B, T, HV]
    _close((o0,), (o_la - 0.5 * qk.unsqueeze(-1) * x["v"],))


@pytest.mark.parametrize("mode,C", MODES)
def test_zero_bonus_reads_the_state_before_the_token(mode, C):
    """u = 0: exclusive GLA, o_t = S_{t-1}^T (scale q_t), S_{t-1} from linear_attention's own
    final states of the prefixes (o_1 reads the initial state)."""
    x = _inputs(T=6)
    zero = torch.zeros_like(x["u"])
    o, _ = rwkv6(x["q"], x["k"], x["v"], x["g"], zero, mode=mode, chunk_size=C,
                 initial_state=x["S0"], scale=1.0)  # fmt: skip
    for t in range(6):
        _, S_prev = linear_attention(x["q"][:, :t], x["k"][:, :t], x["v"][:, :t], x["g"][:, :t],
                                     initial_state=x["S0"], output_final_state=True)  # fmt: skip
        q_t = x["q"][:, t].repeat_interleave(2, 1)
        _close((o[:, t],), (torch.einsum("bhk,bhkv->bhv", q_t, S_prev),))


# ---------------------------------------------------------------------------------------------
# The property suite's regions: its problems of the additive rule with a gate, plus a bonus u
# ---------------------------------------------------------------------------------------------


def _bonus(p, dtype):
    gen = torch.Generator().manual_seed(p.seed + 7)
    return torch.randn(p.H, p.K, generator=gen, dtype=torch.float64).to(p.dtype).to(dtype)


def _problems(gates):
    return problems(gates=gates, rules=("additive",)).map(lambda p: _replace(p, normalize=False))


def _call(p, form, x, u):
    return rwkv6(
        x["q"], x["k"], x["v"], x.get("g"), u, scale=p.scale,
        mode="chunk" if form.startswith("chunk") else form, chunk_size=p.chunk_size,
        initial_state=x.get("S0"), output_final_state=True, cu_seqlens=cu_seqlens(p),
    )  # fmt: skip


def _reference(p, x, u):
    bounds = None if p.lengths is None else cu_seqlens(p).tolist()
    return rwkv6_loop(x["q"], x["k"], x["v"], x.get("g"), u, x.get("S0"), scale=p.scale,
                      bounds=bounds)  # fmt: skip


def _forward_agrees(p, form):
    x = build(p, None).views
    u = _bonus(p, p.dtype)
    with loop(form):
        o, S = _call(p, form, x, u)
    o_ref, S_ref = _reference(p, {n: t.double() for n, t in x.items()}, u.double())
    magnitude = max(rms(o_ref), rms(S_ref))
    assert o.dtype == p.dtype
    assert_agrees("o", o, o_ref, magnitude)
    assert_agrees("final_state", S, S_ref, magnitude)


def _gradients_agree(p, form):
    x = build(p, None, grad=True)
    inputs = {**x.views, "u": _bonus(p, p.dtype).requires_grad_()}
    with loop(form):
        found = gradients(_call(p, form, x.views, inputs["u"]), inputs, p.seed)
    x64 = build(p, torch.float64, grad=True)
    inputs64 = {**x64.views, "u": _bonus(p, torch.float64).requires_grad_()}
    expected = gradients(_reference(p, x64.views, inputs64["u"]), inputs64, p.seed)
    magnitude = max((rms(e) for e in expected.values()), default=0.0)
    for n, e in expected.items():
        assert_agrees(f"d{n}", found[n], e, magnitude)


@pytest.mark.parametrize(("form", "gates", "profile"), regions("rwkv6-forward", FORMS, GATES))
def test_forward_with_any_gates(form, gates, profile):
    holds(profile, _problems(gates), lambda p: _forward_agrees(p, form))


@pytest.mark.parametrize(("form", "gates", "profile"), regions("rwkv6-gradients", FORMS, GATES))
def test_gradients_with_any_gates(form, gates, profile):
    holds(profile, _problems(gates), lambda p: _gradients_agree(p, form))


@st.composite
def _packed(draw):
    p = draw(_problems("gentle"))
    lengths = tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=4)))
    p = _replace(p, B=1, T=sum(lengths), lengths=lengths)
    return _replace(p, layouts=draw(layouts_of(p, "strided")))


@pytest.mark.parametrize(("form", "profile"), regions("rwkv6-packed", FORMS))
def test_packed_sequences_with_any_layout(form, profile):
    holds(profile, _packed(), lambda p: (_forward_agrees(p, form), _gradients_agree(p, form)))


# ---------------------------------------------------------------------------------------------
# The generation step, and the checks
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prefill_then_steps_equal_one_forward_pass(dtype):
    """rwkv6 on a prefix, then recurrent_step(bonus=u) token by token (the fused C++ step for
    float32), gives the outputs and the state of one call on the whole sequence."""
    x = _inputs(T=9, dtype=dtype)
    o, S = rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], initial_state=x["S0"],
                 output_final_state=True)  # fmt: skip
    _, state = rwkv6(x["q"][:, :4], x["k"][:, :4], x["v"][:, :4], x["g"][:, :4], x["u"],
                     initial_state=x["S0"], output_final_state=True)  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for t in range(4, 9):
        o_t = recurrent_step(state, x["q"][:, t], x["k"][:, t], x["v"][:, t], g=x["g"][:, t],
                             bonus=x["u"])  # fmt: skip
        _close((o_t,), (o[:, t].double(),), tol)
    _close((state,), (S.double(),), tol)


def test_step_gradients_equal_the_sequence_op():
    x = _inputs(T=3, seed=2)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, S = rwkv6(*(leaves[n] for n in "qkvgu"), initial_state=leaves["S0"], output_final_state=True)
    expected = gradients([o, S], leaves, seed=5)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    state = leaves["S0"].clone()
    outs = [
        recurrent_step(
            state, *(leaves[n][:, t] for n in "qkv"), g=leaves["g"][:, t], bonus=leaves["u"]
        )  # fmt: skip
        for t in range(3)
    ]
    found = gradients([torch.stack(outs, 1), state], leaves, seed=5)
    for n in expected:
        _close((found[n],), (expected[n],))


def _call_with(**changes):
    x = {**_inputs(T=5), **changes}
    return lambda: rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], initial_state=x["S0"])


@pytest.mark.parametrize(
    "name,change,error",
    [
        ("u", {"u": torch.zeros(3, 6, dtype=torch.float64)}, ValueError),
        ("u", {"u": torch.zeros(4, 6, 1, dtype=torch.float64)}, ValueError),
        ("u", {"u": torch.full((4, 6), float("nan"), dtype=torch.float64)}, ValueError),
        ("u", {"u": torch.zeros(4, 6, dtype=torch.int64)}, TypeError),
        ("u", {"u": None}, TypeError),
        ("g", {"g": torch.ones(2, 5, 4, 6, dtype=torch.float64)}, ValueError),
        ("g", {"g": torch.zeros(2, 5, 4, 5, dtype=torch.float64)}, ValueError),
        ("initial_state", {"S0": torch.zeros(2, 2, 6, 5, dtype=torch.float64)}, ValueError),
        ("v", {"v": torch.zeros(2, 5, 3, 5, dtype=torch.float64)}, ValueError),
    ],
)
def test_bad_input_is_refused_before_any_work(name, change, error):
    assert_no_work(_call_with(**change), error, name)


def test_step_refuses_a_bad_bonus_and_a_delta_rule_bonus():
    x = _inputs(T=1)
    state = x["S0"].clone()
    args = (state, x["q"][:, 0], x["k"][:, 0], x["v"][:, 0])
    with pytest.raises(ValueError, match="bonus"):
        recurrent_step(*args, bonus=torch.zeros(4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="bonus"):
        recurrent_step(*args, beta=torch.ones(2, 4, dtype=torch.float64), bonus=x["u"])
    assert torch.equal(state, x["S0"])  # refused before the state changed


@pytest.mark.parametrize("mode,C", [("chunk", 4), ("recurrent", 64)])
def test_the_blocked_bonus_equals_the_token_loop(monkeypatch, mode, C):
    """Sequences longer than ``BONUS_BLOCK`` compute the bonus in blocks: forward, gradients and
    second derivatives as the token loop (blocks of 3 tokens here, T = 10)."""
    monkeypatch.setattr(importlib.import_module("linattn.ops._bonus"), "BONUS_BLOCK", 3)
    x = _inputs(B=1, T=10, H=1, HV=2, K=3, V=2, seed=4)
    names = ("q", "k", "v", "g", "u", "S0")
    leaves = [x[n].clone().requires_grad_() for n in names]

    def f(q, k, v, g, u, S0):
        return rwkv6(q, k, v, g, u, mode=mode, chunk_size=C, initial_state=S0,
                     output_final_state=True)  # fmt: skip

    _close(f(*leaves), rwkv6_loop(*leaves[:5], leaves[5]))
    assert torch.autograd.gradcheck(f, leaves)
    assert torch.autograd.gradgradcheck(f, leaves)


@pytest.mark.parametrize("B,T,H", [(0, 5, 2), (2, 0, 2), (2, 5, 0), (2, 1, 2)])
@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
def test_empty_and_one_token_inputs(B, T, H, mode):
    x = _inputs(B=B, T=T, H=H, HV=2 * H, seed=5)
    o, S = rwkv6(x["q"], x["k"], x["v"], x["g"], x["u"], mode=mode, initial_state=x["S0"],
                 output_final_state=True)  # fmt: skip
    _close((o, S), rwkv6_loop(x["q"], x["k"], x["v"], x["g"], x["u"], x["S0"]))


@pytest.mark.parametrize("bounds", [[0, 1, 2, 3], [0, 1, 4, 5]])
@pytest.mark.parametrize("mode,C", [("chunk", 2), ("recurrent", 64)])
def test_packed_one_token_sequences_keep_their_initial_state(bounds, mode, C):
    """A sequence of one token has no pair of a read and an earlier write: it reads its initial
    state, and its final state is that state decayed plus its write (none of it runs empty)."""
    x = _inputs(B=1, T=bounds[-1], seed=6)
    gen = torch.Generator().manual_seed(7)
    S0 = torch.randn(len(bounds) - 1, 4, 6, 5, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x["q"], x["k"], x["v"], x["g"], x["u"], S0)]

    def f(q, k, v, g, u, S0):
        return rwkv6(q, k, v, g, u, mode=mode, chunk_size=C, initial_state=S0,
                     output_final_state=True, cu_seqlens=torch.tensor(bounds))  # fmt: skip

    _close(f(*leaves), rwkv6_loop(*leaves, bounds=bounds))
    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize("gate", ["channel", "head", None])
@pytest.mark.parametrize("with_S0", [True, False])
@pytest.mark.parametrize("outputs", ["both", "o", "S"])
def test_the_fused_path_equals_the_float64_loop(monkeypatch, gate, with_S0, outputs):
    """float32 on the CPU, the chunk form: the fused loop on q one token earlier, the reads moved
    into place with the bonus in blocks (3 tokens here) and the backward likewise, with grouped
    value heads, every gate, with and without an initial state, and either output unused."""
    monkeypatch.setattr(importlib.import_module("linattn.ops._bonus"), "BONUS_BLOCK", 3)
    x = _inputs(B=2, T=23, H=1, HV=2, K=8, V=4, gate=gate, seed=8, dtype=torch.float32)
    x["S0"] = x["S0"] if with_S0 else None
    names = [n for n in ("q", "k", "v", "g", "u", "S0") if x[n] is not None]
    leaves = {n: x[n].clone().requires_grad_() for n in names}
    leaves64 = {n: x[n].double().requires_grad_() for n in names}

    def pick(o, S):
        return {"both": [o, S], "o": [o], "S": [S]}[outputs]

    o, S = rwkv6(*(leaves.get(n) for n in "qkvgu"), chunk_size=4,
                 initial_state=leaves.get("S0"), output_final_state=True)  # fmt: skip
    if _native.available():  # the fused path ran (else the paired composite, checked alike)
        assert "_FusedRWKV6" in type(o.grad_fn).__name__
    o64, S64 = rwkv6_loop(*(leaves64.get(n) for n in "qkvgu"), leaves64.get("S0"))
    for name, a, b in (("o", o, o64), ("S", S, S64)):
        assert_agrees(name, a.detach(), b.detach(), rms(b.detach()))
    found = gradients(pick(o, S), leaves, seed=3)
    expected = gradients(pick(o64, S64), leaves64, seed=3)
    magnitude = max(rms(e) for e in expected.values())
    for n in expected:
        assert_agrees(f"d{n}", found[n], expected[n], magnitude)


def test_the_fused_path_without_a_gradient_and_its_double_backward():
    """The fused path under no_grad gives the same outputs; its second derivatives (through the
    composite, ``create_graph=True``) equal the float64 loop's."""
    x = _inputs(B=1, T=9, H=2, HV=2, K=4, V=3, seed=9, dtype=torch.float32)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items()}
    leaves64 = {n: t.double().requires_grad_() for n, t in x.items()}
    args = [leaves[n] for n in "qkvgu"]
    o, S = rwkv6(*args, chunk_size=4, initial_state=leaves["S0"], output_final_state=True)
    with torch.no_grad():
        o_, S_ = rwkv6(*args, chunk_size=4, initial_state=leaves["S0"], output_final_state=True)
    assert torch.equal(o, o_) and torch.equal(S, S_)
    o64, S64 = rwkv6_loop(*(leaves64[n] for n in "qkvgu"), leaves64["S0"])
    first = gradients([o, S], leaves, seed=5, create_graph=True)
    first64 = gradients([o64, S64], leaves64, seed=5, create_graph=True)
    found = gradients([first["q"], first["g"]], leaves, seed=6)
    expected = gradients([first64["q"], first64["g"]], leaves64, seed=6)
    magnitude = max(rms(e) for e in expected.values())
    for n in expected:
        assert_agrees(f"d2 {n}", found[n], expected[n], magnitude)


@pytest.mark.parametrize("schedule", ["fused", "split"])
@pytest.mark.parametrize("gate", ["channel", "head", None])
def test_the_fused_path_on_either_schedule_with_resets(monkeypatch, schedule, gate):
    """The C++ loop's two schedules (``LINATTN_SCHEDULE``), with a reset (-inf) and a steep gate
    inside a chunk and at a chunk's first token, chunks of 5 with a partial last one."""
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    x = _inputs(B=1, T=17, H=2, HV=4, K=8, V=4, gate=gate, seed=10, dtype=torch.float32)
    if x["g"] is not None:
        x["g"][:, 3] = -torch.inf
        x["g"][:, 5] = -30.0
        x["g"][:, 10] = -torch.inf
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t is not None}
    leaves64 = {n: t.double().requires_grad_() for n, t in leaves.items()}
    o, S = rwkv6(*(leaves.get(n) for n in "qkvgu"), chunk_size=5, initial_state=leaves["S0"],
                 output_final_state=True)  # fmt: skip
    o64, S64 = rwkv6_loop(*(leaves64.get(n) for n in "qkvgu"), leaves64["S0"])
    for name, a, b in (("o", o, o64), ("S", S, S64)):
        assert_agrees(name, a.detach(), b.detach(), rms(b.detach()))
    found = gradients([o, S], leaves, seed=2)
    expected = gradients([o64, S64], leaves64, seed=2)
    magnitude = max(rms(e) for e in expected.values())
    for n in expected:
        assert_agrees(f"d{n}", found[n], expected[n], magnitude)


@pytest.mark.skipif(not _native.available(), reason="the fused C++ loop is unavailable")
def test_the_kernels_bonus_is_checked():
    """chunk_forward's bonus: the additive rule's alone, of shape [HV, K], float32 on the CPU."""
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    v, S0 = torch.randn(1, 2, 5, 3), torch.zeros(1, 2, 4, 3)
    run = _native.kernel("chunk_forward")
    args = (q, k, v, None, None, S0, 0.5, 4, False)
    o, _, _ = run(*args, "additive", "none", bonus=torch.zeros(2, 4))
    assert o.shape == (1, 2, 5, 3)
    for rule, beta, u, match in [
        ("additive", None, torch.zeros(2, 3), "bonus must be of shape"),
        ("additive", None, torch.zeros(2, 4, dtype=torch.float64), "bonus must be float32"),
        ("delta", torch.rand(1, 2, 5), torch.zeros(2, 4), "bonus is not an option of the delta"),
    ]:
        with pytest.raises(RuntimeError, match=match):
            run(q, k, v, beta, None, S0, 0.5, 4, False, rule, "none", bonus=u)
