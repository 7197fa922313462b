"""compat's ``chunk_abc`` vs fla 0.6.0: its naive references (``fla/ops/abc/naive.py``: the
recurrence and the prefix sums, float32, head-first [B, H, T, D]) and its Triton kernel under
triton's interpreter (tests/fla_interpreter.py).

fla's kernel and naive reference disagree on the final state when T is not a multiple of 64
(the kernel's is the true one times exp(z_T) per slot, compat/abc.py's docstring): compat
follows the kernel, and the relation is pinned against both here. The kernel's backward
stops under the interpreter ("mask has unsupported dtype": a scalar load mask in
``chunk_abc_bwd_kernel_intra_V``), so the gradients are pinned against the naive reference.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")
fla_abc = pytest.importorskip("fla.ops.abc")
abc_naive = pytest.importorskip("fla.ops.abc.naive")

from linattn import compat  # noqa: E402
from linattn.ops import abc_attention  # noqa: E402

from .helpers import assert_same, compare  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
TOL = 5e-5  # test_vs_fla's float32 tolerance


def leaves(B=1, T=20, H=2, K=16, V=8, M=4, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return {"q": randn(B, T, H, K), "k": randn(B, T, H, K), "v": randn(B, T, H, V),
            "s": randn(B, T, H, M)}, (randn(B, H, K, M), randn(B, H, M, V))  # fmt: skip


def head_first(fn):
    """fla's naive ABC functions take and return [B, H, T, D]."""

    def run(**x):
        o, S = fn(**{n: t.transpose(1, 2) for n, t in x.items()})
        return o.transpose(1, 2), S

    return run


def test_chunk_abc_equals_flas_naive_references():
    x, h0 = leaves(T=37)
    ours = lambda **t: compat.chunk_abc(**t, initial_state=h0, output_final_state=True)  # noqa: E731
    naive = head_first(lambda **t: abc_naive.naive_recurrent_abc(
        **t, initial_state=h0, output_final_state=True))  # fmt: skip
    o, (Sk, Sv) = ours(**x)
    o_naive, (Sk_naive, Sv_naive) = naive(**x)
    assert_same([o], [o_naive], 2e-5, "o")
    z = torch.logsumexp(x["s"], dim=1)  # the kernel's final state: the naive one times exp(z_T)
    assert_same([Sk, Sv], [Sk_naive * z.exp().unsqueeze(-2), Sv_naive * z.exp().unsqueeze(-1)],
                2e-5, "S")  # fmt: skip
    # and the gradients of the output (fla's states carry none)
    compare(lambda **t: ours(**t)[0], lambda **t: naive(**t)[0], x, 2e-5)
    # the prefix sums of the paper (no initial state)
    cumsum = head_first(abc_naive.naive_cumsum_abc)
    assert_same([compat.chunk_abc(**x)[0]], [cumsum(**x)[0]], 2e-5, "cumsum")


@pytest.mark.parametrize("T", [1, 20, pytest.param(64, marks=pytest.mark.slow)])
def test_chunk_abc_equals_flas_kernel(T):
    """T = 1 and T = 20 (one partial chunk: the kernel's scaled state), T = 64 (a whole chunk:
    the true state); outputs and final states."""
    x, h0 = leaves(T=T)
    ours = compat.chunk_abc(**x, initial_state=h0, output_final_state=True)
    theirs = fla_abc.chunk_abc(**x, initial_state=h0, output_final_state=True)
    assert_same([ours[0], *ours[1]], [theirs[0], *theirs[1]], TOL, "o, S")
    if T % 64 == 0:  # a whole chunk: fla's kernel state is linattn's own op's
        _, S = abc_attention(**x, initial_state=h0, output_final_state=True)
        assert_same(list(S), list(theirs[1]), TOL, "S")


def test_chunk_abc_structure_and_refusals():
    x, h0 = leaves(T=5)
    o, S = compat.chunk_abc(**x)
    assert S is None and o.dtype == torch.float32
    assert isinstance(compat.chunk_abc(**x, output_final_state=True)[1], tuple)
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        compat.chunk_abc(x["q"], x["k"][:, :, :1], x["v"], x["s"])
    with pytest.raises(ValueError, match="s must have shape"):
        compat.chunk_abc(x["q"], x["k"], x["v"], x["s"][:, :4])
    with pytest.raises(TypeError, match="initial_state must be None or a pair"):
        compat.chunk_abc(**x, initial_state=h0[0])
    with pytest.raises(ValueError, match="initial_state's S_k must have shape"):
        compat.chunk_abc(**x, initial_state=(h0[1], h0[1]))
