"""compat's ``chunk_gsa`` / ``fused_recurrent_gsa`` vs fla 0.6.0: its naive reference
(``fla/ops/gsa/naive.py``, float32 whatever the inputs) and its Triton kernels under triton's
interpreter (tests/fla_interpreter.py), outputs, final states and gradients.

With ``g=None`` fla's kernels first form ABC's control with fla's gate kernel
(``fla.ops.gsa.gate.fused_additive_gate``: the running logsumexp of s, its ``logaddexp`` calling
libdevice's log1p, which tests/fla_interpreter.py's ``log1p_on_cpu`` supplies); that path is
pinned to fla's naive reference and to its kernels (T = 1, T = 20, packed sequences with a
length-1 piece).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
fla_gsa = pytest.importorskip("fla.ops.gsa")
gsa_naive = pytest.importorskip("fla.ops.gsa.naive")

from linattn import compat  # noqa: E402

from .helpers import assert_same, compare  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
TOL = 5e-5  # test_vs_fla's float32 tolerance


def leaves(B=1, T=20, H=2, HQ=None, K=16, V=8, M=4, N=None, seed=0, gate=True):
    """fla's test recipe for GSA: q, k, v ~ N(0, 1), s ~ N(0, 1), g = logsigmoid(N(0, 1)),
    initial states ~ N(0, 1) (N of them: one per sequence)."""
    gen = torch.Generator().manual_seed(seed)
    N = B if N is None else N

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x = {"q": randn(B, T, HQ or H, K), "k": randn(B, T, H, K), "v": randn(B, T, H, V),
         "s": randn(B, T, H, M), "h0k": randn(N, H, K, M), "h0v": randn(N, H, M, V)}  # fmt: skip
    if gate:
        x["g"] = F.logsigmoid(randn(B, T, H, M))
    return x


def call(fn, **options):
    """fn on the leaves with its pair of initial states; (o, S_k, S_v) as a tuple."""

    def run(h0k=None, h0v=None, **x):
        o, S = fn(**x, initial_state=(h0k, h0v), output_final_state=True, **options)
        return o, tuple(S)

    return run


@pytest.mark.parametrize("gate", [True, False], ids=["g", "abc_control"])
def test_both_entry_points_equal_flas_naive_reference(gate):
    x = leaves(T=37, gate=gate)
    naive = call(gsa_naive.naive_recurrent_gsa)
    compare(call(compat.chunk_gsa, chunk_size=16), naive, x, 2e-5)
    compare(call(compat.fused_recurrent_gsa), naive, x, 2e-5)


def test_grouped_query_heads_equal_flas_naive_reference():
    x = leaves(T=21, H=1, HQ=2)
    compare(call(compat.chunk_gsa), call(gsa_naive.naive_recurrent_gsa), x, 2e-5)


SLOW_SHAPES = [(20, {}), (40, {"chunk_size": 16})]  # the packed test below covers both


@pytest.mark.parametrize(
    "T, options",
    [(1, {}), *(pytest.param(T, o, marks=pytest.mark.slow) for T, o in SLOW_SHAPES)],
    ids=["T1", "T20", "T40-chunks16"],
)
def test_chunk_equals_flas_kernel(T, options):
    x = leaves(T=T)
    compare(call(compat.chunk_gsa, **options), call(fla_gsa.chunk_gsa, **options), x, TOL)


def test_chunk_packed_with_a_one_token_piece_equals_flas_kernel():
    """Pieces of 1, 16 and 23 tokens in chunks of 16: a one-token sequence, a whole chunk, and
    a sequence of a whole and a partial chunk, each from its initial state."""
    x = leaves(T=40, N=3)
    options = {"cu_seqlens": torch.tensor([0, 1, 17, 40]), "chunk_size": 16}
    compare(call(compat.chunk_gsa, **options), call(fla_gsa.chunk_gsa, **options), x, TOL)


GATE_CASES = [(1, None), (20, None), (40, [0, 1, 17, 40])]


@pytest.mark.parametrize("T, cuts", GATE_CASES, ids=["T1", "T20", "packed"])
@pytest.mark.parametrize("name", ["chunk_gsa", "fused_recurrent_gsa"])
def test_abc_control_equals_flas_gate_kernel(name, T, cuts, monkeypatch):
    """g=None: fla's gate kernel forms s's softmax weights and the log-decays, forward and
    backward; chunks of 16 for the chunk form (pieces of 1, 16 and 23 tokens)."""
    fla_interpreter.log1p_on_cpu(monkeypatch)
    x = leaves(T=T, N=1 if cuts is None else len(cuts) - 1, gate=False)
    options = {} if cuts is None else {"cu_seqlens": torch.tensor(cuts)}
    if name == "chunk_gsa":
        options["chunk_size"] = 16
    compare(call(getattr(compat, name), **options), call(getattr(fla_gsa, name), **options), x,
            TOL)  # fmt: skip


@pytest.mark.slow  # about 6 s under the interpreter
def test_chunk_grouped_query_heads_equal_flas_kernel():
    x = leaves(T=20, H=1, HQ=2)
    compare(call(compat.chunk_gsa), call(fla_gsa.chunk_gsa), x, TOL)


@pytest.mark.parametrize(
    "reverse", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["forward", "reverse"]
)
def test_recurrent_packed_equals_flas_kernel(reverse):
    x = leaves(T=20, N=3)
    options = {"cu_seqlens": torch.tensor([0, 1, 9, 20]), "reverse": reverse}
    compare(call(compat.fused_recurrent_gsa, **options),
            call(fla_gsa.fused_recurrent_gsa, **options), x, TOL)  # fmt: skip


def test_recurrent_one_token_and_grouped_decoding_equal_flas_kernel():
    x = leaves(T=1)
    compare(call(compat.fused_recurrent_gsa), call(fla_gsa.fused_recurrent_gsa), x, TOL)
    x = leaves(T=1, H=1, HQ=2)  # grouped query heads: fla's decoding kernel, no gradients
    with torch.no_grad():
        a = call(compat.fused_recurrent_gsa)(**x)
        b = call(fla_gsa.fused_recurrent_gsa)(**x)
    assert_same([a[0], *a[1]], [b[0], *b[1]], TOL, "grouped decoding")
    assert a[0].dtype == b[0].dtype


def test_outputs_without_final_state_and_refusals():
    x = leaves(T=5)
    o, S = compat.chunk_gsa(x["q"], x["k"], x["v"], x["s"], x["g"])
    assert S == [None, None] and o.dtype == torch.float32
    assert compat.fused_recurrent_gsa(x["q"], x["k"], x["v"], x["s"], x["g"])[1] == [None, None]
    q, k, v, s, g = (x[n] for n in ("q", "k", "v", "s", "g"))
    with pytest.raises(ValueError, match="GQA is only supported for single-token inference"):
        compat.fused_recurrent_gsa(torch.cat([q, q], 2), k, v, s, g)
    with pytest.raises(ValueError, match="must be a multiple of the number of key heads"):
        compat.chunk_gsa(q[:, :, :1], k, v, s, g)
    with pytest.raises(ValueError, match="chunk_size` must be a power of 2"):
        compat.chunk_gsa(q, k, v, s, g, chunk_size=12)
    with pytest.raises(ValueError, match="checkpoint_level"):
        compat.chunk_gsa(q, k, v, s, g, checkpoint_level=3)
    with pytest.raises(DeprecationWarning, match="head_first"):
        compat.chunk_gsa(q, k, v, s, g, head_first=True)
    with pytest.raises(ValueError, match="the batch size is expected to be 1"):
        q2, k2, v2, s2, g2 = (torch.cat([t, t]) for t in (q, k, v, s, g))
        compat.chunk_gsa(q2, k2, v2, s2, g2, cu_seqlens=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="number of initial states"):
        compat.chunk_gsa(q, k, v, s, g, initial_state=(x["h0k"], x["h0v"]),
                         cu_seqlens=torch.tensor([0, 2, 5]))  # fmt: skip
    with pytest.raises(ValueError, match="g must have the shape of s"):
        compat.fused_recurrent_gsa(q, k, v, s, g[..., :2])
    with pytest.raises(TypeError, match="s must be a floating-point tensor"):
        compat.chunk_gsa(q, k, v, s.long(), g)
