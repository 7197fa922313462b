"""linattn.compat.parallel_path_attn against fla 0.6.0: its naive reference and its Triton
kernel under the interpreter (tests/fla_interpreter; tiny shapes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import compat

fla_path = pytest.importorskip("fla.ops.path_attn")


def _inputs(B=1, T=20, HQ=2, H=1, D=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HQ, D, generator=gen)
    k, v = (torch.randn(B, T, H, D, generator=gen) for _ in range(2))
    w = F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, HQ, generator=gen) + 2)
    return q, k, v, w, beta, g


@pytest.mark.parametrize("T", [1, 20, 70])
def test_equals_fla_s_naive(T):
    q, k, v, w, beta, g = _inputs(T=T)
    o, cache = compat.parallel_path_attn(q, k, v, w, beta, g, scale=0.3)
    assert cache is None
    want = fla_path.naive_path_attn(q, k, v, w, beta, g, 0.3)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)


CASES = [(1, None, True), (70, None, True), (20, [0, 1, 12, 20], True), (20, None, False)]


@pytest.mark.parametrize(("T", "cu", "with_g"), CASES)
def test_equals_fla_s_kernel_with_its_key_cache(T, cu, with_g):
    q, k, v, w, beta, g = _inputs(T=T)
    g = g if with_g else None
    cu_seqlens = None if cu is None else torch.tensor(cu)
    theirs, their_cache = fla_path.parallel_path_attn(
        q, k, v, w, beta, g, scale=0.3, cu_seqlens=cu_seqlens, use_cache=True
    )
    ours, cache = compat.parallel_path_attn(q, k, v, w, beta, g, 0.3, cu_seqlens, True)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache, their_cache, rtol=1e-4, atol=1e-4)


def test_refusals_name_the_argument():
    q, k, v, w, beta, g = _inputs(B=2)
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        compat.parallel_path_attn(q, k, v, w, beta, g, cu_seqlens=torch.tensor([0, 20]))
    with pytest.raises(ValueError, match="w must have k's shape"):
        compat.parallel_path_attn(q, k, v, w[..., :8], beta, g)
    with pytest.raises(TypeError, match="beta must be a torch.Tensor"):
        compat.parallel_path_attn(q, k, v, w, 2.0, g)
