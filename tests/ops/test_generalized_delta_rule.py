"""generalized_delta_rule (IPLR, DPLR) against the float64 token loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.ops import (
    chunk_affine_map,
    delta_rule,
    generalized_delta_rule,
    library,
    recurrent_step,
    tuning,
)
from linattn.reference.dplr import recurrence, transition

from .cases import make_inputs, rel_rms

GATES = [None, "scalar", "channel"]
MODES = [("recurrent", 64), ("parallel", 64), ("chunk", 1), ("chunk", 5), ("chunk", 16)]


def dplr_inputs(B=2, T=17, H=2, K=4, V=3, *, gate=None, state=False, dtype=torch.float64, seed=0):
    """make_inputs' q, k, v, g, S0 and a, b [B, T, H, K]: b of unit length and a = -beta' b-ish
    directions, so that the transitions neither blow up nor vanish."""
    x = make_inputs(B, T, H, K, V, gate=gate, state=state, dtype=torch.float64, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    b = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    b = b / b.norm(dim=-1, keepdim=True)
    a = -torch.rand(B, T, H, 1, generator=gen, dtype=torch.float64) * b
    a = a + 0.3 * torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) / K
    x["a"], x["b"] = a, b
    return {n: (None if t is None else t.to(dtype)) for n, t in x.items()}


def oracle(x, scale=1.0):
    """The float64 token loop of ``linattn.reference.dplr`` for every batch and head."""
    B, T, H, _ = x["q"].shape
    V = x["v"].shape[-1]
    o, S = np.zeros((B, T, H, V)), np.zeros((B, H, x["q"].shape[-1], V))

    def np64(t):
        return None if t is None else t.detach().double().numpy()

    q, k, v, a, b, g, S0 = (np64(x[n]) for n in ("q", "k", "v", "a", "b", "g", "S0"))
    for i in range(B):
        for h in range(H):
            o[i, :, h], S[i, h] = recurrence(
                q[i, :, h], k[i, :, h], v[i, :, h], a[i, :, h], b[i, :, h],
                None if g is None else g[i, :, h], scale=scale,
                initial_state=None if S0 is None else S0[i, h],
            )  # fmt: skip
    return torch.from_numpy(o), torch.from_numpy(S)


def run(x, mode, C, **kw):
    return generalized_delta_rule(
        x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], mode=mode, chunk_size=C,
        initial_state=x["S0"], output_final_state=True, scale=kw.pop("scale", 1.0), **kw,
    )  # fmt: skip


def close(x, ref, rtol=1e-12):
    """Relative to the reference's largest entry (float64: 1e-12)."""
    scale = ref.abs().max().clamp(min=1e-300)
    assert float((x.detach().double() - ref).abs().max() / scale) < rtol


@pytest.mark.parametrize("mode,C", MODES)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("state", [False, True])
def test_float64_matches_the_token_loop(mode, C, gate, state):
    x = dplr_inputs(T=21, gate=gate, state=state)
    o, S = run(x, mode, C)
    o_ref, S_ref = oracle(x)
    assert o.dtype == torch.float64
    close(o, o_ref)
    close(S, S_ref)


def decayed(g, x):
    """exp(g) * x for a gate per head [B, T, H] or per channel [B, T, H, K] (x itself: None)."""
    if g is None:
        return x
    return torch.exp(g if g.dim() == 4 else g.unsqueeze(-1)) * x


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 5)])
@pytest.mark.parametrize("gate", GATES)
def test_the_delta_rule_is_a_row_of_the_table(mode, C, gate):
    # The delta rule, Gated DeltaNet (head) and KDA (channel): a = -beta k, b = exp(g) k (b = k
    # without a gate: the decay first), v' = beta v.
    x = make_inputs(T=21, gate=gate, rule="delta", state=True)
    beta, g = x["beta"].unsqueeze(-1), x["g"]
    kw = dict(mode=mode, chunk_size=C, initial_state=x["S0"], output_final_state=True)
    o, S = generalized_delta_rule(
        x["q"], x["k"], beta * x["v"], -beta * x["k"], decayed(g, x["k"]), g, **kw
    )
    o_ref, S_ref = delta_rule(x["q"], x["k"], x["v"], x["beta"], g, **kw)
    close(o, o_ref)
    close(S, S_ref)


def comba_loop(q, k, v, p, beta, g, S0, scale):
    """Comba, token by token in float64 (its definition): S <- alpha S; u = beta (v - S^T p);
    S <- S + k u^T; o = S^T (scale q). Per head: [T, D] inputs, beta and g [T]."""
    S, out = S0.clone(), []
    for t in range(q.shape[0]):
        S = torch.exp(g[t]) * S
        u = beta[t] * (v[t] - S.T @ p[t])
        S = S + torch.outer(k[t], u)
        out.append(S.T @ (scale * q[t]))
    return torch.stack(out), S


