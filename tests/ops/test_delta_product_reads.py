"""Gated DeltaProduct's chunk form reading q's T rows in place: on the CPU
the fused C++ loop takes ``reads`` = n_h write rows per query row and forms no output at the
writes that are not read. It must equal the delta rule run on the T n_h interleaved rows (q
repeated, read at each token's last write) with the same chunks: forward, final state,
gradients and double backward, both schedules, every gate, grouped heads and initial states;
bfloat16 and float16 inputs (converted chunk by chunk) give the float32 results
rounded once; and the kernels' checks name ``reads`` and the shapes it implies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.ops import _native, delta_rule, gated_delta_product
from linattn.ops.delta_product import interleave_gate, interleave_query, query_stride

from .test_delta_product import GATE_KINDS, inputs
from .test_low_precision import assert_rounded

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)
NAMES = ("q", "k", "v", "beta", "g", "S0")


def leaves_of(x: dict) -> dict:
    return {k: None if t is None else t.clone().requires_grad_() for k, t in x.items()}


def both_ways(leaves: dict, n: int, chunk: int, create_graph: bool = False) -> tuple[list, list]:
    """(o, S, and the gradients of a random loss) of ``gated_delta_product`` and of the delta
    rule on the interleaved rows with chunks of ``chunk`` rows, for the inputs ``leaves``."""
    gen = torch.Generator().manual_seed(1)

    def loss(o, S):
        wo = torch.randn(o.shape, generator=gen, dtype=o.dtype)
        return (o * wo).sum() + S.square().sum()

    results = []
    for product in (True, False):
        gen.manual_seed(1)
        q, k, v, beta, g, S0 = (leaves[name] for name in NAMES)
        if product:
            o, S = gated_delta_product(q, k, v, beta, g, num_householder=n, chunk_size=chunk,
                                       initial_state=S0, output_final_state=True)  # fmt: skip
        else:
            o, S = delta_rule(interleave_query(q, n), k, v, beta, interleave_gate(g, n),
                              chunk_size=chunk, initial_state=S0,
                              output_final_state=True)  # fmt: skip
            o = o[:, n - 1 :: n]
        wrt = [t for t in (q, k, v, beta, g, S0) if t is not None]
        grads = torch.autograd.grad(loss(o, S), wrt, create_graph=create_graph)
        results.append([o, S, *grads])
    return results[0], results[1]


@needs_native
@pytest.mark.parametrize("schedule", ["fused", "split"])
@pytest.mark.parametrize("gate", GATE_KINDS)
@pytest.mark.parametrize("n", [2, 3])
def test_equals_the_delta_rule_on_the_interleaved_rows(n, gate, schedule, monkeypatch):
    """T = 11 tokens in chunks of 4 tokens (a partial last chunk), grouped value heads."""
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    x = inputs(B=2, T=11, H=2, HV=4, K=8, V=5, n=n, gate=gate, seed=n, dtype=torch.float32)
    assert query_stride(x["q"], x["v"], n, "chunk", 4 * n, None) == n  # the path under test
    got, want = both_ways(leaves_of(x), n, 4 * n)
    for name, a, b in zip(("o", "S", *NAMES), got, want, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


@needs_native
def test_a_chunk_size_not_a_multiple_of_n_is_rounded_down():
    """chunk_size 64 at n_h = 3 runs chunks of 63 rows (21 tokens): the interleaved rows' 63."""
    n = 3
    x = inputs(B=1, T=50, H=1, HV=2, K=8, V=4, n=n, gate="head", dtype=torch.float32)
    got, _ = both_ways(leaves_of(x), n, 64)
    _, want = both_ways(leaves_of(x), n, 63)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@needs_native
