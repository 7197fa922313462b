"""Grouped value heads (HV = G * H) in the public ops: every form, the step and the gradients.

Value head j of v, beta, g and the state pairs with q/k head j // G (Qwen3-Next, Qwen3.5). The
oracle below runs each value head with its q/k head picked by index, one head at a time.
"""

from __future__ import annotations

import os

import pytest
import torch

from linattn.ops import _native, delta_rule, linear_attention, recurrent_step

from .cases import oracle

B, T, H, G, K, V = 2, 19, 2, 3, 4, 3
HV = G * H
MODES = [("recurrent", 64), ("parallel", 64), ("chunk", 1), ("chunk", 5), ("chunk", 64)]
GATES = [None, "scalar", "channel"]


def inputs(gate, delta, seed=0, dtype=torch.float64):
    """The module's case: ``grouped_inputs`` with G value heads per q/k head."""
    return grouped_inputs(G, gate, delta, H=H, T=T, dtype=dtype, seed=seed)


def paired(x):
    """q, k of each value head j: q/k head j // G, picked by index."""
    heads = torch.tensor([j // G for j in range(HV)])
    return x["q"].index_select(2, heads), x["k"].index_select(2, heads)


def expected(x, rule):
    q, k = paired(x)
    return oracle(q, k, x["v"], x["beta"], x["g"], x["S0"], rule=rule, scale=0.5)


def call(x, mode, C, delta, **kw):
    common = dict(scale=0.5, mode=mode, chunk_size=C, output_final_state=True, **kw)
    if delta:
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], **common)
    return linear_attention(x["q"], x["k"], x["v"], x["g"], **common)


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("mode,C", MODES)
def test_every_form_matches_the_float64_oracle(mode, C, gate, delta):
    x = inputs(gate, delta)
    o, S = call(x, mode, C, delta, initial_state=x["S0"])
    o_ref, S_ref = expected(x, "delta" if delta else "additive")
    assert o.shape == (B, T, HV, V) and S.shape == (B, HV, K, V)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
