"""linattn.compat.deltaformer_attn against fla 0.6.0: its naive reference, its Triton kernel of
the pseudo-values under the interpreter, and its whole entry point (T = 1, T = 20, packed
sequences with a length-1 piece; o and the gradients of q, k, v, beta), which reads o with
flash-attention: linattn's CPU flash attention stands in (as in test_nsa.py; it is pinned to
torch's SDPA in tests/integrations/test_fla_attention.py)."""

from __future__ import annotations

import pytest
import torch

from linattn import compat
from linattn.ops.deltaformer import deltaformer

from .helpers import assert_same, outputs_and_grads

fla_deltaformer = pytest.importorskip("fla.ops.deltaformer")


def _inputs(B=2, T=20, H=2, D=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=gen) for _ in range(3))
    return q, k, v, torch.randn(B, T, H, generator=gen).sigmoid()


@pytest.mark.parametrize("T", [1, 20])
@pytest.mark.parametrize("with_beta", [True, False])
def test_equals_fla_s_naive(T, with_beta):
    q, k, v, beta = _inputs(T=T)
    beta = beta if with_beta else None
    o = compat.deltaformer_attn(q, k, v, beta)
    want = fla_deltaformer.naive_deltaformer_attn(q, k, v, beta)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cu", [None, [0, 1, 13, 20]])
def test_the_pseudo_values_equal_fla_s_kernel(cu):
    from fla.ops.deltaformer.parallel import ParallelDeltaformerFunction

    cu_seqlens = None if cu is None else torch.tensor(cu)
    q, k, v, beta = _inputs(B=1 if cu else 2)
    theirs = ParallelDeltaformerFunction.apply(q, k, v, beta, 8, cu_seqlens)  # blocks of 8
    _, ours = deltaformer(q, k, v, beta, mode="chunk", chunk_size=8, cu_seqlens=cu_seqlens,
                          return_u=True)  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "B, T, cu", [(1, 1, None), (2, 20, None), (1, 20, [0, 1, 13, 20])], ids=["T1", "T20", "packed"]
)
def test_equals_fla_s_entry_point(B, T, cu, monkeypatch):
    pytest.importorskip("tests.fla_interpreter").flash_attn_on_cpu(monkeypatch)
    from fla.ops.deltaformer import parallel

    q, k, v, beta = _inputs(B=B, T=T)
    leaves = {"q": q, "k": k, "v": v, "beta": beta}
    cu_seqlens = None if cu is None else torch.tensor(cu)
    a, da = outputs_and_grads(lambda **t: compat.deltaformer_attn(**t, cu_seqlens=cu_seqlens),
                              leaves)  # fmt: skip
    b, db = outputs_and_grads(lambda **t: parallel.deltaformer_attn(**t, cu_seqlens=cu_seqlens),
                              leaves)  # fmt: skip
    assert_same(a, b, 5e-5, "o")
    for n, x in leaves.items():  # at T = 1 beta has no effect: no gradient, or zeros
        zero = torch.zeros_like(x)
        assert_same([zero if da[n] is None else da[n]], [zero if db[n] is None else db[n]], 5e-5,
                    f"d{n}")  # fmt: skip


def test_packed_and_masked_follow_fla():
    q, k, v, beta = _inputs(B=1)
    cu = torch.tensor([0, 1, 13, 20])
    o = compat.deltaformer_attn(q, k, v, beta, cu_seqlens=cu)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        part = fla_deltaformer.naive_deltaformer_attn(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b])
        torch.testing.assert_close(o[:, a:b], part, rtol=1e-5, atol=1e-5)
    # attention_mask (left padding): u over the whole row, attention over its tokens (fla's)
    q, k, v, beta = _inputs(B=2, T=6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    o = compat.deltaformer_attn(q, k, v, beta, attention_mask=mask)
    _, u = deltaformer(q, k, v, beta, return_u=True)
    keep = mask[0].bool()
    scores = (q[0, keep].transpose(0, 1) @ k[0, keep].permute(1, 2, 0)) / 4
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    torch.testing.assert_close(o[0, keep], (weights @ u[0, keep].transpose(0, 1)).transpose(0, 1))
    assert o[0, ~keep].abs().max() == 0
    torch.testing.assert_close(o[1], compat.deltaformer_attn(q, k, v, beta)[1])


def test_refusals_name_the_argument():
    q, k, v, beta = _inputs()
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        compat.deltaformer_attn(q, k, v, beta, cu_seqlens=torch.tensor([0, 20]))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        compat.deltaformer_attn(q, k, v, beta, attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="C must be >= 1"):
        compat.deltaformer_attn(q, k, v, beta, C=0)
    with pytest.raises(ValueError, match="beta must have shape"):
        compat.deltaformer_attn(q, k, v, beta[..., :1])