def gdn2_loop(q, k, v, bb, w, g, S0, scale):
    """GDN-2, token by token in float64 (its definition): S <- Diag(exp g) S;
    S <- S - k ((bb * k)^T S) + k (w * v)^T. Per head: [T, D] inputs, g [T, K]."""
    S, out = S0.clone(), []
    for t in range(q.shape[0]):
        S = torch.exp(g[t])[:, None] * S
        S = S - torch.outer(k[t], (bb[t] * k[t]) @ S) + torch.outer(k[t], w[t] * v[t])
        out.append(S.T @ (scale * q[t]))
    return torch.stack(out), S


def per_head(loop, tensors, S0, scale):
    """``loop`` over every batch and head of [B, T, H, ...] tensors: o [B, T, H, V], S."""
    B, _, H = tensors[0].shape[:3]
    o, S = [], []
    for i in range(B):
        for h in range(H):
            o_h, S_h = loop(*(t[i, :, h] for t in tensors), S0[i, h], scale)
            o.append(o_h)
            S.append(S_h)
    V = o[0].shape[-1]
    o = torch.stack(o).view(B, H, -1, V).transpose(1, 2)
    return o, torch.stack(S).view(B, H, *S[0].shape)


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 5)])
def test_comba_is_a_row_of_the_table(mode, C):
    # The read of the decayed state (its definition, fla's naive_recurrent_comba): a = -beta k,
    # b = exp(g) p (p: Comba's read key), v' = beta v, g per head; fla's kernels' b = p is
    # linattn.ops.comba's (tests/ops/test_dplr_family.py).
    x = make_inputs(T=21, gate="scalar", rule="delta", state=True)
    gen = torch.Generator().manual_seed(5)
    p = torch.nn.functional.normalize(
        torch.randn(x["k"].shape, generator=gen, dtype=torch.float64), dim=-1
    )
    beta, g = x["beta"].unsqueeze(-1), x["g"]
    o, S = generalized_delta_rule(
        x["q"], x["k"], beta * x["v"], -beta * x["k"], decayed(g, p), g, mode=mode,
        chunk_size=C, initial_state=x["S0"], output_final_state=True, scale=0.5,
    )  # fmt: skip
    o_ref, S_ref = per_head(comba_loop, (x["q"], x["k"], x["v"], p, x["beta"], g), x["S0"], 0.5)
    close(o, o_ref)
    close(S, S_ref)


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 5)])
def test_gdn2_is_a_row_of_the_table(mode, C):
    # a = -k, b = exp(g) * bb * k, v' = w * v, g per channel.
    x = make_inputs(T=21, gate="channel", rule="delta", state=True)
    gen = torch.Generator().manual_seed(6)
    bb = torch.rand(x["k"].shape, generator=gen, dtype=torch.float64)  # per-channel, in [0, 1]
    w = torch.rand(x["v"].shape, generator=gen, dtype=torch.float64)
    g = x["g"]
    o, S = generalized_delta_rule(
        x["q"], x["k"], w * x["v"], -x["k"], decayed(g, bb * x["k"]), g, mode=mode,
        chunk_size=C, initial_state=x["S0"], output_final_state=True, scale=0.5,
    )  # fmt: skip
    o_ref, S_ref = per_head(gdn2_loop, (x["q"], x["k"], x["v"], bb, w, g), x["S0"], 0.5)
    close(o, o_ref)
    close(S, S_ref)


NAMES = ("q", "k", "v", "a", "b", "g", "S0")


def small(gate, seed=0, **kw):
    """Small float64 leaves for gradcheck: a gate strictly below 0 (numerical steps stay <= 0)."""
    x = dplr_inputs(B=1, T=9, H=1, K=3, V=2, gate=gate, state=True, seed=seed, **kw)
    if x["g"] is not None:
        x["g"] = x["g"].clamp(max=-0.05)
    return [x[n].clone().requires_grad_() for n in NAMES if x[n] is not None]


def op(mode, C, gate):
    """The op as a function of its differentiable inputs (q, k, v, a, b, [g], S0)."""

    def f(q, k, v, a, b, *rest):
        g, S0 = (rest[0], rest[1]) if gate else (None, rest[0])
        return generalized_delta_rule(
            q, k, v, a, b, g, mode=mode, chunk_size=C, initial_state=S0, output_final_state=True
        )

    return f


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 4)])
@pytest.mark.parametrize("gate", GATES)
def test_gradcheck(mode, C, gate):
    assert torch.autograd.gradcheck(op(mode, C, gate), small(gate))


