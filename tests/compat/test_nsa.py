"""fla's ``parallel_nsa`` against fla's naive reference (float64 inputs, which it computes in
float32) and its Triton kernels under the interpreter (packed sequences with a length-1 piece,
T = 1), forward and backward; the op against its float64 loop (tests/registry also does) and
its refusals. fla's naive and kernel reach flash-attn for the sliding window: linattn's CPU
flash attention stands in (tests/integrations/test_fla_attention.py pins it to torch's SDPA)."""

from __future__ import annotations

import pytest
import torch

from linattn import compat
from linattn.integrations import _fla_attention
from linattn.ops.nsa import native_sparse_attention
from linattn.reference.nsa import native_sparse_attention as nsa_loop

fla_nsa = pytest.importorskip("fla.ops.nsa")
import fla.ops.nsa.naive as fla_nsa_naive  # noqa: E402
import fla.ops.nsa.parallel as fla_nsa_parallel  # noqa: E402

HQ, H, K = 16, 1, 16  # fla's kernels need a group of >= 16 query heads per key head
GATES = ("g_cmp", "g_slc", "g_swa")


@pytest.fixture(autouse=True)
def _cpu_flash_attn(monkeypatch):
    for module in (fla_nsa_naive, fla_nsa_parallel):
        monkeypatch.setattr(module, "flash_attn_func", _fla_attention.flash_attn_func, False)
        monkeypatch.setattr(
            module, "flash_attn_varlen_func", _fla_attention.flash_attn_varlen_func, False
        )


def _inputs(T, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = {n: torch.randn(1, T, h, K, generator=gen, dtype=torch.float64)
         for n, h in (("q", HQ), ("k", H), ("v", H))}  # fmt: skip
    x.update({g: torch.rand(1, T, HQ, generator=gen, dtype=torch.float64) for g in GATES})
    return {n: t.to(dtype) for n, t in x.items()}


def _run(fn, x, **kw):
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o = fn(**leaves, **kw)
    (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()
    return [o.detach()] + [leaves[n].grad for n in x]


@pytest.mark.parametrize(
    ("T", "cu_seqlens"), [(1, None), (29, None), (29, torch.tensor([0, 1, 17, 29]))],
    ids=["T1", "T29", "varlen"],
)  # fmt: skip
def test_parallel_nsa_matches_fla_s_naive(T, cu_seqlens):
    x = _inputs(T)
    kw = dict(block_counts=3, block_size=4, window_size=6, cu_seqlens=cu_seqlens)
    for a, b in zip(_run(compat.parallel_nsa, x, **kw), _run(fla_nsa_naive.naive_nsa, x, **kw),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.slow
def test_parallel_nsa_matches_fla_s_kernel():
    x = _inputs(29, torch.float32)
    kw = dict(block_counts=3, block_size=16, window_size=6, cu_seqlens=torch.tensor([0, 1, 17, 29]))
    ours, theirs = _run(compat.parallel_nsa, x, **kw), _run(fla_nsa.parallel_nsa, x, **kw)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


def test_given_block_indices_and_a_decoding_query():
    x = _inputs(13)
    idx = torch.tensor([0, 2, -1]).expand(1, 13, H, 3)
    o = native_sparse_attention(x["q"], x["k"], x["v"], g_slc=x["g_slc"], block_indices=idx,
                                block_size=4)  # fmt: skip
    # token t reads the tokens s <= t of blocks 0 and 2, weighted by g_slc
    t = 11
    s = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])
    w = torch.softmax(torch.einsum("hk,sk->hs", x["q"][0, t], x["k"][0, s, 0]) / 4.0, dim=-1)
    want = (w @ x["v"][0, s, 0]) * x["g_slc"][0, t, :, None]
    torch.testing.assert_close(o[0, t], want, rtol=0, atol=1e-12)
    # the last query alone (a decoding step) equals the last row of the full call
    full = native_sparse_attention(*(x[n] for n in ("q", "k", "v", *GATES)), block_counts=3,
                                   block_size=4, window_size=5)  # fmt: skip
    last = native_sparse_attention(x["q"][:, -1:], x["k"], x["v"],
                                   *(x[g][:, -1:] for g in GATES), block_counts=3, block_size=4,
                                   window_size=5)  # fmt: skip
    torch.testing.assert_close(last[:, 0], full[:, -1], rtol=0, atol=1e-12)


def test_the_op_with_a_group_of_heads_equals_the_float64_loop():
    x = _inputs(23)
    o = native_sparse_attention(*(x[n] for n in ("q", "k", "v", *GATES)), block_counts=4,
                                block_size=4, window_size=3)  # fmt: skip
    args = [x["q"][0], x["k"][0, :, 0], x["v"][0, :, 0], *(x[g][0] for g in GATES)]
    want = nsa_loop(*(a.numpy() for a in args), block_counts=4, block_size=4, window_size=3)
    torch.testing.assert_close(o[0], torch.from_numpy(want), rtol=0, atol=1e-12)


def test_refusals_name_the_argument():
    x = _inputs(9)
    q, k, v = x["q"], x["k"], x["v"]
    with pytest.raises(ValueError, match="^block_indices"):
        compat.parallel_nsa(q, k, v)
    with pytest.raises(ValueError, match="^g_swa"):
        compat.parallel_nsa(q, k, v, x["g_cmp"], window_size=4)
    with pytest.raises(ValueError, match="^g_cmp must have"):
        compat.parallel_nsa(q, k, v, x["g_cmp"][..., :2])
    with pytest.raises(ValueError, match="^block_size"):
        compat.parallel_nsa(q, k, v, x["g_cmp"], block_size=0)
    with pytest.raises(TypeError, match="^block_counts"):
        compat.parallel_nsa(q, k, v, x["g_cmp"], block_counts=2.5)
