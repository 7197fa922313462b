"""The fused C++ chunk form of the generalized delta rule (``csrc/rules/dplr.cpp``).

    S_t = Diag(exp g_t) S_{t-1} + a_t (b_t^T S_{t-1}) + k_t v_t^T,   o_t = S_t^T (scale q_t)

The kernels ``torch.ops.linattn_native.chunk_forward`` / ``chunk_backward`` with rule "dplr" (the
beta slot carries [a | b], [B, HV, T, 2 K]) against a literal float64 token loop written here from
that line and its autograd: every gate (none, per head, per channel, steep), chunk sizes that
divide T or not or exceed it, grouped value heads, both schedules and several thread counts
(bitwise equal), the sizes at the edges; the delta rule, Gated DeltaNet and KDA as rows of the
DPLR table (a = -beta k, b = exp(g) k, v' = beta v) against the kernels' own delta rule.
"""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _native

from .cases import rel_rms

pytestmark = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)

GATES = ["none", "head", "channel", "steep"]


def token_loop(q, k, v, a, b, g, S0, scale):
    """The recurrence token by token, float64, public layout: q, k [B, T, H, K]; v [B, T, HV, V];
    a, b [B, T, HV, K]; g None, [B, T, HV, 1] or [B, T, HV, K]; S0 [B, HV, K, V] (HV = G H, value
    head j reading q/k head j // G). o [B, T, HV, V] and the final state."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    group = HV // max(H, 1)
    q, k = q.repeat_interleave(group, 2), k.repeat_interleave(group, 2)  # per value head
    S, outputs = S0, []
    for t in range(T):
        read = torch.einsum("bhk,bhkv->bhv", b[:, t], S)  # b reads the state entering the token
        decay = torch.ones_like(a[:, t]) if g is None else torch.exp(g[:, t]).expand_as(a[:, t])
        S = decay[..., None] * S + a[:, t, :, :, None] * read[:, :, None, :]
        S = S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", scale * q[:, t], S))
    o = torch.stack(outputs, 1) if outputs else v.new_zeros(B, 0, HV, v.shape[-1])
    return o, S


def make(B=2, T=37, H=2, G=1, K=8, V=5, gate="none", seed=0) -> dict:
    """float64 public-layout inputs: unit keys, a = -beta kk, b = kk * (0.5..1.5) for a random
    unit kk (transitions of norm about 1), log-gates of trained models (steep: times 400)."""
    gen = torch.Generator().manual_seed(seed)
    HV = G * H

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def unit(*shape):
        return torch.nn.functional.normalize(randn(*shape), dim=-1)

    kk = unit(B, T, HV, K)
    beta = torch.rand(B, T, HV, 1, generator=gen, dtype=torch.float64)
    x = {"q": randn(B, T, H, K), "k": unit(B, T, H, K), "v": randn(B, T, HV, V)}
    x["a"] = -beta * kk
    x["b"] = kk * (0.5 + torch.rand(B, T, HV, K, generator=gen, dtype=torch.float64))
    width = {"none": 0, "head": 1}.get(gate, K)
    x["g"] = None
    if width:
        x["g"] = torch.nn.functional.logsigmoid(randn(B, T, HV, width) + 2.0)
        if gate == "steep":
            x["g"] = 400 * x["g"]
    x["S0"] = randn(B, HV, K, V)
    return x


def schema_gate(x: dict) -> str:
    g = x["g"]
    return "none" if g is None else "head" if g.shape[-1] == 1 else "channel"


def kernel_args(x: dict, dtype=torch.float32) -> tuple:
    """q, k, v, ab, g, S0 as the kernels read them: [B, H, T, ...] views of [B, T, H, ...]."""

    def internal(t):
        return None if t is None else t.to(dtype).transpose(1, 2)

    ab = torch.cat([x["a"], x["b"]], -1)
    return (
        *(internal(x[n]) for n in ("q", "k", "v")),
        internal(ab),
        internal(x["g"]),
        x["S0"].to(dtype),
    )


def fused(x: dict, C: int, scale: float = 0.7, d_o=None, dS=None):
    """The kernels' o, S (public layout) and, given d_o, dS, the gradients (dq, dk, dv, da, db,
    dg, dS0; public layout, dg None without a gate)."""
    q, k, v, ab, g, S0 = args = kernel_args(x)
    T = q.shape[2]
    gate = schema_gate(x)
    ops = torch.ops.linattn_native
    o, S, states = ops.chunk_forward(*args, scale, min(C, max(T, 1)), True, "dplr", gate)
    if d_o is None:
        return o.transpose(1, 2), S
    d_o = d_o.float().transpose(1, 2)
    grads = ops.chunk_backward(
        q, k, v, ab, g, states, d_o, dS.float(), scale, min(C, max(T, 1)), "dplr", gate
    )
    dq, dk, dv, dab, dg, dS0 = grads
    K = q.shape[-1]
    public = [t.transpose(1, 2) for t in (dq, dk, dv, dab[..., :K], dab[..., K:])]
    return (*public, None if g is None else dg.transpose(1, 2), dS0)


@pytest.mark.parametrize("schedule", ["fused", "split"])
@pytest.mark.parametrize("C", [1, 5, 16, 64])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("G", [1, 2])
def test_forward_equals_the_token_loop(gate, C, G, schedule, monkeypatch):
    # T = 37: chunks of 5 and 16 leave a partial last chunk, 64 is one chunk longer than T.
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    x = make(G=G, gate=gate)
    o64, S64 = token_loop(*(x[n] for n in ("q", "k", "v", "a", "b", "g", "S0")), 0.7)
    o, S = fused(x, C)
    assert rel_rms(o, o64) < 2e-6
    assert rel_rms(S, S64) < 2e-6


@pytest.mark.parametrize("schedule", ["fused", "split"])
@pytest.mark.parametrize("C", [1, 5, 16, 64])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("G", [1, 2])
def test_backward_equals_autograd_of_the_token_loop(gate, C, G, schedule, monkeypatch):
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    x = make(G=G, gate=gate, seed=1)
    names = [n for n in ("q", "k", "v", "a", "b", "g", "S0") if x[n] is not None]
    leaves = {n: x[n].clone().requires_grad_() for n in names}
    o64, S64 = token_loop(*(leaves.get(n) for n in ("q", "k", "v", "a", "b", "g", "S0")), 0.7)
    gen = torch.Generator().manual_seed(2)
    d_o = torch.randn(o64.shape, generator=gen, dtype=torch.float64)
    dS = torch.randn(S64.shape, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad((o64 * d_o).sum() + (S64 * dS).sum(), list(leaves.values()))
    got = [t for t in fused(x, C, d_o=d_o, dS=dS) if t is not None]
    for name, value, reference in zip(names, got, expected, strict=True):
        assert rel_rms(value, reference) < 5e-6, name


def delta_rows(x: dict, beta: torch.Tensor) -> dict:
    """The DPLR inputs of the decay-first delta rule (DeltaNet, Gated DeltaNet, KDA) with keys k
    and strengths beta [B, T, H, 1]: a = -beta k, b = exp(g) k, v' = beta v."""
    k = x["k"]
    decay = 1.0 if x["g"] is None else torch.exp(x["g"])
    return {**x, "a": -beta * k, "b": decay * k, "v": beta * x["v"]}


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
def test_the_delta_rule_rows(gate):
    # DeltaNet, Gated DeltaNet and KDA: the DPLR rule with a = -beta k, b = exp(g) k, v' = beta v
    # equals the kernels' delta rule, forward and (by the chain rule) backward, to rounding.
    x = make(H=3, gate=gate, seed=3)
    beta = torch.rand(
        *x["k"].shape[:3], 1, generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )
    y = delta_rows(x, beta)
    gen = torch.Generator().manual_seed(5)
    d_o = torch.randn(*x["v"].shape, generator=gen, dtype=torch.float64)
    dS = torch.randn(x["S0"].shape, generator=gen, dtype=torch.float64)
    o, S = fused(y, 16)
    dq, dk, dv, da, db, dg, dS0 = fused(y, 16, d_o=d_o, dS=dS)

    q, k, v, _, g, S0 = kernel_args(x)
    beta32 = beta[..., 0].float().transpose(1, 2)
    ops = torch.ops.linattn_native
    o_d, S_d, states = ops.chunk_forward(q, k, v, beta32, g, S0, 0.7, 16, True, "delta", gate)
    assert rel_rms(o, o_d.transpose(1, 2)) < 1e-6
    assert rel_rms(S, S_d) < 1e-6
    grads = ops.chunk_backward(
        q, k, v, beta32, g, states, d_o.float().transpose(1, 2), dS.float(), 0.7, 16, "delta", gate
    )
    dq_d, dk_d, dv_d, dbeta_d = (t.transpose(1, 2) for t in grads[:4])
    dS0_d = grads[5]
    b32, k32, v32 = (t.float() for t in (beta, x["k"], x["v"]))
    decay = 1.0 if x["g"] is None else torch.exp(x["g"].float())
    assert rel_rms(dq, dq_d) < 1e-5
    assert rel_rms(dS0, dS0_d) < 1e-5
    assert rel_rms(dv * b32, dv_d) < 1e-5
    assert rel_rms(dk + (-b32 * da + decay * db), dk_d) < 1e-5  # one q/k head per value head
    dbeta = -(k32 * da).sum(-1) + (v32 * dv).sum(-1)
    assert rel_rms(dbeta, dbeta_d) < 1e-5
    if g is not None:
        share = db * decay * k32  # b = exp(g) k
        dg_rule = dg + (share.sum(-1, keepdim=True) if gate == "head" else share)
        assert rel_rms(dg_rule, grads[4].transpose(1, 2)) < 1e-5


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
@pytest.mark.parametrize(("B", "H", "G"), [(1, 1, 1), (1, 3, 1), (2, 2, 1), (1, 2, 2)])
def test_equal_on_every_thread_count_and_schedule(gate, B, H, G, threads, monkeypatch):
    # As the other rules (test_native_threads): each head is the same sequence of operations on
    # any number of threads and either schedule, so the outputs and gradients are equal bitwise.
    x = make(B=B, T=45, H=H, G=G, gate=gate, seed=6)
    gen = torch.Generator().manual_seed(7)
    d_o = torch.randn(*x["v"].shape, generator=gen, dtype=torch.float64)
    dS = torch.randn(x["S0"].shape, generator=gen, dtype=torch.float64)
    runs = []
    for count, schedule in [(1, "fused"), (2, "fused"), (2, "split"), (3, "split")]:
        threads(count)
        monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
        runs.append([*fused(x, 8), *(t for t in fused(x, 8, d_o=d_o, dS=dS) if t is not None)])
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run, strict=True))