def test_packed_sequences_and_normaliser(delta):
    x = inputs("scalar", delta)
    x = {n: None if t is None else t[:1] for n, t in x.items()}
    x["S0"] = torch.cat([x["S0"], x["S0"].flip(1)])  # [2, HV, K, V]: one per sequence
    cu = torch.tensor([0, 7, T])
    o, S = call(x, "chunk", 4, delta, initial_state=x["S0"], cu_seqlens=cu)
    for n, (s, e) in enumerate([(0, 7), (7, T)]):
        part = {m: None if t is None else t[:, s:e] for m, t in x.items()}
        part["S0"] = x["S0"][n : n + 1]
        o_ref, S_ref = expected(part, "delta" if delta else "additive")
        torch.testing.assert_close(o[:, s:e], o_ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(S[n : n + 1], S_ref, rtol=1e-10, atol=1e-10)
    if not delta:  # normalize: the normaliser column runs per value head too
        y = {**x, "q": x["q"].abs(), "k": x["k"].abs(), "S0": None}
        o, _ = call(y, "chunk", 4, False, normalize=True)
        q, k = paired(y)
        num, _ = linear_attention(q, k, y["v"], y["g"], scale=0.5, mode="recurrent")
        den, _ = linear_attention(q, k, torch.ones_like(y["v"][..., :1]), y["g"], scale=0.5)
        torch.testing.assert_close(o, num / den, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
@pytest.mark.parametrize("mode,C", [("recurrent", 64), ("parallel", 64), ("chunk", 5)])
def test_gradients_sum_over_the_group(mode, C, delta):
    """dq, dk of a q/k head are the sums over its G value heads: the grouped call's gradients
    equal those of the same call on q, k picked per value head (index_select's backward sums)."""
    x = inputs("channel", delta)
    leaves = {n: t.requires_grad_() for n, t in x.items() if t is not None}
    o, S = call(x, mode, C, delta, initial_state=x["S0"])
    w = torch.randn_like(o)
    grads = torch.autograd.grad((o * w).sum() + S.sum(), list(leaves.values()))
    q, k = paired(x)
    args = dict(scale=0.5, mode="recurrent", initial_state=x["S0"], output_final_state=True)
    if delta:
        o2, S2 = delta_rule(q, k, x["v"], x["beta"], x["g"], **args)
    else:
        o2, S2 = linear_attention(q, k, x["v"], x["g"], **args)
    want = torch.autograd.grad((o2 * w).sum() + S2.sum(), list(leaves.values()))
    for name, a, b in zip(leaves, grads, want, strict=True):
        assert a.shape == leaves[name].shape
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)


def test_gradcheck_chunk_form():
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 5, 1, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 5, 2, 2, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, 5, 2, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, 5, 2, 3, generator=gen, dtype=torch.float64)
    args = [t.requires_grad_() for t in (q, k, v, beta, g)]

    def f(*a):
        return delta_rule(*a, mode="chunk", chunk_size=2, output_final_state=True)

    assert torch.autograd.gradcheck(f, args)


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_step_matches_the_oracle(gate, delta, dtype):
    x = inputs(gate, delta, dtype=dtype)
    state = x["S0"].clone()
    outs = []
    for t in range(4):
        tok = {n: None if n == "S0" or v is None else v[:, t] for n, v in x.items()}
        outs.append(
            recurrent_step(state, tok["q"], tok["k"], tok["v"], tok["beta"], tok["g"], scale=0.5)
        )
    part = {n: None if v is None else (v if n == "S0" else v[:, :4]) for n, v in x.items()}
    o_ref, S_ref = expected(part, "delta" if delta else "additive")
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(torch.stack(outs, 1).double(), o_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(state.double(), S_ref, rtol=tol, atol=tol)


def test_step_gradients_sum_over_the_group():
    x = inputs("scalar", True)
    q, k = x["q"][:, 0].requires_grad_(), x["k"][:, 0].requires_grad_()
    v, beta, g = x["v"][:, 0], x["beta"][:, 0], x["g"][:, 0]
    o = recurrent_step(x["S0"].clone(), q, k, v, beta, g)
    dq, dk = torch.autograd.grad(o.sum(), (q, k))
    heads = torch.tensor([j // G for j in range(HV)])
    qe, ke = q.detach().requires_grad_(), k.detach().requires_grad_()
    o2 = recurrent_step(x["S0"].clone(), qe[:, heads], ke[:, heads], v, beta, g)
    dq2, dk2 = torch.autograd.grad(o2.sum(), (qe, ke))
    torch.testing.assert_close(o, o2, rtol=0, atol=0)
    torch.testing.assert_close(dq, dq2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dk, dk2, rtol=1e-12, atol=1e-12)


def test_value_heads_must_be_a_multiple_of_the_query_heads():
    x = inputs("scalar", True)
    v = x["v"][:, :, :5]  # HV = 5, H = 2
    with pytest.raises(ValueError, match=r"v must have shape \[B, T, HV, V\].*multiple of H = 2"):
        delta_rule(x["q"], x["k"], v, x["beta"][:, :, :5])
    with pytest.raises(ValueError, match="multiple of H = 2"):
        linear_attention(x["q"], x["k"], v)
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, H\] = \(2, 19, 6\)"):
        delta_rule(x["q"], x["k"], x["v"], x["beta"][:, :, :H])
    with pytest.raises(ValueError, match="q must have shape"):
        recurrent_step(x["S0"][:, :5].clone(), x["q"][:, 0], x["k"][:, 0], x["v"][:, 0, :5])


# -- grouped value heads read in place: every form and backend, G in {1, 2, 4} ------------------

MECHANISMS = [(d, g) for d in (False, True) for g in GATES]
MECH_IDS = [f"{'delta' if d else 'linear'}-{g}" for d, g in MECHANISMS]
# (mode, chunk_size, dtype, LINATTN_NATIVE): the fused C++ chunk form (float32 CPU), the PyTorch
# group loop in float32 and float64, the parallel form and the recurrent form.
FORMS = [
    pytest.param("chunk", 8, torch.float32, "1", id="chunk-fused"),
    pytest.param("chunk", 8, torch.float32, "0", id="chunk-loop"),
    pytest.param("chunk", 5, torch.float64, "1", id="chunk-float64"),
    pytest.param("parallel", 64, torch.float64, "1", id="parallel"),
    pytest.param("recurrent", 64, torch.float64, "1", id="recurrent"),
]


def grouped_inputs(groups, gate, delta, *, H=2, T=19, dtype=torch.float64, seed=1):
    """[B, T, H, K] q, k and [B, T, G H, ...] v, beta, g, S0, as ``inputs`` with G = groups."""
    gen = torch.Generator().manual_seed(seed)
    HV = groups * H

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    k = randn(B, T, H, K)
    x = {"q": randn(B, T, H, K), "k": k / k.norm(dim=-1, keepdim=True), "v": randn(B, T, HV, V)}
    x["beta"] = 2 * torch.rand(B, T, HV, generator=gen, dtype=torch.float64) if delta else None
    shape = {None: None, "scalar": (B, T, HV), "channel": (B, T, HV, K)}[gate]
    x["g"] = None if shape is None else torch.nn.functional.logsigmoid(randn(*shape) + 2.0)
    x["S0"] = randn(B, HV, K, V)
    return {n: None if t is None else t.to(dtype) for n, t in x.items()}


def repeated(x, groups):
    """The oracle's inputs: q, k repeated G times (value head j with q/k head j // G)."""
    return {**x, "q": x["q"].repeat_interleave(groups, 2), "k": x["k"].repeat_interleave(groups, 2)}


def run(x, mode, C, delta, **kw):
    o, S = call(x, mode, C, delta, initial_state=x["S0"], **kw)
    return o, S


def loss_and_grads(x, mode, C, delta, w_o, w_S):
    leaves = {n: t.detach().clone().requires_grad_() for n, t in x.items() if t is not None}
    o, S = run({**x, **leaves}, mode, C, delta)
    grads = torch.autograd.grad((o * w_o).sum() + (S * w_S).sum(), list(leaves.values()))
    return o, S, dict(zip(leaves, grads, strict=True))


@pytest.mark.parametrize(("delta", "gate"), MECHANISMS, ids=MECH_IDS)
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize(("mode", "C", "dtype", "native"), FORMS)
def test_every_form_and_group_size_forward_and_gradients(
    mode, C, dtype, native, groups, delta, gate, monkeypatch
):
    """o and S against the float64 oracle with q, k repeated; the gradients of q, k, v, beta, g
    and the initial state against the float64 recurrent form on the repeated q, k (autograd sums
    the copies' gradients: the gradient of a q/k head is the sum over its G value heads)."""
    monkeypatch.setenv("LINATTN_NATIVE", native)
    x = grouped_inputs(groups, gate, delta, dtype=dtype)
    rule = "delta" if delta else "additive"
    o_ref, S_ref = oracle(**{n: t for n, t in repeated(x, groups).items()}, rule=rule, scale=0.5)
    gen = torch.Generator().manual_seed(7)
    w_o = torch.randn(o_ref.shape, generator=gen, dtype=torch.float64)
    w_S = torch.randn(S_ref.shape, generator=gen, dtype=torch.float64)
    o, S, grads = loss_and_grads(x, mode, C, delta, w_o.to(dtype), w_S.to(dtype))
    x64 = {n: None if t is None else t.double() for n, t in x.items()}
    _, _, want = loss_and_grads(repeated(x64, groups), "recurrent", 64, delta, w_o, w_S)
    want["q"] = want["q"].unflatten(2, (-1, groups)).sum(3)  # the copies' sum: [B, T, H, K]
    want["k"] = want["k"].unflatten(2, (-1, groups)).sum(3)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    assert o.shape == o_ref.shape and S.shape == S_ref.shape
    torch.testing.assert_close(o.double(), o_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(S.double(), S_ref, rtol=tol, atol=tol)
    for name, grad in grads.items():
        assert grad.shape == x[name].shape, name
        torch.testing.assert_close(grad.double(), want[name], rtol=tol, atol=tol, msg=name)


def strided(x):
    """Each [B, T, heads, D] tensor as a view with a row stride of one fused projection (as a
    layer's split of [B, T, 3 H K + ...] gives), values unchanged."""
    out = {}
    for n, t in x.items():
        if t is None or n == "S0":
            out[n] = t
            continue
        wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 3, dtype=t.dtype) if t.dim() == 4 else None
        if wide is None:  # beta or a scalar g [B, T, HV]: a strided column of a wider tensor
            wide = torch.zeros(*t.shape, 2, dtype=t.dtype)
            wide[..., 1] = t
            out[n] = wide[..., 1]
        else:
            wide[..., 2 : 2 + t.shape[-1]] = t
            out[n] = wide[..., 2 : 2 + t.shape[-1]]
        assert not out[n].is_contiguous()
    return out


@pytest.mark.parametrize(("delta", "gate"), [(True, "scalar"), (True, "channel"), (False, None)])
@pytest.mark.parametrize("groups", [2, 4])
@pytest.mark.parametrize("native", ["1", "0"], ids=["fused", "loop"])
def test_packed_sequences_with_odd_strides(native, groups, delta, gate, monkeypatch):
    """cu_seqlens (B = 1) with q, k, v, beta, g as strided [B, T, H, D] views: each sequence as
    the oracle computes it alone from its own initial state, forward and gradients."""
    monkeypatch.setenv("LINATTN_NATIVE", native)
    x = grouped_inputs(groups, gate, delta, dtype=torch.float32, T=23)
    x = {n: None if t is None else t[:1] for n, t in x.items()}
    x["S0"] = torch.cat([x["S0"], x["S0"].flip(1), 0.5 * x["S0"]])  # one per sequence
    bounds = [(0, 6), (6, 15), (15, 23)]
    cu = torch.tensor([0, 6, 15, 23])
    y = {n: None if t is None else t.detach().requires_grad_() for n, t in strided(x).items()}
    o, S = call(y, "chunk", 4, delta, initial_state=y["S0"], cu_seqlens=cu)
    o.square().sum().add(S.sum()).backward()
    rule = "delta" if delta else "additive"
    for n, (s, e) in enumerate(bounds):
        part = {m: None if t is None else t[:, s:e] for m, t in repeated(x, groups).items()}
        part["S0"] = x["S0"][n : n + 1]
        o_ref, S_ref = oracle(**part, rule=rule, scale=0.5)
        torch.testing.assert_close(o[:, s:e].double(), o_ref, rtol=2e-4, atol=2e-4)
        torch.testing.assert_close(S[n : n + 1].double(), S_ref, rtol=2e-4, atol=2e-4)
    z = {n: None if t is None else t.detach().contiguous().requires_grad_() for n, t in y.items()}
    o2, S2 = call(z, "chunk", 4, delta, initial_state=z["S0"], cu_seqlens=cu)
    o2.square().sum().add(S2.sum()).backward()
    for name in y:
        if y[name] is not None:
            torch.testing.assert_close(y[name].grad, z[name].grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("delta", "gate"), MECHANISMS, ids=MECH_IDS)
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fused", "float64"])
def test_step_every_group_size(dtype, groups, delta, gate):
    """recurrent_step with q, k [B, H, K] and a state of G H heads (float32: the fused C++ step)
    against the oracle on repeated q, k, token by token."""
    x = grouped_inputs(groups, gate, delta, dtype=dtype)
    state = x["S0"].clone()
    outs = []
    for t in range(5):
        tok = {n: None if n == "S0" or v is None else v[:, t] for n, v in x.items()}
        outs.append(
            recurrent_step(state, tok["q"], tok["k"], tok["v"], tok["beta"], tok["g"], scale=0.5)
        )
    part = {n: None if v is None else (v if n == "S0" else v[:, :5]) for n, v in x.items()}
    o_ref, S_ref = oracle(
        **repeated(part, groups), rule="delta" if delta else "additive", scale=0.5
    )
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(torch.stack(outs, 1).double(), o_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(state.double(), S_ref, rtol=tol, atol=tol)


def _no_copies(monkeypatch):
    """Make every way of repeating q or k heads raise: the op's path must never take one."""

    def refuse(*args, **kwargs):
        raise AssertionError("repeat_interleave called on the op's path (a copy of q or k)")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    monkeypatch.setattr(torch, "repeat_interleave", refuse)


@pytest.mark.parametrize("native", ["1", "0"], ids=["fused", "loop"])
@pytest.mark.parametrize(
    ("mode", "dtype"),
    [
        ("chunk", torch.float32),
        ("chunk", torch.float64),
        ("parallel", torch.float64),
        ("recurrent", torch.float64),
    ],
)
def test_no_repeat_of_q_and_k_on_the_path(mode, dtype, native, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", native)
    x = grouped_inputs(4, "channel", True, dtype=dtype)
    leaves = {n: t.requires_grad_() for n, t in x.items()}
    _no_copies(monkeypatch)
    o, S = call(x, mode, 8, True, initial_state=x["S0"])
    (o.sum() + S.sum()).backward()
    assert leaves["q"].grad.shape == x["q"].shape
    with torch.no_grad():
        call(x, mode, 8, True, initial_state=x["S0"])
        step = {n: t[:, 0] for n, t in x.items() if n != "S0"}
        recurrent_step(x["S0"].detach().clone(), **step)


def _resident_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1])
    raise KeyError(key)


@pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="peak RSS reset is Linux-only"
)
def test_peak_memory_of_the_fused_forward_does_not_grow_with_g(monkeypatch):
    """G = 4, q and k 4 MiB each, v small: the fused forward's peak resident memory grows by less
    than one q (the old copies of q and k took 2 G = 8 times q: about 35 MB here)."""
    monkeypatch.setenv("LINATTN_NATIVE", "1")
    if not _native.available():
        pytest.skip(f"fused forward unavailable: {_native.reason()}")
    H_, T_, K_, V_, G_ = 2, 4096, 128, 8, 4
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, T_, H_, K_, generator=gen) for _ in range(2))
    v = torch.randn(1, T_, G_ * H_, V_, generator=gen)
    beta, g = torch.rand(1, T_, G_ * H_, generator=gen), -torch.rand(1, T_, G_ * H_, generator=gen)
    with torch.no_grad():
        small = grouped_inputs(G_, "scalar", True, dtype=torch.float32)  # load the extension
        call(small, "chunk", 8, True)
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # reset the peak (VmHWM) to the current resident size
        before = _resident_kib("VmRSS:")
        o, _ = delta_rule(q, k, v, beta, g, output_final_state=True)
        growth = (_resident_kib("VmHWM:") - before) * 1024
    assert o.shape == (1, T_, G_ * H_, V_)
    assert growth < q.numel() * q.element_size(), growth