def test_double_backward_equals_the_interleaved_rows():
    """create_graph=True: gradients that differentiate again, as the interleaved rows' do."""
    n = 2
    x = inputs(B=1, T=6, H=1, HV=2, K=4, V=3, n=n, gate="channel", dtype=torch.float32)
    leaves = leaves_of(x)
    got, want = both_ways(leaves, n, 4, create_graph=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    wrt = [t for t in leaves.values() if t is not None]
    second = [  # a function of every first-order gradient, differentiated once more
        torch.autograd.grad(sum(d.sin().sum() for d in grads[2:]), wrt) for grads in (got, want)
    ]
    for a, b in zip(*second, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def low_precision_run(x: dict, n: int, chunk: int, dtype) -> list:
    """o, S and the gradients of every input of ``gated_delta_product`` on ``x`` (S0 float32)
    from one weighted sum of o (weights in ``dtype``, o rounded to it) and S."""
    leaves = leaves_of(x)
    q, k, v, beta, g, S0 = (leaves[name] for name in NAMES)
    o, S = gated_delta_product(q, k, v, beta, g, num_householder=n, chunk_size=chunk,
                               initial_state=S0, output_final_state=True)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    w_o = torch.randn(o.shape, generator=gen).to(dtype)
    w_S = torch.randn(S.shape, generator=gen)
    wrt = [t for t in leaves.values() if t is not None]
    loss = (o.to(dtype) * w_o).sum() + (S * w_S).sum()
    return [o, S, *torch.autograd.grad(loss, wrt)]


@needs_native
@pytest.mark.parametrize("schedule", ["fused", "split"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_reads_the_query_rows_from_the_converted_chunks(dtype, schedule, monkeypatch):
    """bfloat16 and float16 inputs take the in-place query rows too (spread from each chunk's
    float32 conversion): o and every gradient are the float32 results on the converted inputs,
    rounded once to the input dtype (``assert_rounded``); grouped heads, a partial last chunk."""
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    n = 3
    x = inputs(B=2, T=11, H=2, HV=4, K=8, V=5, n=n, gate="channel", seed=2, dtype=torch.float32)
    low = {k: t if k == "S0" else t.to(dtype) for k, t in x.items()}
    assert query_stride(low["q"], low["v"], n, "chunk", 4 * n, None) == n  # the path under test
    got = low_precision_run(low, n, 4 * n, dtype)
    want = low_precision_run({k: t.float() for k, t in low.items()}, n, 4 * n, dtype)
    for name, a, b in zip(("o", "S", *NAMES), got, want, strict=True):
        assert a.dtype == (torch.float32 if name in ("S", "S0") else dtype), name
        assert_rounded(a, b, name)


@needs_native
@pytest.mark.parametrize("schedule", ["fused", "split"])
@pytest.mark.parametrize("create_graph", [False, True])
def test_low_precision_l2norm_keys(create_graph, schedule, monkeypatch):
    """bfloat16 inputs with use_qk_l2norm (q and k float32 inside, v, beta and g bfloat16: mixed
    dtypes in one reads call, dO converted chunk by chunk before its rows are spread): o and the
    gradients on the inputs as the float32 call's, rounded once to bfloat16; create_graph=True:
    computed in float32, each in its input's dtype, and differentiable again."""
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    n = 2
    x = inputs(B=1, T=6, H=1, HV=2, K=4, V=3, n=n, gate="channel", dtype=torch.float32)
    x = {k: t.bfloat16() for k, t in x.items() if k != "S0"}
    assert query_stride(x["q"].float(), x["v"], n, "chunk", 4, None) == n  # the path under test

    def results(dtype):
        leaves = {k: t.to(dtype).requires_grad_() for k, t in x.items()}
        o, _ = gated_delta_product(*leaves.values(), num_householder=n, chunk_size=4,
                                   use_qk_l2norm=True)  # fmt: skip
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
        first = torch.autograd.grad((o.bfloat16() * w).sum(), list(leaves.values()),
                                    create_graph=create_graph)  # fmt: skip
        if not create_graph:
            return [o, *first]
        rounded = [d.bfloat16() for d in first]  # as the bfloat16 call rounds them
        second = torch.autograd.grad(sum(d.float().square().sum() for d in rounded),
                                     leaves["q"])  # fmt: skip
        return [o, *first, *second]

    got, want = results(torch.bfloat16), results(torch.float32)
    for name, a, b in zip(("o", *x, "second")[: len(got)], got, want, strict=True):
        assert a.dtype == torch.bfloat16, name
        assert_rounded(a, b, name)


def test_other_dtypes_modes_and_packed_sequences_repeat_the_queries():
    """Only eager CPU chunk calls in float32, bfloat16 or float16 take the in-place query rows."""
    q, v = torch.zeros(1, 4, 1, 2), torch.zeros(1, 12, 1, 2)
    assert query_stride(q.double(), v, 3, "chunk", 63, None) == 1
    assert query_stride(q, v, 3, "recurrent", 63, None) == 1
    assert query_stride(q, v, 3, "chunk", 2, None) == 1  # a chunk shorter than a token
    assert query_stride(q, v, 3, "chunk", 63, torch.tensor([0, 4])) == 1
    assert query_stride(q, v, 1, "chunk", 63, None) == 1


@needs_native
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"reads": 0}, "reads .* must be >= 1"),
        ({"C": 4}, "C = min\\(chunk size, T\\) = 4 must be a multiple of reads = 3"),
        ({"q_rows": 5}, "k must be of shape \\[B, H, T reads, K\\]"),
        ({"d_o_rows": 12}, "d_o must be of shape \\[B, HV, T / reads, V\\]"),
    ],
)
def test_the_kernels_check_reads(change, message):
    """The kernels' own checks (a direct call through torch.ops can pass anything)."""
    B, H, T, K, V, R = 1, 2, 4, 3, 2, 3
    q = torch.randn(B, H, change.get("q_rows", T), K)
    k = F.normalize(torch.randn(B, H, T * R, K), dim=-1)
    v, beta = torch.randn(B, H, T * R, V), torch.rand(B, H, T * R)
    S0 = torch.zeros(B, H, K, V)
    reads, C = change.get("reads", R), change.get("C", 6)
    forward = _native.kernel("chunk_forward")
    with pytest.raises(RuntimeError, match=message):
        if "d_o_rows" not in change:
            forward(q, k, v, beta, None, S0, 1.0, C, True, "delta", "none", reads)
        else:
            _, _, states = forward(q, k, v, beta, None, S0, 1.0, C, True, "delta", "none", R)
            d_o = torch.zeros(B, H, change["d_o_rows"], V)
            _native.kernel("chunk_backward")(q, k, v, beta, None, states, d_o, S0, 1.0, C,
                                             "delta", "none", R)  # fmt: skip
