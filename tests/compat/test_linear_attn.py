"""Normalised linear attention: fla 0.6.0's (kv, z) state, split and resumed; vs fla."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import compat

from .helpers import assert_same, outputs_and_grads, recipe


def positive(dtype=torch.float64, T=40, B=1):
    x = recipe(B=B, T=T, dtype=dtype)
    return F.elu(x["q"]) + 1, F.elu(x["k"]) + 1, x["v"]


@pytest.mark.parametrize(
    "fn", [compat.chunk_linear_attn, compat.fused_chunk_linear_attn,
           compat.fused_recurrent_linear_attn],
)  # fmt: skip
def test_normalised_split_and_resumed_equals_the_whole(fn):
    """Regression: the state was kv alone, and resuming from it divided by this
    call's keys only: 7x off. Now (kv, z) carries the normaliser across calls."""
    q, k, v = positive(B=2)
    o, _ = fn(q, k, v, normalize=True)
    o1, S1 = fn(q[:, :17], k[:, :17], v[:, :17], normalize=True, output_final_state=True)
    assert isinstance(S1, tuple) and len(S1) == 2
    o2, S2 = fn(q[:, 17:], k[:, 17:], v[:, 17:], initial_state=S1, normalize=True,
                output_final_state=True)  # fmt: skip
    torch.testing.assert_close(torch.cat([o1, o2], 1), o, rtol=1e-12, atol=1e-12)
    kv, z = S2
    assert kv.shape == (2, 2, 16, 8) and z.shape == (2, 1, 2, 16)
    torch.testing.assert_close(z, k.sum(1, keepdim=True), rtol=1e-12, atol=1e-12)


def test_normaliser_has_fla_s_epsilon_and_the_state_its_layout():
    q, k, v = positive()
    o, (kv, z) = compat.chunk_linear_attn(q, k, v)
    num, S = compat.chunk_linear_attn(q, k, v, normalize=False, output_final_state=True)
    den = (q * 16**-0.5 * k.cumsum(1)).sum(-1, keepdim=True) + 1e-10
    torch.testing.assert_close(o, num / den, rtol=1e-13, atol=1e-13)
    assert kv is None  # output_final_state=False: fla returns (None, z)
    torch.testing.assert_close(z, k.sum(1, keepdim=True), rtol=1e-13, atol=1e-13)
    # A bare tensor as initial state is kv (z_0 = 0), as in fla.
    o2, _ = compat.chunk_linear_attn(q, k, v, initial_state=S)
    num2, _ = compat.chunk_linear_attn(q, k, v, initial_state=S, normalize=False)
    torch.testing.assert_close(o2, num2 / den, rtol=1e-12, atol=1e-12)


