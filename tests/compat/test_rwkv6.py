"""compat's RWKV-6 (``chunk_rwkv6``, ``fused_recurrent_rwkv6``) vs fla 0.6.0: its pure-PyTorch
references (``recurrent_naive.py``, ``chunk_naive.py``; float64 with their float32 casts
promoted, and float32) and its Triton kernels under the interpreter (float32, small shapes),
forward and the gradients of every input, initial states, packed sequences and ``reverse``."""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")
ops = pytest.importorskip("fla.ops")
recurrent_naive = pytest.importorskip("fla.ops.rwkv6.recurrent_naive")
chunk_naive = pytest.importorskip("fla.ops.rwkv6.chunk_naive")

from linattn import compat  # noqa: E402

from .helpers import Promoted, assert_same, compare, outputs_and_grads, recipe  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32], ids=["float64", "float32"]
)
ENTRY_POINTS = (compat.chunk_rwkv6, compat.fused_recurrent_rwkv6)


def _leaves(T=32, H=2, K=16, V=8, dtype=torch.float32, seed=0):
    """fla's recipe with RWKV-6's names: r, k, v, w = logsigmoid(N(0, 1)) per key channel, the
    bonus u ~ N(0, 1) [H, K], h0 ~ N(0, 1)."""
    x = recipe(T=T, H=H, K=K, V=V, dtype=torch.float64, seed=seed)
    u = torch.randn(H, K, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    leaves = {"r": x["q"], "k": x["k"], "v": x["v"], "w": x["gk"], "u": u, "initial_state": x["h0"]}
    return {n: t.to(dtype) for n, t in leaves.items()}


@pytest.fixture
def references(monkeypatch, dtype):
    """fla's references as they are (float32), or with float32 read as float64 for float64
    inputs (their ``.float()`` and ``torch.float32`` casts); yields the tolerance."""
    if dtype != torch.float64:
        yield 3e-5
        return
    for module in (recurrent_naive, chunk_naive):
        monkeypatch.setattr(module, "torch", Promoted())
    to_float = torch.Tensor.float
    monkeypatch.setattr(
        torch.Tensor, "float", lambda x: x if x.dtype == torch.float64 else to_float(x)
    )
    yield 1e-12


def _recurrent_reference(r, k, v, w, u, initial_state=None, scale=None):
    """fla's naive_recurrent_rwkv6 ([B, H, T, D]) as a [B, T, H, D] function: (o, S)."""
    o, S = recurrent_naive.naive_recurrent_rwkv6(
        *(t.transpose(1, 2) for t in (r, k, v, w)), u, scale=scale,
        initial_state=initial_state, output_final_state=True,
    )  # fmt: skip
    return o.transpose(1, 2), S


@DTYPES
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_equals_the_recurrent_reference(dtype, entry, references):
    leaves = _leaves(T=37, dtype=dtype)
    compare(
        lambda **t: entry(**t, output_final_state=True, **({"chunk_size": 16} if entry is
                                                           compat.chunk_rwkv6 else {})),
        _recurrent_reference, leaves, references,
    )  # fmt: skip


@DTYPES
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_equals_the_chunk_reference(dtype, entry, references):
    """naive_chunk_rwkv6: no scale (1.0), no initial state, T a multiple of its chunk size; the
    forward only (it writes its chunk states in place, which autograd cannot differentiate)."""
    leaves = _leaves(T=32, dtype=dtype)
    del leaves["initial_state"]

    def theirs(r, k, v, w, u):
        o = chunk_naive.naive_chunk_rwkv6(*(t.transpose(1, 2) for t in (r, k, v, w)), u, 8)
        return o.transpose(1, 2)

    with torch.no_grad():
        assert_same([entry(**leaves, scale=1.0)[0]], [theirs(**leaves)], references, "o")


@DTYPES
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_packed_sequences_each_equal_the_reference_alone(dtype, entry, references):
    leaves = _leaves(T=30, dtype=dtype)
    bounds = [0, 5, 6, 30]
    N = len(bounds) - 1
    gen = torch.Generator().manual_seed(4)
    leaves["initial_state"] = torch.randn(N, 2, 16, 8, generator=gen, dtype=dtype)

    def theirs(r, k, v, w, u, initial_state):
        outs, states = [], []
        for n, (s, e) in enumerate(itertools.pairwise(bounds)):
            o, S = _recurrent_reference(r[:, s:e], k[:, s:e], v[:, s:e], w[:, s:e], u,
                                        initial_state[n : n + 1])  # fmt: skip
            outs.append(o)
            states.append(S)
        return torch.cat(outs, 1), torch.cat(states, 0)

    compare(
        lambda **t: entry(**t, output_final_state=True, cu_seqlens=torch.tensor(bounds)),
        theirs, leaves, references,
    )  # fmt: skip


def test_refuses_bad_arguments_naming_them():
    x = _leaves(T=4)
    with pytest.raises(ValueError, match=r"\bu\b"):
        compat.chunk_rwkv6(x["r"], x["k"], x["v"], x["w"], x["u"][:1])
    with pytest.raises(ValueError, match=r"\bw\b"):
        compat.fused_recurrent_rwkv6(x["r"], x["k"], x["v"], x["w"][..., :3], x["u"])
    with pytest.raises(ValueError, match="power of 2"):
        compat.chunk_rwkv6(x["r"], x["k"], x["v"], x["w"], x["u"], chunk_size=12)
    with pytest.raises(DeprecationWarning, match="head_first"):
        compat.chunk_rwkv6(x["r"], x["k"], x["v"], x["w"], x["u"], head_first=True)


# ---------------------------------------------------------------------------------------------
# fla's Triton kernels under the interpreter (float32, small shapes)
# ---------------------------------------------------------------------------------------------

TOL = 5e-5


def _against_kernels(name, leaves, **kwargs):
    a, da = outputs_and_grads(lambda **t: getattr(compat, name)(**t, **kwargs), leaves)
    b, db = outputs_and_grads(lambda **t: getattr(ops, name)(**t, **kwargs), leaves)
    assert_same(a, b, TOL, name)
    for n in leaves:
        assert_same([da[n]], [db[n]], TOL, f"{name} d{n}")


def test_fused_recurrent_equals_fla_kernel():
    """The outputs and the final state, and the gradients of the outputs: fla's backward of
    ``fused_recurrent_rwkv6`` ignores the final state's gradient (its ``backward(ctx, do, dht)``
    never reads dht; its dk, dv, dw then differ from those of fla's own naive reference, which
    compat's equal: ``test_equals_the_recurrent_reference``)."""
    leaves = _leaves(T=24)
    name = "fused_recurrent_rwkv6"
    with torch.no_grad():
        a = compat.fused_recurrent_rwkv6(**leaves, output_final_state=True)
        b = ops.fused_recurrent_rwkv6(**leaves, output_final_state=True)
    assert_same(list(a), list(b), TOL, name)
    _against_kernels(name, leaves)


@pytest.mark.slow
def test_fused_recurrent_reverse_varlen_equals_fla_kernel():
    """reverse=True with packed sequences: the outputs and final states equal fla's reverse
    kernel's; the gradients equal those of fla's forward kernel on each sequence's tokens in
    reverse order (fla's reverse backward agrees with that in dr, dk, dv, du, dh0 but not in dw,
    whose reversed cumulative sum it does not reverse: 2.7 apart at T = 24)."""
    leaves = _leaves(T=24)
    leaves["initial_state"] = torch.cat([leaves["initial_state"]] * 2)
    bounds = torch.tensor([0, 9, 24])
    order = torch.cat([torch.arange(8, -1, -1), torch.arange(23, 8, -1)])  # each sequence reversed
    kwargs = dict(output_final_state=True, cu_seqlens=bounds)
    with torch.no_grad():
        a = compat.fused_recurrent_rwkv6(**leaves, reverse=True, **kwargs)
        b = ops.fused_recurrent_rwkv6(**leaves, reverse=True, **kwargs)
    assert_same(list(a), list(b), TOL, "reverse")

    def reversed_by_hand(r, k, v, w, u, initial_state):
        r, k, v, w = (x.index_select(1, order) for x in (r, k, v, w))
        o, _ = ops.fused_recurrent_rwkv6(r, k, v, w, u, initial_state=initial_state,
                                         cu_seqlens=bounds)  # fmt: skip
        return o.index_select(1, order)

    _, found = outputs_and_grads(
        lambda **t: compat.fused_recurrent_rwkv6(**t, reverse=True, cu_seqlens=bounds)[0], leaves
    )
    _, expected = outputs_and_grads(reversed_by_hand, leaves)
    for n in leaves:
        assert_same([found[n]], [expected[n]], TOL, f"reverse d{n}")


@pytest.mark.slow
def test_chunk_equals_fla_kernel():
    _against_kernels("chunk_rwkv6", _leaves(T=40), output_final_state=True)


@pytest.mark.slow
def test_chunk_varlen_equals_fla_kernel():
    leaves = _leaves(T=40)
    leaves["initial_state"] = torch.cat([leaves["initial_state"]] * 2)
    _against_kernels("chunk_rwkv6", leaves, output_final_state=True,
                     cu_seqlens=torch.tensor([0, 17, 40]))  # fmt: skip


@pytest.mark.parametrize("cuts", [None, [0, 1, 9, 23]], ids=["T1", "packed"])
@pytest.mark.parametrize("name", ["chunk_rwkv6", "fused_recurrent_rwkv6"])
def test_edges_equal_fla_kernels(name, cuts):
    """One token, and pieces of 1, 8 and 14 tokens each from its own initial state: o and the
    final states, and the gradients (of o alone for the recurrent kernel, whose backward
    ignores the final state's gradient)."""
    T, N = (1, 1) if cuts is None else (cuts[-1], len(cuts) - 1)
    leaves = _leaves(T=T)
    h0 = leaves["initial_state"]
    leaves["initial_state"] = torch.cat([h0 * (-1) ** n / (1 + n) for n in range(N)])
    kwargs = {"cu_seqlens": None if cuts is None else torch.tensor(cuts)}
    with torch.no_grad():
        a = getattr(compat, name)(**leaves, output_final_state=True, **kwargs)
        b = getattr(ops, name)(**leaves, output_final_state=True, **kwargs)
    assert_same(list(a), list(b), TOL, name)
    if name == "chunk_rwkv6":
        kwargs["output_final_state"] = True
    _against_kernels(name, leaves, **kwargs)
