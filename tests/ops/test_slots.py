"""linattn.ops.slots: gated slot attention and ABC in every form against the float64 references
(linattn.reference.gsa / .abc), packed sequences, states, gradients, the decoding steps and the
refusals of bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops import abc_attention, abc_step, gated_slot_attention, logsumexp_gate, slot_step
from linattn.ops.slots import additive_gate
from linattn.reference.abc import abc as abc_reference
from linattn.reference.gsa import gated_slot_attention as gsa_reference

FORMS = ("parallel", "recurrent", "chunk")


def inputs(B=2, T=23, H=2, K=6, V=5, M=4, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, H, K),
        "k": F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, H, V),
        "s": randn(B, T, H, M),
        "g": F.logsigmoid(randn(B, T, H, M) + 1.0),
        "S0": (randn(B, H, K, M), randn(B, H, M, V)),
    }
    return {n: tuple(t.to(dtype) for t in x) if isinstance(x, tuple) else x.to(dtype)
            for n, x in x.items()}  # fmt: skip


def reference(x, gated, scale, bounds=None):
    """The float64 reference head by head (and sequence by sequence with ``bounds``)."""
    B, T, H, _ = x["q"].shape
    o = np.zeros((B, T, H, x["v"].shape[-1]))
    finals = ([], [])
    for b in range(B):
        pieces = [(0, T)] if bounds is None else list(zip(bounds[:-1], bounds[1:], strict=True))
        for n, (start, end) in enumerate(pieces):
            Sk, Sv = [], []
            for h in range(H):
                cut = {n_: x[n_][b, start:end, h].double().numpy() for n_ in ("q", "k", "v", "s")}
                if gated:
                    cut["g"] = x["g"][b, start:end, h].double().numpy()
                S0 = tuple(S[b if bounds is None else n, h].double().numpy() for S in x["S0"])
                args = [cut[n_] for n_ in ("q", "k", "v", "s")]
                if gated:
                    out, S = gsa_reference(*args, cut["g"], scale=scale, initial_state=S0)
                else:
                    out, S = abc_reference(*args, scale=scale, initial_state=S0)
                o[b, start:end, h] = out
                Sk.append(S[0])
                Sv.append(S[1])
            finals[0].append(np.stack(Sk))
            finals[1].append(np.stack(Sv))
    return torch.from_numpy(o), tuple(torch.from_numpy(np.stack(f)) for f in finals)


def run(x, gated, **kw):
    if gated:
        return gated_slot_attention(x["q"], x["k"], x["v"], x["s"], x["g"], **kw)
    return abc_attention(x["q"], x["k"], x["v"], x["s"], **kw)


@pytest.mark.parametrize("gated", [True, False], ids=["gsa", "abc"])
@pytest.mark.parametrize("form", FORMS)
def test_every_form_equals_the_reference_in_float64(gated, form):
    x = inputs()
    o_ref, S_ref = reference(x, gated, 0.4)
    o, S = run(x, gated, scale=0.4, mode=form, chunk_size=8, initial_state=x["S0"],
               output_final_state=True)  # fmt: skip
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("gated", [True, False], ids=["gsa", "abc"])
def test_packed_sequences_with_a_one_token_piece(gated):
    x = inputs(B=1, T=20)
    bounds = [0, 1, 9, 20]
    x["S0"] = tuple(torch.cat([S, S.flip(-1), -S]) for S in x["S0"])  # one state per sequence
    o_ref, S_ref = reference(x, gated, 6**-0.5, bounds)
    for form in FORMS:
        o, S = run(x, gated, mode=form, chunk_size=4, initial_state=x["S0"],
                   output_final_state=True, cu_seqlens=torch.tensor(bounds))  # fmt: skip
        torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("gated", [True, False], ids=["gsa", "abc"])
def test_one_token_and_no_initial_state(gated):
    x = inputs(T=1)
    x["S0"] = (None, None)
    o_ref, S_ref = reference({**x, "S0": tuple(torch.zeros_like(S) for S in inputs(T=1)["S0"])},
                             gated, 6**-0.5)  # fmt: skip
    for form in FORMS:
        o, S = run(x, gated, mode=form, output_final_state=True)
        torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)
    assert run(x, gated)[1] is None


@pytest.mark.parametrize("gated", [True, False], ids=["gsa", "abc"])
def test_float32_is_near_the_float64_reference(gated):
    # measured: relative RMS error about 1e-7 (GSA and ABC, every form, T = 64)
    x = inputs(B=1, T=64, dtype=torch.float32)
    o_ref, _ = reference(x, gated, 0.4)
    for form in FORMS:
        o, S = run(x, gated, scale=0.4, mode=form, chunk_size=16, initial_state=x["S0"],
                   output_final_state=True)  # fmt: skip
        assert o.dtype == torch.float32 and S[0].dtype == torch.float32
        error = float((o.double() - o_ref).norm() / o_ref.norm())
        assert error < 2e-6, (form, error)


@pytest.mark.parametrize("gated", [True, False], ids=["gsa", "abc"])
def test_gradients_agree_across_forms_and_pass_gradcheck(gated):
    x = inputs(B=1, T=9, H=1, K=3, V=2, M=3)
    names = ["q", "k", "v", "s"] + (["g"] if gated else [])

    def grads(form):
        leaves = {n: x[n].clone().requires_grad_() for n in names}
        S0 = tuple(S.clone().requires_grad_() for S in x["S0"])
        o, (Sk, Sv) = run({**x, **leaves}, gated, mode=form, chunk_size=4, initial_state=S0,
                          output_final_state=True)  # fmt: skip
        w = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
        ((o * w).sum() + Sk.square().sum() + Sv.sum()).backward()
        return [leaves[n].grad for n in names] + [S.grad for S in S0]

    first = grads("recurrent")
    for form in ("parallel", "chunk"):
        for a, b in zip(grads(form), first, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)

    def f(*tensors):
        given = dict(zip(names, tensors[: len(names)], strict=True))
        o, S = run({**x, **given}, gated, mode="chunk", chunk_size=4,
                   initial_state=tensors[len(names):], output_final_state=True)  # fmt: skip
        return o, *S

    leaves = [x[n].clone().requires_grad_() for n in names]
    leaves += [S.clone().requires_grad_() for S in x["S0"]]
    assert torch.autograd.gradcheck(f, leaves)


def test_the_steps_continue_the_sequence():
    """slot_step / abc_step token by token from a prompt's final state equal the op on the whole
    sequence (ABC's step carries z, the normaliser, across the prompt)."""
    x = inputs(B=2, T=12)
    o_gsa, _ = gated_slot_attention(x["q"], x["k"], x["v"], x["s"], x["g"], mode="chunk",
                                    chunk_size=4, initial_state=x["S0"])  # fmt: skip
    _, S = gated_slot_attention(*(x[n][:, :7] for n in ("q", "k", "v", "s", "g")),
                                initial_state=x["S0"], output_final_state=True)  # fmt: skip
    for t in range(7, 12):
        o_t = slot_step(S, *(x[n][:, t] for n in ("q", "k", "v", "s", "g")))
        torch.testing.assert_close(o_t, o_gsa[:, t], rtol=0, atol=1e-12)
    o_abc, S_abc = abc_attention(x["q"], x["k"], x["v"], x["s"], output_final_state=True)
    B, _, H, K = x["q"].shape
    state = (torch.zeros(B, H, K, 4, dtype=torch.float64),
             torch.zeros(B, H, 4, 5, dtype=torch.float64),
             torch.full((B, H, 4), -torch.inf, dtype=torch.float64))  # fmt: skip
    for t in range(12):
        o_t = abc_step(state, *(x[n][:, t] for n in ("q", "k", "v", "s")))
        torch.testing.assert_close(o_t, o_abc[:, t], rtol=0, atol=1e-12)
    torch.testing.assert_close(state[:2], S_abc, rtol=0, atol=1e-12)


def test_bad_input_is_refused_naming_the_argument():
    x = inputs(T=4)
    q, k, v, s, g = (x[n] for n in ("q", "k", "v", "s", "g"))
    with pytest.raises(ValueError, match="s must have shape"):
        gated_slot_attention(q, k, v, s[:, :3], g)
    with pytest.raises(TypeError, match="s must have the dtype"):
        gated_slot_attention(q, k, v, s.float(), g)
    with pytest.raises(ValueError, match="g must be None or have shape"):
        gated_slot_attention(q, k, v, s, g[..., :2])
    with pytest.raises(ValueError, match="g is a log-decay"):
        gated_slot_attention(q, k, v, s, -g)
    with pytest.raises(TypeError, match="initial_state must be None or a pair"):
        gated_slot_attention(q, k, v, s, g, initial_state=x["S0"][0])
    with pytest.raises(ValueError, match="initial_state's S_v must have shape"):
        gated_slot_attention(q, k, v, s, g, initial_state=(x["S0"][0], x["S0"][0]))
    with pytest.raises(ValueError, match="mode must be one of"):
        abc_attention(q, k, v, s, mode="scan")
    with pytest.raises(ValueError, match="cu_seqlens"):
        abc_attention(q, k, v, s, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="g must have shape"):
        slot_step(
            tuple(S.clone() for S in x["S0"]), q[:, 0], k[:, 0], v[:, 0], s[:, 0], g[:, 0, :1]
        )
    with pytest.raises(TypeError, match="state must be a triple"):
        abc_step(x["S0"], q[:, 0], k[:, 0], v[:, 0], s[:, 0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_steep_chunk_takes_the_slot_by_slot_form(dtype):
    """A chunk whose decay spans more than pass 1's factored limit (exp(-G) would leave the
    dtype's range) runs slot by slot: the same numbers as the reference, a reset too."""
    x = inputs()
    x["g"][:, 9, :, :2] = -700.0  # finite, beyond float64's limit of 600 (and float32's 60)
    x["g"][:, 15, :, 3] = -float("inf")
    want = reference(x, True, 0.4)
    x = {n: tuple(t.to(dtype) for t in v) if isinstance(v, tuple) else v.to(dtype)
         for n, v in x.items()}  # fmt: skip
    got = run(x, True, scale=0.4, mode="chunk", chunk_size=8, initial_state=x["S0"],
              output_final_state=True)  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got[0].double(), want[0], rtol=tol, atol=tol)
    for a, b in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol)


fused_gate = pytest.mark.skipif(
    not logsumexp_gate.fused(torch.zeros(1)), reason="the fused kernels are not loaded"
)


@fused_gate
@pytest.mark.parametrize("bounds", [None, [0, 5, 5, 40, 41, 300]], ids=["one", "packed"])
def test_the_fused_control_equals_the_float64_sums(bounds):
    # float32 logits on the fused running log-sum-exp against additive_gate's float64 path,
    # values and gradients (of a loss through both outputs), an empty and a 1-token piece packed
    gen = torch.Generator().manual_seed(3)
    B = 2 if bounds is None else 1
    s = 3 * torch.randn(B, 300, 2, 5, generator=gen, dtype=torch.float64)
    cu = None if bounds is None else torch.tensor(bounds)
    w_in, g_in = torch.randn(2, *s.shape, generator=gen, dtype=torch.float64)
    s64, s32 = s.clone().requires_grad_(), s.float().requires_grad_()
    w64, g64 = additive_gate(s64, cu)
    w32, g32 = additive_gate(s32, cu)
    assert w32.dtype == g32.dtype == torch.float32
    torch.testing.assert_close(w32.double(), w64, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g32.double(), g64, rtol=1e-6, atol=1e-7)
    starts = [0] if bounds is None else bounds[:-1]
    assert all(bool((g32[:, a] == 0).all()) for a in starts if a < s.shape[1])
    ((w64 * w_in).sum() + (g64 * g_in).sum()).backward()
    ((w32 * w_in.float()).sum() + (g32 * g_in.float()).sum()).backward()
    torch.testing.assert_close(s32.grad.double(), s64.grad, rtol=1e-5, atol=1e-5)


@fused_gate
def test_the_fused_control_keeps_long_sequences_accurate():
    # the decay from token i to t is exp(sum of g over (i, t]) = exp(z_i - z_t): its error must
    # not grow with t - i (a float32 z would add one rounding a token)
    gen = torch.Generator().manual_seed(4)
    s = torch.randn(1, 8192, 1, 64, generator=gen, dtype=torch.float64)
    w64, g64 = additive_gate(s)
    w32, g32 = additive_gate(s.float())
    drift = (g32.double().cumsum(1) - g64.cumsum(1)).abs().amax()
    assert float(drift) < 2e-6, float(drift)
    # each weight is a float32 sigmoid of s_t - z_{t-1} (near -9 here): off by a few of its ulp
    error = ((w32.double() - w64) / w64).abs().amax()
    assert float(error) < 3e-6, float(error)


@fused_gate
def test_abc_in_float32_on_the_fused_control_is_near_the_float64_reference():
    # the whole op (gradients too) with the fused control against the float64 path
    x = inputs(B=1, T=200, K=8, V=8, M=8)
    x32 = {n: tuple(t.float() for t in v) if isinstance(v, tuple) else v.float()
           for n, v in x.items()}  # fmt: skip
    leaves64 = {n: x[n].clone().requires_grad_() for n in ("q", "k", "v", "s")}
    leaves32 = {n: x32[n].clone().requires_grad_() for n in ("q", "k", "v", "s")}
    outs = []
    for leaves, S0 in ((leaves64, x["S0"]), (leaves32, x32["S0"])):
        o, (Sk, Sv) = abc_attention(*leaves.values(), scale=0.4, chunk_size=16, initial_state=S0,
                                    output_final_state=True)  # fmt: skip
        (o.sum() + Sk.sum() + Sv.sum()).backward()
        outs.append((o, Sk, Sv))
    for a, b in zip(*outs, strict=True):
        assert float((a.detach().double() - b.detach()).norm() / b.detach().norm()) < 2e-6
    for n in leaves64:
        error = float(
            (leaves32[n].grad.double() - leaves64[n].grad).norm() / leaves64[n].grad.norm()
        )
        assert error < 1e-5, (n, error)


fused_scores = pytest.mark.skipif(
    not hasattr(torch.ops.linattn_native, "slot_scores_forward")
    if logsumexp_gate.fused(torch.zeros(1))
    else True,
    reason="the fused kernels are not loaded",
)

# pass 1's fused chunks (csrc/slots.cpp) in float32 against the float64 op (whose every form is
# the reference's to 1e-12): steep gates and resets (a slot of a chunk summed pair by pair),
# one token, lengths that are no multiple of the chunk, packed pieces of 0 and 1 tokens
FUSED_CASES = {
    "plain": dict(B=2, T=70, chunk=16, bounds=None, steep=False),
    "steep": dict(B=2, T=70, chunk=16, bounds=None, steep=True),
    "one-token": dict(B=2, T=1, chunk=64, bounds=None, steep=False),
    "ragged": dict(B=1, T=131, chunk=64, bounds=None, steep=True),
    "packed": dict(B=1, T=45, chunk=8, bounds=[0, 1, 1, 13, 14, 40, 45], steep=True),
}


@fused_scores
@pytest.mark.parametrize("gated", [True, False], ids=["gsa", "abc"])
@pytest.mark.parametrize("case", list(FUSED_CASES), ids=list(FUSED_CASES))
def test_the_fused_pass_one_is_near_float64(case, gated, monkeypatch):
    setup = FUSED_CASES[case]
    x = inputs(B=setup["B"], T=setup["T"], K=8, V=8, M=8, seed=5)
    if setup["steep"]:
        x["g"][:, ::7, :, 1] -= 6.0  # a slot that decays past the factored limit in a chunk
        x["g"][:, setup["T"] // 2, :, 2] = -float("inf")  # a reset
        x["g"][:, setup["T"] // 3, 0, :3] = -700.0
        if not gated:
            x["s"][:, setup["T"] // 2, :, 0] += 60.0  # ABC: a steep control, z jumps
    cu = None if setup["bounds"] is None else torch.tensor(setup["bounds"])
    if cu is not None:
        N = len(setup["bounds"]) - 1
        x["S0"] = tuple(S.repeat(N, 1, 1, 1) * torch.arange(1.0, N + 1).view(N, 1, 1, 1)
                        for S in x["S0"])  # fmt: skip
    names = ["q", "k", "v", "s"] + (["g"] if gated else [])
    calls = []
    kernel = torch.ops.linattn_native.slot_scores_forward

    def counted(*args):
        calls.append(1)
        return kernel(*args)

    def grads(dtype):
        leaves = {n: x[n].to(dtype).detach().requires_grad_() for n in names}
        S0 = tuple(S.to(dtype).detach().requires_grad_() for S in x["S0"])
        o, (Sk, Sv) = run({**x, **leaves}, gated, scale=0.4, chunk_size=setup["chunk"],
                          initial_state=S0, output_final_state=True, cu_seqlens=cu)  # fmt: skip
        w = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o).to(dtype)
        ((o * w).sum() + Sk.square().sum() + (Sv * 0.5).sum()).backward()
        found = [o, Sk, Sv] + [leaves[n].grad for n in names] + [S.grad for S in S0]
        return [t.detach().double() for t in found]

    want = grads(torch.float64)
    monkeypatch.setattr(torch.ops.linattn_native, "slot_scores_forward", counted, raising=False)
    got = grads(torch.float32)
    assert calls, "the float32 chunk form did not run the fused pass 1"
    labels = ["o", "S_k", "S_v"] + [f"d{n}" for n in names] + ["dS_k0", "dS_v0"]
    for label, a, b in zip(labels, got, want, strict=True):
        assert torch.isfinite(a).all(), label
        error = float((a - b).norm() / b.norm().clamp_min(1e-30))
        assert error < 1e-5, (label, error)


@fused_scores
@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_opcheck_the_fused_pass_one(packed):
    # the ops' schemas, fake (meta) kernels and their shapes (the kept states' rows from the
    # shapes alone) against the CPU kernels
    x = inputs(B=1 if packed else 2, T=21, K=4, M=3, dtype=torch.float32)
    cu = torch.tensor([0, 1, 1, 9, 21]) if packed else None
    N = 4 if packed else 2
    q, k, s = x["q"], x["k"], x["s"]
    g = x["g"].contiguous()
    S0 = torch.randn(N, 2, 4, 3)
    op = torch.ops.linattn_native
    args = (q, k, s, g, S0, cu, 0.5, 8, True)
    torch.library.opcheck(op.slot_scores_forward.default, args)
    y, _, states = op.slot_scores_forward(*args)
    assert states.shape[0] == (3 + N - 1 if packed else N * 3)
    d_y, dS = torch.randn_like(s), torch.randn_like(S0)
    torch.library.opcheck(
        op.slot_scores_backward.default, (q, k, s, g, states, cu, y, d_y, dS, 0.5, 8)
    )