def test_bad_grouped_shapes_name_the_argument():
    x = grouped_inputs(2, "channel", True)
    with pytest.raises(ValueError, match=r"g must be None, \[B, T, H\] = \(2, 19, 4\)"):
        delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"][:, :, :2])
    with pytest.raises(ValueError, match=r"initial_state must have shape"):
        delta_rule(x["q"], x["k"], x["v"], x["beta"], initial_state=x["S0"][:, :2])
    state = x["S0"].clone()
    tok = {n: t[:, 0] for n, t in x.items() if n != "S0"}
    with pytest.raises(ValueError, match=r"beta must have shape"):
        recurrent_step(state, tok["q"], tok["k"], tok["v"], tok["beta"][:, :2])
    with pytest.raises(ValueError, match=r"g must be None, \[B, H\] = \(2, 4\)"):
        recurrent_step(state, tok["q"], tok["k"], tok["v"], tok["beta"], tok["g"][:, :2])
    with pytest.raises(ValueError, match=r"k must have shape"):
        recurrent_step(state, tok["q"], tok["k"][:, :1], tok["v"], tok["beta"])
    with pytest.raises(ValueError, match=r"q must have shape \[B, Hq, K\] with Hq dividing"):
        recurrent_step(state[:, :3].clone(), tok["q"], tok["k"], tok["v"][:, :3])
    torch.testing.assert_close(state, x["S0"])  # refused before any work


