"""Packed sequences run as padded batches (``linattn.ops._packed``): exact, one call per batch."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _engine, _packed, delta_rule, generalized_delta_rule, linear_attention

from . import entry_cases
from .cases import make_inputs

# Lengths that group with padding (16, 15, 14 | 9, 8 | 3, 3 | 1 with FILL = 7/8), in mixed order.
LENGTHS = [15, 3, 16, 9, 1, 14, 8, 3]


def bounds_of(lengths: list[int]) -> list[int]:
    out = [0]
    for L in lengths:
        out.append(out[-1] + L)
    return out


def test_batches_cover_every_sequence_once_within_the_fill():
    for lengths in (LENGTHS, [5] * 7, [1], [100, 1, 50, 49, 88, 87, 7, 8, 8, 8]):
        groups = _packed.batches(lengths)
        assert sorted(n for g in groups for n in g) == list(range(len(lengths)))
        for g in groups:
            longest = lengths[g[0]]
            assert all(_packed.FILL * longest <= lengths[n] <= longest for n in g)
    assert len(_packed.batches([5] * 7)) == 1
    # 16 15 14 | 9 8 | 3 3 | 1: the 1-token sequence is alone (7/8 of 3 > 1); the 3s pad nothing.
    assert [len(g) for g in _packed.batches(LENGTHS)] == [3, 2, 2, 1]


def run(op, x, dtype, **kw):
    q, k, v = (x[n].to(dtype) for n in ("q", "k", "v"))
    g = None if x["g"] is None else x["g"].to(dtype)
    if op == "delta":
        return delta_rule(q, k, v, x["beta"].to(dtype), g, output_final_state=True, **kw)
    if op == "dplr":
        K = q.shape[-1]
        a = -k * x["beta"].to(dtype)[..., None]  # a = -beta k, b = k: the delta rule's transition
        ab = torch.cat([a, k], dim=-1)
        return generalized_delta_rule(q, k, v, ab[..., :K], ab[..., K:], g, output_final_state=True,
                                      **kw)  # fmt: skip
    return linear_attention(q, k, v, g, output_final_state=True, **kw)


@pytest.mark.parametrize("op", ["linear", "delta", "dplr"])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_padded_batches_equal_each_sequence_alone(op, gate, mode, dtype):
    T = sum(LENGTHS)
    x = make_inputs(B=1, T=T, gate=gate, rule="additive" if op == "linear" else "delta")
    if gate is not None:
        x["g"][0, 20] = -torch.inf  # a reset inside the third sequence
    bounds = bounds_of(LENGTHS)
    S0 = torch.randn(len(LENGTHS), 2, 4, 3, dtype=torch.float64)
    o, S = run(op, x, dtype, mode=mode, chunk_size=4, initial_state=S0.to(dtype),
               cu_seqlens=torch.tensor(bounds))  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        one = {m: (None if t is None else t[:, a:b]) for m, t in x.items()}
        S0_n = S0[n : n + 1].to(dtype)
        o_n, S_n = run(op, one, dtype, mode=mode, chunk_size=4, initial_state=S0_n)
        torch.testing.assert_close(o[:, a:b], o_n, rtol=tol, atol=tol)
        torch.testing.assert_close(S[n : n + 1], S_n, rtol=tol, atol=tol)


@pytest.mark.parametrize("lengths", [LENGTHS, [6, 6, 6]])
def test_gradients_through_the_batches(lengths):
    T = sum(lengths)
    x = make_inputs(B=1, T=T, H=1, K=3, V=2, gate="channel", rule="delta")
    q, k, v, beta, g = (x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "g"))
    S0 = torch.randn(len(lengths), 1, 3, 2, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor(bounds_of(lengths))

    def f(q, k, v, beta, g, S0):
        o, S = delta_rule(q, k, v, beta, g, initial_state=S0, cu_seqlens=cu, chunk_size=4,
                          output_final_state=True)  # fmt: skip
        return o, S

    assert torch.autograd.gradcheck(f, (q, k, v, beta, g, S0))


def test_second_derivatives_through_the_batches():
    """The batches' gather and write-back are each other's gradients (``_packed._Gather``,
    ``_Scatter``), differentiable in turn: lengths 3, 1, 2 make two batches and padding."""
    lengths = [3, 1, 2]
    x = make_inputs(B=1, T=sum(lengths), H=1, K=2, V=2, gate="channel", rule="delta")
    q, k, v, beta, g = (x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "g"))
    S0 = torch.randn(len(lengths), 1, 2, 2, dtype=torch.float64, requires_grad=True)
    cu = torch.tensor(bounds_of(lengths))

    def f(q, k, v, beta, g, S0):
        return delta_rule(q, k, v, beta, g, initial_state=S0, cu_seqlens=cu, chunk_size=2,
                          output_final_state=True)  # fmt: skip

    assert torch.autograd.gradgradcheck(f, (q, k, v, beta, g, S0))


def test_one_kernel_call_per_batch(monkeypatch):
    """The chunks of the sequences of a batch run in one call: 4 calls for the 8 sequences of
    LENGTHS, 1 for 64 sequences of equal length (a view, no copy)."""
    calls = []
    forward = _engine.forward
    monkeypatch.setattr(_engine, "forward", lambda *a: calls.append(a[2].shape[0]) or forward(*a))
    x = make_inputs(B=1, T=sum(LENGTHS), rule="delta")
    run("delta", x, torch.float64, cu_seqlens=torch.tensor(bounds_of(LENGTHS)), chunk_size=4)
    assert sorted(calls) == [1, 2, 2, 3]  # batch sizes
    calls.clear()
    x = make_inputs(B=1, T=64 * 5, rule="delta")
    run("delta", x, torch.float64, cu_seqlens=torch.arange(0, 321, 5), chunk_size=4)
    assert calls == [64]


def test_sequences_of_no_token_keep_their_initial_state():
    """An op built on the engine may pass an empty sequence (``_packed.run`` directly): its
    state is its initial state."""
    x = make_inputs(B=1, T=7, rule="delta")
    S0 = torch.randn(3, 2, 4, 3, dtype=torch.float64)

    def forward(q, k, v, beta, g, S0):
        return _engine.run(q, k, v, beta, g, scale=None, mode="chunk", chunk_size=4,
                           initial_state=S0, cu_seqlens=None, rule="delta")  # fmt: skip

    o, S = _packed.run([0, 4, 4, 7], (x["q"], x["k"], x["v"], x["beta"], None), S0, forward)
    torch.testing.assert_close(S[1], S0[1], rtol=0, atol=0)
    o2, S2 = forward(x["q"][:, 4:], x["k"][:, 4:], x["v"][:, 4:], x["beta"][:, 4:], None, S0[2:])
    torch.testing.assert_close(o[:, 4:], o2, rtol=0, atol=1e-12)


@pytest.mark.parametrize("op", entry_cases.OPS)
@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
@pytest.mark.parametrize("lengths", [[2, 0, 4], [0, 3, 0, 3, 0], [0, 0]])
def test_empty_pieces(op, mode, lengths):
    """Packed sequences of no token (cu_seqlens [0, 2, 2, 6], as fla accepts): no output rows,
    the initial state passed through as the final state (its gradient too); the others as
    without the empty ones."""
    bounds = bounds_of(lengths)
    kept = [n for n, L in enumerate(lengths) if L]
    x = entry_cases.inputs(op, bounds[-1], N=len(lengths))
    x = {name: t.requires_grad_() for name, t in x.items()}
    run = entry_cases.call(op)
    kw = dict(mode=mode, chunk_size=2, output_final_state=True)
    o, S = run(x, cu_seqlens=torch.tensor(bounds), **kw)
    assert o.shape[1] == bounds[-1]
    empty = [n for n in range(len(lengths)) if n not in kept]
    torch.testing.assert_close(S[empty], x["initial_state"][empty], rtol=0, atol=0)
    (o.sum() + (S * torch.arange(1.0, S.numel() + 1).view(S.shape)).sum()).backward()
    want = torch.arange(1.0, S.numel() + 1, dtype=torch.float64).view(S.shape)[empty]
    torch.testing.assert_close(x["initial_state"].grad[empty], want, rtol=0, atol=0)
    if not kept:
        return
    y = {n: t.detach() for n, t in x.items()} | {"initial_state": x["initial_state"][kept]}
    o2, S2 = run(y, cu_seqlens=torch.tensor(bounds_of([lengths[n] for n in kept])), **kw)
    torch.testing.assert_close(o, o2, rtol=0, atol=1e-12)
    torch.testing.assert_close(S[kept], S2, rtol=0, atol=1e-12)