@pytest.mark.parametrize("mode,C", [("parallel", 1), ("chunk", 4)])
@pytest.mark.parametrize("gate", GATES)
def test_gradgradcheck(mode, C, gate):
    assert torch.autograd.gradgradcheck(op(mode, C, gate), small(gate), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("gate", [*GATES, "steep"])
@pytest.mark.parametrize("rows", [1, 4096])  # one chunk per group, and one group (per thread)
def test_the_loops_gradients_are_the_token_loops(gate, rows, monkeypatch):
    # The group loop (its backward: autograd through each group's terms, from the saved states)
    # against autograd through the recurrent form, float64 to 1e-10 relative. "steep": channel
    # gates 400 times steeper, so that the per-channel products halve (``_blockmath``).
    monkeypatch.setattr(tuning, "GROUP_ROWS_PER_THREAD", rows)
    steep = gate == "steep"
    x = dplr_inputs(T=37, gate="channel" if steep else gate, state=True)
    if steep:
        x["g"] = 400 * x["g"]
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(2, 37, 2, 3, generator=gen, dtype=torch.float64)
    d_S = torch.randn(2, 2, 4, 3, generator=gen, dtype=torch.float64)
    grads = []
    for mode, C in (("recurrent", 1), ("chunk", 16)):
        leaves = {n: (None if t is None else t.clone().requires_grad_()) for n, t in x.items()}
        o, S = run(leaves, mode, C)
        used = [t for t in leaves.values() if t is not None]
        grads.append(torch.autograd.grad((o * d_o).sum() + (S * d_S).sum(), used))
    for new, ref in zip(*grads, strict=True):
        close(new, ref, rtol=1e-10)


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 4)])
@pytest.mark.parametrize("gate", GATES)
def test_packed_sequences(mode, C, gate):
    x = dplr_inputs(B=1, T=23, gate=gate, state=False)
    bounds = [0, 5, 6, 17, 23]
    S0 = torch.randn(4, 2, 4, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    o, S = run(dict(x, S0=S0), mode, C, cu_seqlens=torch.tensor(bounds))
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        part = {k: (None if t is None else t[:, s:e]) for k, t in x.items() if k != "S0"}
        o_ref, S_ref = oracle(dict(part, S0=S0[n : n + 1]))
        close(o[:, s:e], o_ref)
        close(S[n : n + 1], S_ref)


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 4)])
@pytest.mark.parametrize("gate", GATES)
def test_grouped_value_heads(mode, C, gate):
    # HV = 3 value heads on H = 1 q/k head: each value head's a, b, g and state its own.
    x = dplr_inputs(B=2, T=13, H=3, gate=gate, state=True)
    shared = dict(x, q=x["q"][:, :, :1], k=x["k"][:, :, :1])
    o, S = run(shared, mode, C)
    o_ref, S_ref = oracle(
        dict(x, q=x["q"][:, :, :1].expand_as(x["q"]), k=x["k"][:, :, :1].expand_as(x["k"]))
    )
    close(o, o_ref)
    close(S, S_ref)


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 4)])
@pytest.mark.parametrize("sizes", [(0, 5, 2), (2, 0, 2), (2, 5, 0), (1, 1, 1)])
def test_empty_and_size_one_dimensions(mode, C, sizes):
    B, T, H = sizes
    x = dplr_inputs(B=B, T=T, H=H, K=1 if T == 1 else 4, V=1 if T == 1 else 3, gate="channel")
    leaves = {n: (None if t is None else t.clone().requires_grad_()) for n, t in x.items()}
    o, S = run(leaves, mode, C)
    assert o.shape == x["v"].shape and S.shape == (B, H, x["k"].shape[-1], x["v"].shape[-1])
    if T and B and H:
        o_ref, S_ref = oracle(x)
        close(o, o_ref)
        close(S, S_ref)
    (o.sum() + S.sum()).backward()
    for n in ("q", "k", "v", "a", "b", "g"):
        assert leaves[n].grad is not None and leaves[n].grad.shape == x[n].shape, n


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)]
)
@pytest.mark.parametrize("gate", GATES)
def test_low_precision(dtype, tol, gate):
    x = dplr_inputs(B=1, T=300, K=8, V=8, gate=gate, state=True, dtype=dtype)
    o_ref, S_ref = oracle(x)  # the rounded inputs, in float64
    for mode, C in [("chunk", 16), ("chunk", 64), ("parallel", 1), ("recurrent", 1)]:
        o, S = run(x, mode, C)
        assert o.dtype == dtype and S.dtype == torch.float32
        assert rel_rms(o, o_ref) < tol, (mode, C)
        assert rel_rms(S, S_ref) < tol, (mode, C)


