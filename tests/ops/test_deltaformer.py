"""DeltaFormer's op (linattn.ops.deltaformer) against its float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.ops.deltaformer import deltaformer
from linattn.reference.deltaformer import deltaformer as reference


def _inputs(B=2, T=19, H=2, D=6, V=5, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = [torch.randn(B, T, H, n, generator=gen, dtype=torch.float64) for n in (D, D, V)]
    beta = torch.randn(B, T, H, generator=gen, dtype=torch.float64)  # fla's layer: unbounded
    return [t.to(dtype) for t in (*x, beta)]


def _oracle(q, k, v, beta, **kw):
    B, T, H, _ = q.shape
    o = np.zeros((B, T, H, v.shape[-1]))
    for b in range(B):
        for h in range(H):
            heads = (x[b, :, h].double().numpy() for x in (q, k, v, beta))
            o[b, :, h] = reference(*heads, **kw)[0]
    return torch.from_numpy(o)


@pytest.mark.parametrize("mode", ["parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_every_form_equals_the_reference(mode, kernel):
    q, k, v, beta = _inputs()
    scale = None if kernel == "softmax" else 0.2
    o = deltaformer(q, k, v, beta, mode=mode, chunk_size=4, kernel=kernel, scale=scale)
    want = _oracle(q, k, v, beta, kernel=kernel, scale=scale)
    torch.testing.assert_close(o, want, rtol=0, atol=1e-12)


def test_u_queries_replace_q_in_the_write_stage_only():
    q, k, v, beta = _inputs(B=1)
    o = deltaformer(q, k, v, beta, u_queries=k)
    heads = [[x[0, :, h].numpy() for x in (q, k, v, beta)] for h in range(2)]
    want = np.stack([reference(*x, u_queries=x[1])[0] for x in heads], axis=1)
    torch.testing.assert_close(o[0], torch.from_numpy(want), rtol=0, atol=1e-12)
    assert (o - deltaformer(q, k, v, beta)).abs().max() > 1e-3


def test_gradients_pass_gradcheck_in_each_form():
    q, k, v, beta = (t.requires_grad_(True) for t in _inputs(B=1, T=6, H=1, D=3, V=2))
    for mode in ("parallel", "chunk", "recurrent"):
        assert torch.autograd.gradcheck(
            lambda *x, mode=mode: deltaformer(*x, mode=mode, chunk_size=4), (q, k, v, beta)
        )


def test_packed_sequences_equal_the_sequences_one_by_one():
    q, k, v, beta = _inputs(B=1, T=12)
    cu = torch.tensor([0, 1, 7, 12])
    o = deltaformer(q, k, v, beta, cu_seqlens=cu, mode="chunk", chunk_size=4)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        part = deltaformer(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b])
        torch.testing.assert_close(o[:, a:b], part, rtol=0, atol=1e-12)


def test_float32_error_against_float64():
    q, k, v, beta = _inputs(B=1, T=64, H=2, D=16, V=16, dtype=torch.float32)
    beta = beta.sigmoid()
    want = _oracle(q, k, v, beta)
    o = deltaformer(q, k, v, beta, mode="chunk", chunk_size=16)
    error = ((o.double() - want).norm() / want.norm()).item()
    assert error < 1e-5, error  # measured: 1.2e-7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"beta": torch.ones(2, 19, 3, dtype=torch.float64)}, r"beta must have shape \[B, T, H\]"),
        ({"kernel": "cosine"}, "kernel must be one of"),
        ({"mode": "fused"}, "mode must be one of"),
        ({"chunk_size": 0}, "chunk_size must be >= 1"),
        ({"u_queries": torch.ones(2, 19, 2, 5, dtype=torch.float64)}, "u_queries must have"),
        ({"scale": float("nan")}, "scale must be finite"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(change, message):
    q, k, v, beta = _inputs()
    with pytest.raises((ValueError, TypeError), match=message):
        deltaformer(q, k, v, **{"beta": beta, **change})
