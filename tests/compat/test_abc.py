"""compat's ``chunk_abc`` vs fla 0.6.0: its naive references (``fla/ops/abc/naive.py``: the
recurrence and the prefix sums, float32, head-first [B, H, T, D]) and its Triton kernel under
triton's interpreter (tests/fla_interpreter.py).

fla's kernel and naive reference disagree on the final state when T is not a multiple of 64
(the kernel's is the true one times exp(z_T) per slot, compat/abc.py's docstring): compat
follows the kernel, and the relation is pinned against both here. fla's ``chunk_abc`` takes no
``cu_seqlens``. Its kernel's backward (under the interpreter with tests/fla_interpreter.py's
``boolean_masks``) reads only the output's gradient and leaves the initial state out:
it returns no gradient for the states, and its ds lacks their term (q, k, v's gradients agree
with them). Without initial states every gradient is pinned to the kernel's; with them, to the
naive reference's autograd, which compat follows.
"""

from __future__ import annotations

import pytest
import torch

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
fla_abc = pytest.importorskip("fla.ops.abc")
abc_naive = pytest.importorskip("fla.ops.abc.naive")

from linattn import compat  # noqa: E402
from linattn.ops import abc_attention  # noqa: E402

from .helpers import assert_same, compare, outputs_and_grads  # noqa: E402

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
        moved = {n: t.transpose(1, 2) if n in ("q", "k", "v", "s") else t
                 for n, t in x.items()}  # fmt: skip
        o, S = fn(**moved)
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


@pytest.mark.parametrize("T", [1, 20, pytest.param(70, marks=pytest.mark.slow)])
def test_chunk_abc_gradients_equal_flas_kernel(T, monkeypatch):
    """T = 1, T = 20 (a partial chunk), T = 70 (a whole chunk of 64 and a partial one)."""
    fla_interpreter.boolean_masks(monkeypatch)
    x, _ = leaves(T=T)
    compare(lambda **t: compat.chunk_abc(**t)[0], lambda **t: fla_abc.chunk_abc(**t)[0], x, TOL)


def test_chunk_abc_gradients_with_initial_states(monkeypatch):
    """q, k, v's gradients equal the kernel's; s's and the states' the naive reference's."""
    fla_interpreter.boolean_masks(monkeypatch)
    x, h0 = leaves(T=20)
    _, d_ours = outputs_and_grads(lambda **t: compat.chunk_abc(**t, initial_state=h0)[0], x)
    _, d_theirs = outputs_and_grads(lambda **t: fla_abc.chunk_abc(**t, initial_state=h0)[0], x)
    for n in ("q", "k", "v"):
        assert_same([d_ours[n]], [d_theirs[n]], TOL, f"d{n}")
    assert (d_ours["s"] - d_theirs["s"]).abs().max() > 1e-2  # fla's ds lacks the states' term

    def naive(hk, hv, **t):
        return head_first(abc_naive.naive_recurrent_abc)(**t, initial_state=(hk, hv))[0]

    compare(lambda hk, hv, **t: compat.chunk_abc(**t, initial_state=(hk, hv))[0], naive,
            {**x, "hk": h0[0], "hv": h0[1]}, 2e-5)  # fmt: skip


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