@pytest.mark.parametrize(
    ("B", "T", "H", "K", "V"), [(2, 0, 2, 4, 3), (0, 5, 2, 4, 3), (2, 1, 2, 4, 3), (1, 6, 1, 1, 1)]
)
@pytest.mark.parametrize("gate", ["none", "head", "channel"])
def test_edge_sizes(B, T, H, K, V, gate):
    # No tokens, no batch, one token, one channel: the token loop's answers (T = 0: S0).
    x = make(B=B, T=T, H=H, K=K, V=V, gate=gate, seed=8)
    o64, S64 = token_loop(*(x[n] for n in ("q", "k", "v", "a", "b", "g", "S0")), 0.7)
    o, S = fused(x, 4)
    assert o.shape == o64.shape and S.shape == S64.shape
    if o.numel():
        assert rel_rms(o, o64) < 2e-6
    if S.numel():
        assert rel_rms(S, S64) < 2e-6
    d_o, dS = torch.ones_like(o64), torch.ones_like(S64)
    grads = fused(x, 4, d_o=d_o, dS=dS)
    shapes = [x[n].shape for n in ("q", "k", "v", "a", "b")]
    assert [t.shape for t in grads[:5]] == shapes


def test_the_inputs_are_checked():
    # The beta slot of the dplr rule is [a | b], [B, HV, T, 2 K]: a delta rule's beta is refused,
    # naming the argument and the shape.
    x = make(T=6)
    q, k, v, ab, g, S0 = kernel_args(x)
    ops = torch.ops.linattn_native
    with pytest.raises(RuntimeError, match=r"beta must be of shape \[B, HV, T, 2 K\]"):
        ops.chunk_forward(q, k, v, ab[..., 0], g, S0, 0.7, 4, False, "dplr", "none")
    with pytest.raises(RuntimeError, match="beta must be given for the dplr rule"):
        ops.chunk_forward(q, k, v, None, g, S0, 0.7, 4, False, "dplr", "none")
    with pytest.raises(RuntimeError, match='"additive", "delta", "dplr"'):
        ops.chunk_forward(q, k, v, ab, g, S0, 0.7, 4, False, "dplr2", "none")


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
def test_opcheck_the_extension_ops(gate):
    # The schema and the autograd registration of the extension's kernels with rule "dplr" (their
    # fake kernels are linattn.ops.library's, on the op that is traced).
    x = make(B=1, T=10, K=4, V=3, gate=gate, seed=9)
    args = kernel_args(x)
    ops = torch.ops.linattn_native
    utils = ("test_schema", "test_autograd_registration")
    forward = (*args, 0.5, 4, True, "dplr", gate)
    torch.library.opcheck(ops.chunk_forward, forward, test_utils=utils)
    o, S, states = ops.chunk_forward(*forward)
    backward = (*args[:5], states, torch.randn_like(o), torch.randn_like(S), 0.5, 4, "dplr", gate)
    torch.library.opcheck(ops.chunk_backward, backward, test_utils=utils)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("C", [16, 64])