@pytest.mark.skipif(not _native.available(), reason="the extension is not built")
def test_the_extension_refuses_value_heads_that_are_no_multiple():
    x = grouped_inputs(1, "scalar", True, dtype=torch.float32)
    q, k = (x[n].transpose(1, 2) for n in ("q", "k"))
    v, beta = x["v"].transpose(1, 2)[:, :1], x["beta"].transpose(1, 2)[:, :1]
    S0 = x["S0"][:, :1].contiguous()
    with pytest.raises(RuntimeError, match="must be a multiple of q's and k's H = 2"):
        torch.ops.linattn_native.chunk_forward(
            q, k, v, beta, None, S0, 0.5, 4, False, "delta", "none"
        )
    with pytest.raises(RuntimeError, match="Hq dividing the state's H = 3"):
        torch.ops.linattn_native.recurrent_step(
            torch.zeros(B, 3, K, V),
            q[:, :, 0].contiguous(),
            k[:, :, 0].contiguous(),
            torch.zeros(B, 3, V),
            None,
            None,
            0.5,
            "additive",
            "none",
        )


def test_double_backward_with_grouped_value_heads():
    """create_graph=True (the all-blocks form's plain autograd) with G = 2: gradgradcheck."""
    gen = torch.Generator().manual_seed(5)
    q, k = (torch.randn(1, 5, 1, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, 5, 2, 2, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, 5, 2, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, 5, 2, generator=gen, dtype=torch.float64)
    args = [t.requires_grad_() for t in (q, k, v, beta, g)]

    def f(*a):
        return delta_rule(*a, mode="chunk", chunk_size=2, output_final_state=True)

    assert torch.autograd.gradgradcheck(f, args)
