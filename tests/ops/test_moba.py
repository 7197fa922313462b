"""MoBA (``linattn.ops.moba``) against its float64 loop: blocks that do and do not divide T,
packed sequences with a length-1 piece, topk = 1 (causal softmax attention); gradients; the
refusals. fla's parallel_moba (flash-attn's CUDA functions, no naive reference) is pinned on the
CPU with those functions written out in tests/compat/test_moba.py."""

from __future__ import annotations

import pytest
import torch

from linattn import compat
from linattn.ops import softmax_attention
from linattn.ops.moba import mixture_of_block_attention
from linattn.reference.moba import mixture_of_block_attention as moba_loop

H, K, V = 2, 8, 5


def _inputs(T, B=1, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(B, T, H, d, generator=gen, dtype=torch.float64).to(dtype)
            for n, d in (("q", K), ("k", K), ("v", V))}  # fmt: skip


def _loop(x, C, topk, bounds):
    o = torch.zeros(1, bounds[-1], H, V, dtype=torch.float64)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        for h in range(H):
            args = (x[n][0, a:b, h].numpy() for n in ("q", "k", "v"))
            o[0, a:b, h] = torch.from_numpy(moba_loop(*args, C, topk))
    return o


@pytest.mark.parametrize(("C", "topk"), [(4, 3), (5, 2), (3, 9), (4, 1)])
def test_the_op_equals_the_float64_loop(C, topk):
    x = _inputs(33)
    o = mixture_of_block_attention(x["q"], x["k"], x["v"], chunk_size=C, topk=topk)
    torch.testing.assert_close(o, _loop(x, C, topk, [0, 33]), rtol=0, atol=1e-12)


def test_packed_sequences_and_the_compat_entry_point():
    x = _inputs(30)
    cu = torch.tensor([0, 1, 18, 30])
    o = compat.parallel_moba(x["q"], x["k"], x["v"], cu, 17, 4, 3)
    torch.testing.assert_close(o, _loop(x, 4, 3, cu.tolist()), rtol=0, atol=1e-12)


def test_topk_one_is_causal_softmax_attention_and_float32():
    x = _inputs(21, B=2)
    o = mixture_of_block_attention(x["q"], x["k"], x["v"], chunk_size=4, topk=1)
    torch.testing.assert_close(o, softmax_attention(x["q"], x["k"], x["v"]), rtol=0, atol=1e-12)
    x32 = {n: t.float() for n, t in x.items()}
    o32 = mixture_of_block_attention(x32["q"], x32["k"], x32["v"], chunk_size=4, topk=3)
    o64 = mixture_of_block_attention(x["q"], x["k"], x["v"], chunk_size=4, topk=3)
    assert o32.dtype == torch.float32 and (o32.double() - o64).norm() / o64.norm() < 1e-6


def test_gradcheck():
    x = {n: t[:, :9, :1].clone().requires_grad_(True) for n, t in _inputs(9).items()}
    torch.autograd.gradcheck(
        lambda q, k, v: mixture_of_block_attention(q, k, v, chunk_size=2, topk=2),
        (x["q"], x["k"], x["v"]),
    )


def test_refusals_name_the_argument():
    x = _inputs(8)
    q, k, v = x["q"], x["k"], x["v"]
    with pytest.raises(ValueError, match="^topk"):
        mixture_of_block_attention(q, k, v, chunk_size=4, topk=0)
    with pytest.raises(ValueError, match="^chunk_size"):
        mixture_of_block_attention(q, k, v, chunk_size=0, topk=2)
    with pytest.raises(ValueError, match="^cu_seqlens"):
        compat.parallel_moba(q, k, v, torch.tensor([0, 4, 4, 8]), 4, 4, 2)
    with pytest.raises(TypeError, match="^q must be"):
        compat.parallel_moba(None, k, v, None, 8, 4, 2)
