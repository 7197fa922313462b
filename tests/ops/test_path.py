"""PaTH attention's op (linattn.ops.path) against its literal float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops.path import path_attention, path_scores
from linattn.reference.path import path_attention as reference


def _inputs(B=2, T=19, HQ=2, H=2, D=5, V=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {"q": randn(B, T, HQ, D), "k": randn(B, T, H, D), "v": randn(B, T, H, V),
         "w": F.normalize(randn(B, T, H, D), dim=-1),
         "beta": 2 * torch.rand(B, T, H, generator=gen, dtype=torch.float64),
         "g": F.logsigmoid(randn(B, T, HQ) + 2)}  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}


def _oracle(x, scale=None):
    B, T, HQ, _ = x["q"].shape
    H = x["k"].shape[2]
    o = np.zeros((B, T, HQ, x["v"].shape[-1]))
    cache = np.zeros(x["k"].shape)
    for b in range(B):
        for h in range(HQ):
            kv = h // (HQ // H)
            heads = [x[n][b, :, kv].double().numpy() for n in ("k", "v", "w", "beta")]
            o[b, :, h], c = reference(x["q"][b, :, h].double().numpy(), *heads,
                                      x["g"][b, :, h].double().numpy(), scale=scale)  # fmt: skip
            cache[b, :, kv] = c
    return torch.from_numpy(o), torch.from_numpy(cache)


@pytest.mark.parametrize("mode", ["parallel", "chunk", "recurrent"])
@pytest.mark.parametrize("HQ", [2, 4])
def test_every_form_equals_the_reference(mode, HQ):
    x = _inputs(HQ=HQ)
    want, want_cache = _oracle(x, scale=0.4)
    o, cache = path_attention(**x, scale=0.4, mode=mode, chunk_size=4, return_k_cache=True)
    torch.testing.assert_close(o, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache, want_cache, rtol=0, atol=1e-12)


def test_the_scores_are_the_transported_keys():
    x = _inputs(B=1, T=9, D=4)
    a = path_scores(x["q"], x["k"], x["w"], x["beta"], mode="chunk", chunk_size=4)
    q, k, w, beta = (x[n][0, :, 0] for n in ("q", "k", "w", "beta"))
    t, s = 7, 2
    P = torch.eye(4, dtype=torch.float64)
    for i in range(s + 1, t + 1):
        P = (torch.eye(4, dtype=torch.float64) - beta[i] * torch.outer(w[i], w[i])) @ P
    torch.testing.assert_close(a[0, 0, t, s], q[t] @ P @ k[s], rtol=0, atol=1e-12)
    assert (a[0, 0].triu(1) == 0).all()


def test_gradients_pass_gradcheck_in_each_form():
    x = _inputs(B=1, T=6, HQ=1, H=1, D=3, V=2)
    leaves = tuple(x[n].requires_grad_(True) for n in ("q", "k", "v", "w", "beta", "g"))
    for mode in ("parallel", "chunk", "recurrent"):
        assert torch.autograd.gradcheck(
            lambda *t, mode=mode: path_attention(*t, mode=mode, chunk_size=4), leaves
        )


def test_packed_sequences_equal_the_sequences_one_by_one():
    x = _inputs(B=1, T=13)
    cu = torch.tensor([0, 1, 8, 13])
    o, cache = path_attention(**x, cu_seqlens=cu, chunk_size=4, return_k_cache=True)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        part, c = path_attention(**{n: t[:, a:b] for n, t in x.items()}, return_k_cache=True)
        torch.testing.assert_close(o[:, a:b], part, rtol=0, atol=1e-12)
        torch.testing.assert_close(cache[:, a:b], c, rtol=0, atol=1e-12)


def test_float32_error_against_float64():
    x = _inputs(B=1, T=64, D=16, V=16, dtype=torch.float32)
    want, _ = _oracle(x)
    o = path_attention(**x, mode="chunk", chunk_size=16)
    error = ((o.double() - want).norm() / want.norm()).item()
    assert error < 1e-5, error  # measured: 1.1e-7 to 1.2e-7 (the three forms)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"w": torch.ones(2, 19, 2, 4, dtype=torch.float64)}, "w must have k's shape"),
        ({"beta": torch.ones(2, 19, 3, dtype=torch.float64)}, r"beta must have shape \[B, T, H\]"),
        ({"g": torch.ones(2, 19, 2, dtype=torch.float64)}, "g is a log-decay"),
        ({"q": torch.ones(2, 19, 3, 5, dtype=torch.float64)}, "must be a multiple of"),
        ({"mode": "fused"}, "mode must be one of"),
        ({"chunk_size": 0}, "chunk_size must be >= 1"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(change, message):
    x = _inputs()
    with pytest.raises((ValueError, TypeError), match=message):
        path_attention(**{**x, **change})
