"""Grouped value heads (HV = G * H) in the public ops: every form, the step and the gradients.

Value head j of v, beta, g and the state pairs with q/k head j // G (Qwen3-Next, Qwen3.5). The
oracle below runs each value head with its q/k head picked by index, one head at a time.
"""

from __future__ import annotations

import pytest
import torch

from linattn.ops import delta_rule, linear_attention, recurrent_step

from .cases import oracle

B, T, H, G, K, V = 2, 19, 2, 3, 4, 3
HV = G * H
MODES = [("recurrent", 64), ("parallel", 64), ("chunk", 1), ("chunk", 5), ("chunk", 64)]
GATES = [None, "scalar", "channel"]


def inputs(gate, delta, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    k = randn(B, T, H, K)
    x = {"q": randn(B, T, H, K), "k": k / k.norm(dim=-1, keepdim=True), "v": randn(B, T, HV, V)}
    x["beta"] = 2 * torch.rand(B, T, HV, generator=gen, dtype=torch.float64) if delta else None
    shape = {None: None, "scalar": (B, T, HV), "channel": (B, T, HV, K)}[gate]
    x["g"] = None if shape is None else torch.nn.functional.logsigmoid(randn(*shape) + 2.0)
    x["S0"] = randn(B, HV, K, V)
    return {n: None if t is None else t.to(dtype) for n, t in x.items()}


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