def test_the_public_op_runs_it_and_equals_the_pytorch_loop(gate, C):
    # generalized_delta_rule's chunk form on float32 CPU inputs runs these kernels (library's
    # NATIVE_RULES), and its outputs and gradients (dbeta split into da, db by the op) equal the
    # PyTorch loop's in float64 (the same op on float64 inputs).
    from linattn.ops import generalized_delta_rule, library

    assert library._fused(torch.zeros(1, 1, 1, 1), "dplr")
    x = make(B=2, T=45, H=2, G=2, gate=gate, seed=10)
    x["g"] = None if x["g"] is None else x["g"][..., 0] if gate == "head" else x["g"]
    names = ("q", "k", "v", "a", "b", "g", "S0")

    def run(dtype):
        leaves = {n: x[n].to(dtype).requires_grad_() for n in names if x[n] is not None}
        args = [leaves.get(n) for n in names[:6]]
        o, S = generalized_delta_rule(
            *args, chunk_size=C, initial_state=leaves["S0"], output_final_state=True
        )
        gen = torch.Generator().manual_seed(11)
        d_o = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(dtype)
        dS = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(dtype)
        grads = torch.autograd.grad((o * d_o).sum() + (S * dS).sum(), list(leaves.values()))
        return [o.detach(), S.detach(), *grads]

    for got, expected in zip(run(torch.float32), run(torch.float64), strict=True):
        assert got.dtype == torch.float32
        assert rel_rms(got, expected) < 5e-6


@pytest.mark.parametrize("C", [16, 64])
def test_equals_flas_naive_recurrence(C):
    # fla's own token loop (fla/ops/generalized_delta_rule/dplr/naive.py, float32): its alpha
    # reads the state (our b) and its beta is the direction written (our a), [B, H, T, D], a
    # per-channel gate, q scaled by K^-0.5. The kernels on the same inputs give its o and state.
    pytest.importorskip("tests.fla_interpreter")  # before fla
    naive = pytest.importorskip("fla.ops.generalized_delta_rule.dplr.naive")
    x = make(B=1, T=64, H=2, K=8, V=5, gate="channel", seed=12)
    o, S = fused(x, C, scale=8**-0.5)

    def theirs(n):
        return x[n].float().transpose(1, 2).contiguous()

    o_fla, S_fla = naive.dplr_recurrence(
        *(theirs(n) for n in ("q", "k", "v", "b", "a", "g")), initial_state=x["S0"].float()
    )
    assert rel_rms(o, o_fla.transpose(1, 2)) < 2e-6
    assert rel_rms(S, S_fla) < 2e-6