def test_packed_sequences_carry_one_z_each():
    q, k, v = positive()
    cu = torch.tensor([0, 11, 40])
    o, (kv, z) = compat.chunk_linear_attn(q, k, v, cu_seqlens=cu, output_final_state=True)
    for n, (s, e) in enumerate([(0, 11), (11, 40)]):
        o_n, (kv_n, z_n) = compat.chunk_linear_attn(
            q[:, s:e], k[:, s:e], v[:, s:e], output_final_state=True
        )
        torch.testing.assert_close(o[:, s:e], o_n, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(z[n : n + 1], z_n, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kv[n : n + 1], kv_n, rtol=1e-12, atol=1e-12)


def test_vs_fla_naive_recurrence():
    """fla's pure-PyTorch reference (it computes in float32), forward and gradients."""
    naive = pytest.importorskip("fla.ops.linear_attn.naive")
    dtype = torch.float32
    q, k, v = positive(dtype)
    x = recipe(dtype=dtype)
    state = (x["h0"].abs(), (F.elu(x["q"][:, :1]) + 1).abs())  # (kv, z) [1, 1, H, K]
    tol = 2e-5
    for normalize in (False, True):
        s = state if normalize else state[0]

        def ours(q, k, v, s=s, normalize=normalize):
            return compat.fused_recurrent_linear_attn(
                q, k, v, initial_state=s, output_final_state=True, normalize=normalize
            )

        def theirs(q, k, v, s=s, normalize=normalize):
            return naive.naive_recurrent_linear_attn(
                q, k, v, initial_state=s, output_final_state=True, normalize=normalize
            )

        a, da = outputs_and_grads(ours, {"q": q, "k": k, "v": v})
        b, db = outputs_and_grads(theirs, {"q": q, "k": k, "v": v})
        assert_same(a, b, tol, f"normalize={normalize}")
        assert_same(list(da.values()), list(db.values()), tol, "grads")


@pytest.mark.parametrize("name", ["chunk_linear_attn", "fused_recurrent_linear_attn"])
def test_vs_fla_kernels_split_and_resumed(name):
    """fla's Triton kernels (interpreter): the (kv, z) state of the first half resumes the
    second, forward and gradients, float32."""
    pytest.importorskip("tests.fla_interpreter")
    ops = pytest.importorskip("fla.ops")
    q, k, v = positive(torch.float32, T=24)

    def split(fn):
        def run(q, k, v):
            o1, S1 = fn(q[:, :10], k[:, :10], v[:, :10], normalize=True, output_final_state=True)
            o2, S2 = fn(q[:, 10:], k[:, 10:], v[:, 10:], initial_state=S1, normalize=True,
                        output_final_state=True)  # fmt: skip
            return torch.cat([o1, o2], 1), S2

        return run

    a, da = outputs_and_grads(split(getattr(compat, name)), {"q": q, "k": k, "v": v})
    b, db = outputs_and_grads(split(getattr(ops, name)), {"q": q, "k": k, "v": v})
    assert_same(a, b, 2e-5, name)
    assert_same(list(da.values()), list(db.values()), 2e-5, name + " grads")


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("cuts", [None, [0, 1, 9, 23]], ids=["T1", "packed"])
@pytest.mark.parametrize(
    "name", ["chunk_linear_attn", "fused_chunk_linear_attn", "fused_recurrent_linear_attn"]
)
def test_edges_equal_fla_kernels(name, cuts, normalize):
    """fla's kernels (interpreter): one token, and pieces of 1, 8 and 14 tokens, each from its
    own initial state (kv, and with ``normalize`` the pair (kv, z)); forward and gradients."""
    pytest.importorskip("tests.fla_interpreter")
    ops = pytest.importorskip("fla.ops")
    T, N = (1, 1) if cuts is None else (cuts[-1], len(cuts) - 1)
    q, k, v = positive(torch.float32, T=T)
    x = recipe(dtype=torch.float32)
    leaves = {"q": q, "k": k, "v": v, "kv": torch.cat([x["h0"] * (-1) ** n for n in range(N)])}
    if normalize:
        leaves["z"] = (F.elu(x["q"][:, :N]) + 1).transpose(0, 1)  # [N, 1, H, K], > 0
    kwargs = {"normalize": normalize, "output_final_state": True,
              "cu_seqlens": None if cuts is None else torch.tensor(cuts)}  # fmt: skip

    def call(fn):
        def run(kv, z=None, **t):
            return fn(**t, initial_state=kv if z is None else (kv, z), **kwargs)

        return run

    a, da = outputs_and_grads(call(getattr(compat, name)), leaves)
    b, db = outputs_and_grads(call(getattr(ops, name)), leaves)
    assert_same(a, b, 2e-5, name)
    for n in leaves:
        assert_same([da[n]], [db[n]], 2e-5, f"{name} d{n}")


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("T", [1, 37, 64])
@pytest.mark.parametrize("name", ["chunk_linear_attn", "fused_chunk_linear_attn"])
def test_chunk_forms_vs_fla_naive_references(name, T, normalize):
    """fla's recurrent reference (from an initial state) and, at T = 64, its chunk reference
    (it reshapes into chunks of 64; no state): o and the gradients of q, k, v."""
    naive = pytest.importorskip("fla.ops.linear_attn.naive")
    q, k, v = positive(torch.float32, T=T)
    leaves = {"q": q, "k": k, "v": v}
    h0 = recipe(dtype=torch.float32)["h0"].abs()
    kw = {"initial_state": h0, "normalize": normalize}
    fn = getattr(compat, name)
    pairs = [(lambda **t: fn(**t, **kw)[0],
              lambda **t: naive.naive_recurrent_linear_attn(**t, **kw)[0])]  # fmt: skip
    if T == 64:
        chunk_naive = naive.naive_chunk_linear_attn
        pairs.append((lambda **t: fn(**t, normalize=normalize)[0],
                      lambda **t: chunk_naive(**t, normalize=normalize)))  # fmt: skip
    for ours, theirs in pairs:
        a, da = outputs_and_grads(ours, leaves)
        b, db = outputs_and_grads(theirs, leaves)
        assert_same(a, b, 2e-5, name)
        assert_same(list(da.values()), list(db.values()), 2e-5, f"{name} grads")
