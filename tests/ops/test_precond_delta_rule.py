"""linattn.ops.precond_delta_rule (Preconditioned DeltaNet): every form against the
float64 token loop of ``linattn.reference.precond_delta`` with grouped value heads, packed
sequences and both initial states; the ATK scan's two forms; the decoding step; float32's
error; bad input named before any work. (tests/registry runs the registry's cases too.)"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops import _native
from linattn.ops import precond_delta_rule as module
from linattn.ops.precond_delta_rule import atk_preconditioner
from linattn.reference.precond_delta import recurrence

# the reference's q, k as given (the op normalises them by default, as fla's entry points)
precond_delta_rule = functools.partial(module.precond_delta_rule, use_qk_l2norm=False)
precond_delta_rule_step = functools.partial(module.precond_delta_rule_step, use_qk_l2norm=False)

B, T, H, HV, K, V = 1, 29, 2, 4, 8, 4


def make(gate, dtype=torch.float64, seed=0, N=1):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, H, K), "k": F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, HV, V), "g_atk": F.logsigmoid(randn(B, T, H)),
        "beta_atk": rand(B, T, H), "beta": rand(B, T, HV),
        "g": {"none": None, "head": F.logsigmoid(randn(B, T, HV) + 2),
              "channel": F.logsigmoid(randn(B, T, HV, K) + 2)}[gate],
        "initial_state": randn(N, HV, K, V), "initial_A_state": rand(N, H, K),
        "log_atk_scale": randn(H) * 0.5,
    }  # fmt: skip
    return {n: (None if t is None else t.to(dtype)) for n, t in x.items()}


def oracle(x, scale, bounds):
    """The reference, sequence by sequence and value head by value head (head hv reads q/k and
    the ATK state of key head hv // (HV // H))."""
    o = np.zeros((T, HV, V))
    S = np.zeros((len(bounds) - 1, HV, K, V))
    A = np.zeros((len(bounds) - 1, H, K))
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        for hv in range(HV):
            h = hv // (HV // H)

            def part(name, head, s=s, e=e):
                return None if x[name] is None else x[name][0, s:e, head].numpy()

            o[s:e, hv], S[n, hv], A[n, h] = recurrence(
                part("q", h), part("k", h), part("v", hv), part("g_atk", h), part("beta_atk", h),
                part("beta", hv), part("g", hv), center=float(x["log_atk_scale"][h]),
                scale=scale, initial_state=x["initial_state"][n, hv].numpy(),
                initial_A_state=x["initial_A_state"][n, h].numpy(),
            )  # fmt: skip
    return torch.from_numpy(o)[None], torch.from_numpy(S), torch.from_numpy(A)


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_every_form_equals_the_reference_packed_and_grouped(gate, mode):
    cu = [0, 1, 12, 29]
    x = make(gate, N=3)
    got = precond_delta_rule(
        **x, scale=0.4, mode=mode, chunk_size=8, output_final_state=True,
        cu_seqlens=torch.tensor(cu),
    )  # fmt: skip
    for a, b in zip(got, oracle(x, 0.4, cu), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_atk_scan_forms_agree():
    x = make("none")
    args = (x["k"], x["g_atk"], x["beta_atk"])
    kw = {"initial_A_state": x["initial_A_state"], "log_atk_scale": x["log_atk_scale"]}
    kp_r, A_r = atk_preconditioner(*args, mode="recurrent", **kw)
    for C in (1, 5, 64):
        kp_c, A_c = atk_preconditioner(*args, mode="chunk", chunk_size=C, **kw)
        torch.testing.assert_close(kp_c, kp_r, rtol=0, atol=1e-13)
        torch.testing.assert_close(A_c, A_r, rtol=0, atol=1e-13)
    # the multiplier lies in [1/x, x]
    ratio = kp_r / x["k"]
    assert float(ratio.min()) >= 1 / 1.5 - 1e-12 and float(ratio.max()) <= 1.5 + 1e-12


@pytest.mark.skipif(not _native.available(), reason="the fused kernels are unavailable")
@pytest.mark.parametrize("centre", [None, 0.3, "tensor"])
def test_the_fused_atk_scan_equals_float64(centre):
    """float32 on the CPU (the scan and the squash fused, csrc/atk.cpp) against float64: kp, A_T
    and every gradient (k, g_atk, beta_atk, the initial state, a tensor centre) within 1e-6
    relative RMS (measured: about 2e-7), packed sequences too."""
    x = make("none")
    names = ("k", "g_atk", "beta_atk", "initial_A_state", "log_atk_scale")
    gen = torch.Generator().manual_seed(1)
    w_kp = torch.randn(x["k"].shape, generator=gen, dtype=torch.float64)
    w_A = torch.randn(x["initial_A_state"].shape, generator=gen, dtype=torch.float64)

    def run(dtype, cu=None):
        leaves = {n: x[n].to(dtype).detach().requires_grad_() for n in names}
        c = leaves["log_atk_scale"] if centre == "tensor" else centre
        kp, A = atk_preconditioner(
            leaves["k"], leaves["g_atk"], leaves["beta_atk"], log_atk_scale=c,
            initial_A_state=leaves["initial_A_state"], cu_seqlens=cu, mode="chunk",
        )  # fmt: skip
        if cu is not None:
            return [kp.detach(), A.detach()]
        ((kp * w_kp.to(dtype)).sum() + (A * w_A.to(dtype)).sum()).backward()
        grads = [leaves[n].grad for n in names[:4]]
        grads += [leaves["log_atk_scale"].grad] if centre == "tensor" else []
        return [kp.detach(), A.detach(), *grads]

    for a, b in zip(run(torch.float32), run(torch.float64), strict=True):
        assert float((a.double() - b).norm() / b.norm()) < 1e-6
    cu = torch.tensor([0, 9, 9, 29])
    x["initial_A_state"] = x["initial_A_state"].expand(3, H, K).contiguous()
    for a, b in zip(run(torch.float32, cu), run(torch.float64, cu), strict=True):
        assert float((a.double() - b).norm() / b.norm()) < 1e-6


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_the_step_equals_the_recurrent_form(gate):
    x = make(gate)
    o, S, A = precond_delta_rule(**x, mode="recurrent", output_final_state=True)
    state, A_state = x["initial_state"].clone(), x["initial_A_state"].clone()
    for t in range(T):
        o_t = precond_delta_rule_step(
            state, A_state, x["q"][:, t], x["k"][:, t], x["v"][:, t], x["g_atk"][:, t],
            x["beta_atk"][:, t], x["beta"][:, t], x["g"][:, t],
            log_atk_scale=x["log_atk_scale"],
        )  # fmt: skip
        torch.testing.assert_close(o_t, o[:, t], rtol=0, atol=1e-12)
    torch.testing.assert_close(state, S, rtol=0, atol=1e-12)
    torch.testing.assert_close(A_state, A, rtol=0, atol=1e-12)


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_float32_relative_rms_error(gate):
    """float32 against the float64 reference: relative RMS below 1e-6 (measured: about 2e-7)."""
    x = make(gate)
    want = oracle(x, 0.4, [0, T])
    x32 = {n: (None if t is None else t.float()) for n, t in x.items()}
    for mode in ("recurrent", "chunk"):
        got = precond_delta_rule(**x32, scale=0.4, mode=mode, output_final_state=True)
        for a, b in zip(got, want, strict=True):
            error = float((a.double() - b).norm() / b.norm())
            assert error < 1e-6, (mode, error)


def test_gradients_of_the_preconditioner_inputs_pass_gradcheck():
    x = make("head")
    x = {n: t[:, :6] if t is not None and t.dim() > 2 and t.shape[1] == T else t
         for n, t in x.items()}  # fmt: skip
    names = ("g_atk", "beta_atk", "initial_A_state", "log_atk_scale")  # k: tests/compat
    leaves = [x[n].clone().requires_grad_() for n in names]

    def f(*ts):
        y = dict(x, **dict(zip(names, ts, strict=True)))
        o, S, A = precond_delta_rule(**y, mode="chunk", chunk_size=4, output_final_state=True)
        return o, S, A

    assert torch.autograd.gradcheck(f, leaves)


def test_the_default_normalises_q_and_k():
    x = make("head")
    unit = {**x, "q": x["q"] * torch.rsqrt(x["q"].square().sum(-1, keepdim=True) + 1e-6)}
    unit["k"] = x["k"] * torch.rsqrt(x["k"].square().sum(-1, keepdim=True) + 1e-6)
    for a, b in zip(module.precond_delta_rule(**x), precond_delta_rule(**unit), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bad_input_is_named():
    x = make("head")
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\]"):
        precond_delta_rule(**{**x, "beta": x["beta"][:, :, :H]})
    with pytest.raises(ValueError, match="g_atk must have shape"):
        precond_delta_rule(**{**x, "g_atk": x["g_atk"][:, :, :1]})
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        precond_delta_rule(**x, eps=-1.0)
    with pytest.raises(TypeError, match="log_atk_scale must be None, a float"):
        precond_delta_rule(**{**x, "log_atk_scale": "c"})
    with pytest.raises(ValueError, match="initial_A_state must be >= 0"):
        precond_delta_rule(**{**x, "initial_A_state": -x["initial_A_state"]})
    with pytest.raises(ValueError, match="mode must be one of"):
        precond_delta_rule(**x, mode="scan")
    state = x["initial_state"].clone()
    with pytest.raises(ValueError, match="A_state must have shape"):
        precond_delta_rule_step(
            state, torch.zeros(1, H, K + 1, dtype=torch.float64), x["q"][:, 0], x["k"][:, 0],
            x["v"][:, 0], x["g_atk"][:, 0], x["beta_atk"][:, 0], x["beta"][:, 0],
        )  # fmt: skip


def _names_called(monkeypatch):
    """The fused kernels ``_native.fused`` hands out from here on, by name (a spy)."""
    called = []
    real = _native.fused

    def spy(name):
        called.append(name)
        return real(name)

    monkeypatch.setattr(_native, "fused", spy)
    return called


@pytest.mark.skipif(not _native.available(), reason="the fused kernels are unavailable")
@pytest.mark.parametrize("gate", ["head", "channel"])
@pytest.mark.parametrize("packed", [False, True])
def test_the_fused_write_keys_equal_float64(gate, packed, monkeypatch):
    """float32 chunk form on the CPU (the write keys beta kp straight from csrc/atk.cpp's scan,
    k's read-key gradient added in its backward) against float64: o, both states and every
    gradient within 1e-5 relative RMS (measured: at most 1.2e-6), grouped value heads,
    packed sequences or not."""
    cu = torch.tensor([0, 9, 9, 29]) if packed else None
    x = make(gate, N=3 if packed else 1)
    names = [n for n, t in x.items() if t is not None]
    gen = torch.Generator().manual_seed(2)
    weights = None

    def run(dtype):
        nonlocal weights
        leaves = {n: x[n].to(dtype).detach().requires_grad_() for n in names}
        out = precond_delta_rule(
            **leaves, scale=0.4, mode="chunk", chunk_size=8, output_final_state=True,
            cu_seqlens=cu,
        )  # fmt: skip
        if weights is None:
            weights = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in out]
        sum((t * w.to(dtype)).sum() for t, w in zip(out, weights, strict=True)).backward()
        return [t.detach() for t in out] + [leaves[n].grad for n in names]

    called = _names_called(monkeypatch)
    got = run(torch.float32)
    assert "atk_write_forward" in called and "atk_write_backward" in called
    for a, b, what in zip(got, run(torch.float64), ["o", "S", "A", *names], strict=True):
        error = float((a.double() - b).norm() / b.norm())
        assert error < 1e-5, (what, error)


@pytest.mark.skipif(not _native.available(), reason="the fused kernels are unavailable")
def test_the_write_kernel_is_the_scan_times_beta():
    """``atk_write_forward``: beta kp with kp bit for bit ``atk_forward``'s and each product
    rounded once; its backward: ``atk_backward``'s gradients from dkp = sum_j beta_j dw_j, dbeta
    = dw . kp, and dr added into dk (float32 against the same formulas in float64)."""
    gen = torch.Generator().manual_seed(3)
    B_, T_, H_, G, K_ = 2, 13, 3, 2, 8
    k = torch.randn(B_, T_, H_, K_, generator=gen)
    g = F.logsigmoid(torch.randn(B_, T_, H_, generator=gen))
    beta_atk, A0 = torch.rand(B_, T_, H_, generator=gen), torch.rand(B_, H_, K_, generator=gen)
    center, beta = torch.randn(H_, generator=gen), torch.rand(B_, T_, H_ * G, generator=gen)
    scan = (k, g, beta_atk, A0, center)
    log_x, eps = math.log(1.5), 1e-6
    kp, A_end, A_all = _native.fused("atk_forward")(*scan, log_x, eps, True)
    w, A_end_w, A_all_w = _native.fused("atk_write_forward")(*scan, beta, log_x, eps, True)
    want = beta.view(B_, T_, H_, G, 1) * kp.unsqueeze(3)
    assert torch.equal(w, want.reshape(B_, T_, H_ * G, K_))
    assert torch.equal(A_end_w, A_end) and torch.equal(A_all_w, A_all)
    dw = torch.randn(w.shape, generator=gen)
    dA_end, dr = torch.randn(A0.shape, generator=gen), torch.randn(k.shape, generator=gen)
    got = _native.fused("atk_write_backward")(*scan, beta, A_all, dw, dA_end, dr, log_x, eps)
    dw64 = dw.double().view(B_, T_, H_, G, K_)
    dkp = (beta.double().view(B_, T_, H_, G, 1) * dw64).sum(3)
    plain = _native.fused("atk_backward")(*scan, A_all, dkp.float(), dA_end, log_x, eps)
    dbeta = (dw64 * kp.double().unsqueeze(3)).sum(-1).reshape(B_, T_, H_ * G)
    want = [plain[0].double() + dr.double(), *(t.double() for t in plain[1:]), dbeta]
    for a, b in zip(got, want, strict=True):
        assert float((a.double() - b).norm() / b.norm()) < 1e-6
    without = _native.fused("atk_write_backward")(*scan, beta, A_all, dw, dA_end, None, log_x, eps)
    torch.testing.assert_close(without[0] + dr, got[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="strength must be a"):
        _native.fused("atk_write_forward")(*scan, beta[:, :, :2], log_x, eps, False)
    with pytest.raises(RuntimeError, match=r"dr must be of shape \[B, T, H, K\]"):
        _native.fused("atk_write_backward")(*scan, beta, A_all, dw, dA_end, dr[:, :2], log_x, eps)


# opcheck's checks of the compiled ATK ops: the schema, the registered autograd (none: the
# autograd.Functions above the ops own it) and the fake (Meta) kernels against the real outputs'
# shapes, dtypes and strides
OPCHECK = ("test_schema", "test_autograd_registration", "test_faketensor")


def _atk_op_inputs(B_, T_, packed, G=2, H_=3, K_=8):
    """The scan ops' float32 tensors as ``atk_preconditioner`` passes them: k [B, T, H, K], g,
    beta_atk [B, T, H], A0 [B, H, K], center [H], and the write strengths [B, T, G H]; packed:
    one sequence's rows of a packed batch (B = 1), as the ops take them, contiguous. Every tensor
    requires grad (the ops themselves record none)."""
    gen = torch.Generator().manual_seed(5)
    rows = T_ + 4 if packed else T_
    k = torch.randn(B_, rows, H_, K_, generator=gen)
    g = F.logsigmoid(torch.randn(B_, rows, H_, generator=gen))
    beta_atk = torch.rand(B_, rows, H_, generator=gen)
    beta = torch.rand(B_, rows, G * H_, generator=gen)
    if packed:
        k, g, beta_atk, beta = (x[:, 3 : 3 + T_].contiguous() for x in (k, g, beta_atk, beta))
    A0, center = torch.rand(B_, H_, K_, generator=gen), torch.randn(H_, generator=gen)
    x = [k, g, beta_atk, A0, center, beta]
    return [t.requires_grad_(True) for t in x]


@pytest.mark.skipif(not _native.available(), reason="the fused kernels are unavailable")
@pytest.mark.parametrize(
    ("B_", "T_", "packed"), [(2, 9, False), (1, 1, False), (1, 6, True), (1, 1, True)]
)
@pytest.mark.parametrize("keep", [True, False])
def test_opcheck_the_compiled_atk_ops(B_, T_, packed, keep):
    """atk_forward's and atk_write_forward's fake kernels give A_all [B, T, H, K] only when keep
    (else [0]); the backward ops', every gradient, atk_write_backward's with and without dr."""
    k, g, beta_atk, A0, center, beta = _atk_op_inputs(B_, T_, packed)
    scan, log_x, eps = (k, g, beta_atk, A0, center), math.log(1.5), 1e-6
    op = torch.ops.linattn_native
    torch.library.opcheck(op.atk_forward.default, (*scan, log_x, eps, keep), test_utils=OPCHECK)
    write = (*scan, beta, log_x, eps, keep)
    torch.library.opcheck(op.atk_write_forward.default, write, test_utils=OPCHECK)
    if not keep:
        return
    with torch.no_grad():
        kp, A_end, A_all = op.atk_forward(*scan, log_x, eps, True)
        w, _, _ = op.atk_write_forward(*write)
    assert A_all.shape == k.shape and w.shape == (B_, T_, 2 * k.shape[2], k.shape[3])
    back = (*scan, A_all, torch.randn_like(kp), torch.randn_like(A_end), log_x, eps)
    torch.library.opcheck(op.atk_backward.default, back, test_utils=OPCHECK)
    for dr in (torch.randn_like(kp), None):
        back = (*scan, beta, A_all, torch.randn_like(w), torch.randn_like(A_end), dr, log_x, eps)
        torch.library.opcheck(op.atk_write_backward.default, back, test_utils=OPCHECK)


@pytest.mark.skipif(not _native.available(), reason="the fused kernels are unavailable")
def test_the_atk_fake_kernels_refuse_bad_input_by_name():
    k, g, beta_atk, A0, center, beta = (t.detach().to("meta") for t in _atk_op_inputs(2, 5, False))
    op = torch.ops.linattn_native
    with pytest.raises(RuntimeError, match="center must be of shape"):
        op.atk_forward(k, g, beta_atk, A0, center[:1], 0.4, 1e-6, False)
    with pytest.raises(RuntimeError, match="strength must be a"):
        op.atk_write_forward(k, g, beta_atk, A0, center, beta[:, :, :2], 0.4, 1e-6, False)
    kp, A_end, A_all = op.atk_forward(k, g, beta_atk, A0, center, 0.4, 1e-6, True)
    assert kp.device.type == "meta" and A_all.shape == k.shape
    with pytest.raises(RuntimeError, match="dA_end must be of shape"):
        op.atk_backward(k, g, beta_atk, A0, center, A_all, kp, A_end[:1], 0.4, 1e-6)
    w, _, _ = op.atk_write_forward(k, g, beta_atk, A0, center, beta, 0.4, 1e-6, True)
    with pytest.raises(RuntimeError, match="dr must be of shape"):
        op.atk_write_backward(
            k, g, beta_atk, A0, center, beta, A_all, w, A_end, kp[:, :2], 0.4, 1e-6
        )