@pytest.mark.parametrize("gate", GATES)
def test_chunk_affine_map_is_the_product_of_transitions(gate):
    # 70 tokens: two chunks of the map (64). Gentle gates: M stays of order 1, whose entries
    # (sums of terms of order 1) are then known to float64's relative rounding.
    x = dplr_inputs(B=1, T=70, H=1, gate=gate)
    x["g"] = None if gate is None else 0.05 * x["g"]
    M, N = chunk_affine_map(x["k"], x["v"], g=x["g"], a=x["a"], b=x["b"])
    M_ref = np.eye(4)
    for t in range(70):
        g_t = None if x["g"] is None else x["g"][0, t, 0].numpy()
        M_ref = transition(x["a"][0, t, 0].numpy(), x["b"][0, t, 0].numpy(), g_t) @ M_ref
    _, N_ref = oracle(dict(x, S0=None))
    close(M[0, 0], torch.from_numpy(M_ref))
    close(N, N_ref)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_recurrent_step_is_the_recurrent_form(gate, dtype):
    x = dplr_inputs(B=2, T=9, H=2, gate=gate, state=True, dtype=dtype)
    o_ref, S_ref = run(x, "recurrent", 1, scale=None)
    state = x["S0"].to(S_ref.dtype).clone()
    for t in range(9):
        g_t = None if x["g"] is None else x["g"][:, t]
        a_t, b_t = x["a"][:, t], x["b"][:, t]
        o_t = recurrent_step(
            state, x["q"][:, t], x["k"][:, t], x["v"][:, t], None, g_t, a=a_t, b=b_t
        )
        torch.testing.assert_close(
            o_t, o_ref[:, t], rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-5
        )
    torch.testing.assert_close(state, S_ref, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-5)


def test_bad_input_is_refused_naming_the_argument():
    x = dplr_inputs()
    for name, bad, match in [
        ("a", x["a"][..., :3], "a must have shape"),
        ("b", x["b"][:, :5], "b must have shape"),
        (
            "a",
            x["a"].clone().index_fill_(1, torch.tensor([3]), float("nan")),
            "a contains non-finite",
        ),
        (
            "b",
            x["b"].clone().index_fill_(1, torch.tensor([3]), float("inf")),
            "b contains non-finite",
        ),
    ]:
        with pytest.raises(ValueError, match=match):
            run(dict(x, **{name: bad}), "chunk", 4)
    with pytest.raises(ValueError, match="a and b come together"):
        recurrent_step(
            x["q"].new_zeros(2, 2, 4, 3), x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], a=x["a"][:, 0]
        )
    with pytest.raises(ValueError, match="a must have shape"):
        chunk_affine_map(x["k"], x["v"], a=x["a"][..., :2], b=x["b"])


def test_the_chunk_op_checks_the_rules_inputs():
    # The ops' beta slot carries [a | b] [B, HV, T, 2K] for the rule dplr: a delta rule's beta
    # [B, HV, T] (or none) is refused, naming beta.
    x = dplr_inputs(B=1, T=5, H=1)
    q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))
    S0 = q.new_zeros(1, 1, 4, 3)
    for beta, match in [(q.new_ones(1, 1, 5), "beta must have shape"), (None, "beta must be")]:
        with pytest.raises(ValueError, match=match):
            library.chunk_forward(q, k, v, beta, None, S0, 1.0, 4, False, "dplr", "none")


def test_compiled_op_has_no_graph_break_and_matches_eager():
    # One graph each way, holding the ops chunk_forward and chunk_backward, as for the other rules.
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    torch._dynamo.reset()
    x = dplr_inputs(B=1, T=11, H=2, gate="channel", dtype=torch.float32)

    def loss(q, k, v, a, b, g):
        o, _ = generalized_delta_rule(q, k, v, a, b, g, chunk_size=4)
        return (o * o).sum()

    def grads(fn):
        leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v", "a", "b", "g")]
        return torch.autograd.grad(fn(*leaves), leaves)

    recorder = AotEagerAndRecordGraphs()
    compiled = grads(torch.compile(loss, fullgraph=True, backend=recorder))
    for c, e in zip(compiled, grads(loss), strict=True):
        torch.testing.assert_close(c, e, rtol=2e-6, atol=2e-6)
    nodes = [
        {str(n.target) for n in gm.graph.nodes} for gm in recorder.fw_graphs + recorder.bw_graphs
    ]
    assert len(nodes) == 2
    assert "linattn.chunk_forward.default" in nodes[0]
    assert "linattn.chunk_backward.default" in nodes[1]
