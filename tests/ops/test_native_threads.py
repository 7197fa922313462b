"""The fused C++ chunk form on several threads: the same outputs and gradients at 1, 2
and 3 threads, with the heads P = B H a multiple of the thread count or not, on both schedules of
``csrc/schedule.h`` (fused per head; split into (chunk, head) pairs), and the split schedule
against the float64 engine.

Each head is computed by the same sequence of operations on any number of threads and either
schedule, so the results are equal bitwise.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from linattn.ops import _native
from linattn.ops.chunk import chunk_forward

from .cases import internal, make_inputs, mechanism, rel_rms, schema_mechanism

pytestmark = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)

MECHANISMS = list(itertools.product(["additive", "delta"], [None, "scalar", "channel"]))


def _forward_backward(x, C):
    """The op's forward outputs and backward gradients, float32."""
    q, k, v, beta, g = internal(x)
    S0 = x["S0"].float()
    mech = schema_mechanism(beta, g)
    o, S, states = _native.kernel("chunk_forward")(q, k, v, beta, g, S0, 0.7, C, True, *mech)
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(o.shape, generator=gen)
    dS = torch.randn(S.shape, generator=gen)
    grads = _native.kernel("chunk_backward")(q, k, v, beta, g, states, d_o, dS, 0.7, C, *mech)
    return [o, S, states, *(t for t in grads if t is not None)]


@pytest.fixture
def threads():
    """Set torch's thread count inside a test; restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize(("rule", "gate"), MECHANISMS)
@pytest.mark.parametrize(("B", "H", "G"), [(1, 1, 1), (1, 3, 1), (2, 2, 1), (1, 2, 2), (1, 3, 3)])
def test_equal_on_every_thread_count_and_schedule(rule, gate, B, H, G, threads, monkeypatch):
    # P = 1, 3 and 4 heads on 1, 2, 3 threads: a multiple of the thread count or not (the
    # default schedule splits P = 1 on 2 and 3 threads); T = 45 in chunks of 8 leaves a partial
    # last chunk. G > 1: grouped value heads (H value heads on H / G q/k heads), whose dq, dk
    # sum over each group.
    x = make_inputs(B=B, T=45, H=H, K=8, V=5, gate=gate, rule=rule, state=True)
    x["q"], x["k"] = x["q"][:, :, ::G].contiguous(), x["k"][:, :, ::G].contiguous()
    threads(1)
    monkeypatch.setenv("LINATTN_SCHEDULE", "fused")
    want = _forward_backward(x, 8)
    for n, schedule in [(1, "split"), (2, "fused"), (2, "split"), (3, "fused"), (3, "auto"),
                        (2, "auto")]:  # fmt: skip
        threads(n)
        monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
        got = _forward_backward(x, 8)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b), (n, schedule)


@pytest.mark.parametrize(("rule", "gate"), MECHANISMS)
def test_split_schedule_equals_the_float64_engine(rule, gate, threads, monkeypatch):
    x = make_inputs(B=1, T=45, H=3, K=8, V=5, gate=gate, rule=rule, state=True)
    threads(2)
    monkeypatch.setenv("LINATTN_SCHEDULE", "split")
    q, k, v, beta, g = internal(x)
    mech = schema_mechanism(beta, g)
    run = _native.kernel("chunk_forward")
    o, S, _ = run(q, k, v, beta, g, x["S0"].float(), 0.7, 16, False, *mech)
    q64, k64, v64, beta64, g64 = internal(x, torch.float64)
    o64, S64 = chunk_forward(q64 * 0.7, k64, v64, beta64, g64, x["S0"], 16, mechanism(x))
    assert rel_rms(o, o64) < 2e-6
    assert rel_rms(S, S64) < 2e-6


@pytest.mark.parametrize(("beta", "gate"), [(False, None), (True, 1), (True, "K")])
def test_step_at_a_large_batch_equal_on_every_thread_count(beta, gate, threads):
    # 64 sequences of 4 heads, K = V = 32: tasks of 16 heads (tuning.STEP_GRAIN), on 1-3 threads.
    B, H, K, V = 64, 4, 32, 32
    gen = torch.Generator().manual_seed(0)
    state = torch.randn(B, H, K, V, generator=gen)
    q, k = torch.randn(B, H, K, generator=gen), torch.randn(B, H, K, generator=gen) / K**0.5
    v = torch.randn(B, H, V, generator=gen)
    b = torch.rand(B, H, generator=gen) if beta else None
    width = {None: None, 1: 1, "K": K}[gate]
    g = None if width is None else -torch.rand(B, H, width, generator=gen)
    results = []
    for n in (1, 2, 3):
        threads(n)
        S = state.clone()
        o = _native.recurrent_step(S, q, k, v, b, g, 0.5, "delta" if beta else "additive")
        results.append((o, S))
    for o, S in results[1:]:
        assert torch.equal(o, results[0][0]) and torch.equal(S, results[0][1])
    # The step itself, against the plain formula of one head.
    p = (B - 1, H - 1)
    S = state[p].double() * (1.0 if g is None else g[p].double().exp().reshape(-1, 1))
    u = v[p].double() if b is None else b[p].double() * (v[p].double() - S.T @ k[p].double())
    S = S + torch.outer(k[p].double(), u)
    assert torch.allclose(results[0][1][p].double(), S, atol=1e-5)
    assert torch.allclose(results[0][0][p].double(), S.T @ (0.5 * q[p].double()), atol=1e-4)


@pytest.mark.parametrize("n", [1, 2])
def test_step_finds_a_non_finite_state_in_every_block(threads, n):
    # No scan of the state before the step: its pass finds a NaN in the last head of
    # the last thread's share through that head's output, q = 0 included (0 * NaN is NaN), and
    # the call answers None (``recurrent_step`` then names the state). The state was not finite
    # before the step; it is not made finite by it.
    threads(n)
    B, H, K, V = 64, 4, 32, 32
    state = torch.zeros(B, H, K, V)
    state[-1, -1, -1, -1] = float("nan")
    q = k = torch.zeros(B, H, K)
    out = _native.recurrent_step(state, q, k, torch.ones(B, H, V), None, None, 1.0, "additive")
    assert out is None
    assert state[-1, -1, -1, -1].isnan() and state.isnan().sum() == 1


def test_the_kernels_parallel_loops_run_on_every_thread(threads):
    # The extension must be compiled with OpenMP: at::parallel_for is a header template, and
    # without -fopenmp its loop ran every task on the calling thread (two threads
    # gained nothing). 64 one-task chunks on 2 threads reach both.
    threads(2)
    assert _native.kernel("threads_used")(64) == 2
    threads(1)
    assert _native.kernel("threads_used")(64) == 1
