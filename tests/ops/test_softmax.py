"""softmax_attention: fused and plain paths against a float64 loop of section 2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from linattn.ops import softmax_attention


def loop_reference(q, k, v, causal, scale):
    """Row by row: weights exp(scale q_i.k_j) over the visible keys, normalised (section 2)."""
    q, k, v = (x.double().numpy() for x in (q, k, v))
    B, T_q, H, _ = q.shape
    T_k = k.shape[1]
    out = np.zeros((B, T_q, H, v.shape[-1]))
    for b in range(B):
        for h in range(H):
            for i in range(T_q):
                last = i + T_k - T_q if causal else T_k - 1
                s = scale * k[b, : last + 1, h] @ q[b, i, h]
                w = np.exp(s - s.max())
                out[b, i, h] = (w / w.sum()) @ v[b, : last + 1, h]
    return torch.from_numpy(out)


def inputs(B=2, T_q=9, T_k=9, H=2, K=4, V=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T_q, H, K, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(B, T_k, H, K, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(B, T_k, H, V, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T_q,T_k", [(9, 9), (1, 9), (4, 9)])
def test_matches_loop(fused, causal, T_q, T_k):
    q, k, v = inputs(T_q=T_q, T_k=T_k)
    o = softmax_attention(q, k, v, causal=causal, fused=fused)
    ref = loop_reference(q, k, v, causal, 1 / math.sqrt(4))
    assert (o - ref).abs().max() < 1e-12


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_low_precision(dtype, tol):
    q, k, v = inputs(dtype=dtype)
    o = softmax_attention(q, k, v, scale=0.3)
    assert o.dtype == dtype
    ref = loop_reference(q, k, v, True, 0.3)
    assert float((o.double() - ref).norm() / ref.norm()) < tol


def test_cu_seqlens_and_grad():
    q, k, v = inputs(B=1, T_q=10, T_k=10)
    bounds = [0, 3, 10]
    o = softmax_attention(q, k, v, cu_seqlens=torch.tensor(bounds))
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        torch.testing.assert_close(o[:, a:b], softmax_attention(q[:, a:b], k[:, a:b], v[:, a:b]))
    small = [x[:, :5, :1, :2].clone().requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *t: softmax_attention(*t, fused=False), small)


def test_bad_input():
    q, k, v = inputs()
    with pytest.raises(ValueError, match="k"):
        softmax_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="v"):
        softmax_attention(q, k, v[:, :4])
    with pytest.raises(ValueError, match="T_q <= T_k"):
        softmax_attention(q, k[:, :4], v[:, :4])
    with pytest.raises(ValueError, match="q"):
        softmax_attention(q * float("nan"), k, v)
    with pytest.raises(ValueError, match="cu_seqlens"):
        softmax_attention(q[:1], k[:1], v[:1], cu_seqlens=torch.tensor([0, 4, 3, 9]))
