"""The generalized delta rule's named forms (ops.dplr_family: Comba, RWKV-7, Gated DeltaNet-2)
against literal float64 token loops of each mechanism's own recurrence, in every form; their
reductions to the delta rule and KDA; gradcheck; their checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.ops import comba, delta_rule, gated_deltanet2, rwkv7

FORMS = [("recurrent", 64), ("parallel", 64), ("chunk", 1), ("chunk", 5), ("chunk", 16)]
TOL = 1e-12


def _inputs(B=2, T=19, H=2, HV=4, K=6, V=5, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    return {
        "q": randn(B, T, H, K), "k": F.normalize(randn(B, T, H, K), dim=-1),
        "p": F.normalize(randn(B, T, H, K), dim=-1), "v": randn(B, T, HV, V),
        "beta": rand(B, T, HV), "g": F.logsigmoid(randn(B, T, HV)),
        "gk": F.logsigmoid(randn(B, T, HV, K)), "erase": rand(B, T, HV, K),
        "write": rand(B, T, HV, V), "kk": F.normalize(randn(B, T, HV, K), dim=-1),
        "a_scale": rand(B, T, HV, K), "S0": randn(B, HV, K, V),
    }  # fmt: skip


def _loop(step, q, S0, T, scale):
    """o_t = S_t^T (scale q_t) with S_t = step(t, S_{t-1}); q [B, T, HV, K]."""
    S, outs = S0.clone(), []
    for t in range(T):
        S = step(t, S)
        outs.append(torch.einsum("bhk,bhkv->bhv", scale * q[:, t], S))
    return torch.stack(outs, 1), S


def _heads(x, HV):
    return x.repeat_interleave(HV // x.shape[2], 2)


def comba_loop(x, scale):
    """u_t = beta_t (v_t - S_{t-1}^T p_t); S_t = exp(g_t) S_{t-1} + k_t u_t^T."""
    HV = x["v"].shape[2]
    k, p = _heads(x["k"], HV), _heads(x["p"], HV)

    def step(t, S):
        u = x["beta"][:, t, :, None] * (x["v"][:, t] - torch.einsum("bhk,bhkv->bhv", p[:, t], S))
        return x["g"][:, t, :, None, None].exp() * S + k[:, t, :, :, None] * u[:, :, None]

    return _loop(step, _heads(x["q"], HV), x["S0"], x["q"].shape[1], scale)


def gdn2_loop(x, scale):
    """S_t = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1} + k_t (w_t * v_t)^T."""
    HV = x["v"].shape[2]
    k = _heads(x["k"], HV)

    def step(t, S):
        S = x["gk"][:, t, :, :, None].exp() * S
        erase = torch.einsum("bhk,bhkv->bhv", x["erase"][:, t] * k[:, t], S)
        new = x["write"][:, t] * x["v"][:, t] - erase
        return S + k[:, t, :, :, None] * new[:, :, None]

    return _loop(step, _heads(x["q"], HV), x["S0"], x["q"].shape[1], scale)


def rwkv7_loop(r, w, k, v, a, b, S0, scale):
    """S_t = Diag(exp w_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T (RWKV-7's names)."""

    def step(t, S):
        read = torch.einsum("bhk,bhkv->bhv", a[:, t], S)
        return (
            w[:, t, :, :, None].exp() * S
            + b[:, t, :, :, None] * read[:, :, None]
            + k[:, t, :, :, None] * v[:, t, :, None, :]
        )

    return _loop(step, r, S0, r.shape[1], scale)


def _rwkv7_inputs(x):
    """One head count (H = HV = 4), RWKV-7's a = -kk, b = kk * a_scale, w = -exp(-0.5) sigmoid."""
    w = -torch.exp(torch.tensor(-0.5, dtype=torch.float64)) * torch.sigmoid(x["gk"] * 3)
    r, k = _heads(x["q"], 4), _heads(x["k"], 4)
    return r, w, k, x["v"], -x["kk"], x["kk"] * x["a_scale"]


def _close(got, want, tol=TOL):
    for a, b in zip(got, want, strict=True):
        scale = max(float(b.abs().max()), 1.0)
        assert float((a - b).abs().max()) <= tol * scale


@pytest.mark.parametrize("mode,C", FORMS)
def test_comba_equals_its_recurrence(mode, C):
    x = _inputs()
    got = comba(x["q"], x["k"], x["v"], x["p"], x["beta"], x["g"], mode=mode, chunk_size=C,
                initial_state=x["S0"], output_final_state=True, scale=0.7)  # fmt: skip
    _close(got, comba_loop(x, 0.7))


@pytest.mark.parametrize("mode,C", FORMS)
def test_gated_deltanet2_equals_its_recurrence(mode, C):
    x = _inputs()
    got = gated_deltanet2(x["q"], x["k"], x["v"], x["gk"], x["erase"], x["write"], mode=mode,
                          chunk_size=C, initial_state=x["S0"], output_final_state=True)  # fmt: skip
    _close(got, gdn2_loop(x, x["q"].shape[-1] ** -0.5))


@pytest.mark.parametrize("mode,C", FORMS)
def test_rwkv7_equals_its_recurrence(mode, C):
    x = _inputs()
    r, w, k, v, a, b = _rwkv7_inputs(x)
    got = rwkv7(r, w, k, v, a, b, mode=mode, chunk_size=C, initial_state=x["S0"],
                output_final_state=True)  # fmt: skip
    _close(got, rwkv7_loop(r, w, k, v, a, b, x["S0"], scale=1.0))  # RWKV-7's scale: 1.0


@pytest.mark.parametrize("gate", [None, "g"])
def test_comba_with_p_equal_k_and_no_gate_is_the_delta_rule(gate):
    """p = k: S_t = (alpha_t I - beta_t k_t k_t^T) S_{t-1} + ...; with g None the delta rule."""
    x = _inputs()
    g = None if gate is None else x["g"]
    got = comba(x["q"], x["k"], x["v"], x["k"], x["beta"], g, initial_state=x["S0"],
                output_final_state=True, chunk_size=5)  # fmt: skip
    if gate is None:
        want = delta_rule(x["q"], x["k"], x["v"], x["beta"], initial_state=x["S0"],
                          output_final_state=True)  # fmt: skip
    else:
        want = comba_loop({**x, "p": x["k"]}, x["q"].shape[-1] ** -0.5)
    _close(got, want)


def test_gated_deltanet2_with_beta_gates_is_kda():
    """b = beta on every key channel and w = beta on every value channel: KDA."""
    x = _inputs()
    K, V = x["q"].shape[-1], x["v"].shape[-1]
    beta = x["beta"][..., None]
    got = gated_deltanet2(x["q"], x["k"], x["v"], x["gk"], beta.expand(-1, -1, -1, K),
                          beta.expand(-1, -1, -1, V), initial_state=x["S0"],
                          output_final_state=True, chunk_size=5)  # fmt: skip
    want = delta_rule(x["q"], x["k"], x["v"], x["beta"], x["gk"], initial_state=x["S0"],
                      output_final_state=True)  # fmt: skip
    _close(got, want)


def test_resets_and_empty_sequences():
    """g = -inf (a reset, exp(g) = 0 exactly in b = exp(g) * b * k too) and T = 0."""
    x = _inputs(T=9)
    x["gk"][:, 4] = float("-inf")
    got = gated_deltanet2(x["q"], x["k"], x["v"], x["gk"], x["erase"], x["write"],
                          initial_state=x["S0"], output_final_state=True, chunk_size=4)  # fmt: skip
    _close(got, gdn2_loop(x, x["q"].shape[-1] ** -0.5))
    e = _inputs(T=0)
    o, S = comba(e["q"], e["k"], e["v"], e["p"], e["beta"], e["g"], initial_state=e["S0"],
                 output_final_state=True)  # fmt: skip
    assert o.shape == e["v"].shape and torch.equal(S, e["S0"])


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_gradcheck(mode):
    x = _inputs(B=1, T=5, H=1, HV=2, K=3, V=2)
    names = ("q", "k", "v", "p", "beta", "g", "S0")
    leaves = [x[n].clone().requires_grad_() for n in names]

    def f(q, k, v, p, beta, g, S0):
        return comba(q, k, v, p, beta, g, mode=mode, chunk_size=2, initial_state=S0,
                     output_final_state=True)  # fmt: skip

    assert torch.autograd.gradcheck(f, leaves)
    names = ("q", "k", "v", "gk", "erase", "write", "S0")
    leaves = [x[n].clone().requires_grad_() for n in names]

    def h(q, k, v, g, b, w, S0):
        return gated_deltanet2(q, k, v, g, b, w, mode=mode, chunk_size=2, initial_state=S0,
                               output_final_state=True)  # fmt: skip

    assert torch.autograd.gradcheck(h, leaves)


def test_checks_name_the_argument():
    x = _inputs()
    with pytest.raises(ValueError, match="p must have k's shape"):
        comba(x["q"], x["k"], x["v"], x["p"][:, :, :1], x["beta"], x["g"])
    with pytest.raises(ValueError, match="beta must have shape"):
        comba(x["q"], x["k"], x["v"], x["p"], x["beta"][:, :, :2], x["g"])
    with pytest.raises(ValueError, match=r"w must have shape \[B, T, HV, V\]"):
        gated_deltanet2(x["q"], x["k"], x["v"], x["gk"], x["erase"], x["write"][..., :2])
    r, w, k, v, a, b = _rwkv7_inputs(x)
    with pytest.raises(ValueError, match=r"b must have shape \[B, T, H, K\]"):
        rwkv7(r, w, k, v, a, b[..., :2])
    with pytest.raises(ValueError, match=r"w must have shape \[B, T, H, K\]"):
        rwkv7(r, w[..., 0], k, v, a, b)
    with pytest.raises(ValueError, match="g is a log-decay"):
        gated_deltanet2(x["q"], x["k"], x["v"], -x["gk"], x["erase"], x["write"])


def test_errors_name_the_argument_folded_into_another():
    """beta (Comba), b and w (GDN-2) and RWKV-7's w are folded into the generalized rule's own
    inputs: each is checked under its own name first (NaN, range, shape), and another dtype is
    converted as the delta rule's beta is, not reported as q, k, v's."""
    x = _inputs()
    q, k, v, p, g = x["q"], x["k"], x["v"], x["p"], x["g"]
    nan = x["beta"].clone()
    nan[0, 3, 1] = torch.nan
    with pytest.raises(ValueError, match="beta contains non-finite"):
        comba(q, k, v, p, nan, g)
    for bad in (5.0, -3.0):  # Comba with p = k, g None is the delta rule: beta in [0, 2]
        with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
            comba(q, k, v, p, torch.full_like(x["beta"], bad), g)
    f32 = {n: t.float() for n, t in x.items()}
    o, _ = comba(f32["q"], f32["k"], f32["v"], f32["p"], x["beta"], f32["g"])  # float64 beta
    want, _ = comba(f32["q"], f32["k"], f32["v"], f32["p"], f32["beta"], f32["g"])
    assert o.dtype == torch.float32 and torch.equal(o, want)
    args = (f32["q"], f32["k"], f32["v"], f32["gk"])
    o, _ = gated_deltanet2(*args, x["erase"], x["write"])  # float64 b and w
    assert torch.equal(o, gated_deltanet2(*args, f32["erase"], f32["write"])[0])
    nan = x["write"].clone()
    nan[1, 2, 3, 0] = torch.inf
    with pytest.raises(ValueError, match="w contains non-finite"):
        gated_deltanet2(q, k, v, x["gk"], x["erase"], nan)
    r, w, k, v, a, b = _rwkv7_inputs(x)
    for bad, message in ((-w, "w is a log-decay"), (w * torch.nan, "w contains NaN")):
        with pytest.raises(ValueError, match=message):
            rwkv7(r, bad, k, v, a, b)
    with pytest.raises(TypeError, match="w must be a torch.Tensor, got list"):
        rwkv7(r, w.tolist(), k, v, a, b)
    nan = r.clone()
    nan[0, 1, 0, 0] = torch.nan
    with pytest.raises(ValueError, match="r contains non-finite"):
        rwkv7(nan, w, k, v, a, b)
    with pytest.raises(TypeError, match="w must be a torch.Tensor, got NoneType"):
        rwkv7(r, None, k, v, a, b)
