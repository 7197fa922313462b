"""compat's ``naive_dsa`` / ``naive_dsa_indexer`` vs fla 0.6.0's (``fla.ops.dsa``: PyTorch
reference code, fla's only DSA; no kernel, layer or model): T = 1, T = 20, packed sequences with
length-1 pieces, grouped heads, head weights or none, given indices; o, the indices and the
gradients of q, k, v (float32).

fla ranks with ``torch.topk``, whose order among equal scores is unspecified, and linattn breaks
ties toward the earlier token: every case checks first that its k-th and (k+1)-th best scores
differ, so that the two selections are the same set.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from linattn import compat

fla_dsa = pytest.importorskip("fla.ops.dsa.naive")

TOL = 1e-5


def _inputs(T, HQ=4, H=2, K=8, V=6, HI=4, DI=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, HQ, K, generator=gen), torch.randn(1, T, H, K, generator=gen)
    v = torch.randn(1, T, H, V, generator=gen)
    q_idx, k_idx = torch.randn(1, T, HI, DI, generator=gen), torch.randn(1, T, DI, generator=gen)
    return q, k, v, q_idx, k_idx, torch.rand(1, T, HI, generator=gen)


def _no_tie_at_the_cut(q_idx, k_idx, w_idx, topk, cu):
    bounds = [0, q_idx.shape[1]] if cu is None else cu
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        s = torch.einsum("thd,sd->ths", q_idx[0, a:b], k_idx[0, a:b]).relu()
        s = s.sum(1) if w_idx is None else torch.einsum("ths,th->ts", s, w_idx[0, a:b])
        for t in range(topk, b - a):
            best = s[t, : t + 1].sort(descending=True).values
            assert best[topk - 1] > best[topk], "the test's data has a tie at the cut"


def _sets(indices):
    return indices.sort(-1).values


CASES = [  # (T, cu_seqlens, topk, weights)
    pytest.param(1, None, 4, True, id="T1"),
    pytest.param(20, None, 4, True, id="T20"),
    pytest.param(20, None, 4, False, id="T20-unweighted"),
    pytest.param(20, None, 1, True, id="topk1"),
    pytest.param(20, [0, 1, 9, 10, 20], 3, True, id="packed"),
]


@pytest.mark.parametrize(("T", "cu", "topk", "weights"), CASES)
def test_naive_dsa_equals_fla_s(T, cu, topk, weights):
    q, k, v, q_idx, k_idx, w_idx = _inputs(T)
    w_idx = w_idx if weights else None
    _no_tie_at_the_cut(q_idx, k_idx, w_idx, topk, cu)
    cu_seqlens = None if cu is None else torch.tensor(cu)
    runs = []
    for dsa in (compat.naive_dsa, fla_dsa.naive_dsa):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o, indices = dsa(*leaves, q_idx, k_idx, w_idx, topk=topk, cu_seqlens=cu_seqlens,
                         return_indices=True)  # fmt: skip
        (o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum().backward()
        runs.append((o, indices, [x.grad for x in leaves]))
    (o, indices, grads), (fo, f_indices, f_grads) = runs
    assert o.dtype == fo.dtype and indices.shape == f_indices.shape
    assert torch.equal(_sets(indices), _sets(f_indices))
    torch.testing.assert_close(o, fo, rtol=TOL, atol=TOL)
    for a, b in zip(grads, f_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_naive_dsa_indexer_equals_fla_s(activation):
    _, _, _, q_idx, k_idx, w_idx = _inputs(20)
    cu_seqlens = torch.tensor([0, 1, 12, 20])
    ours = compat.naive_dsa_indexer(q_idx, k_idx, w_idx, 5, 0.3, activation, cu_seqlens)
    theirs = fla_dsa.naive_dsa_indexer(q_idx, k_idx, w_idx, 5, 0.3, activation, cu_seqlens)
    assert torch.equal(_sets(ours), _sets(theirs))
    assert torch.equal(ours, theirs)  # no ties: the same order too, best first


def test_given_indices_equal_fla_s():
    q, k, v, q_idx, k_idx, _ = _inputs(10)
    gen = torch.Generator().manual_seed(3)
    given = torch.randint(-1, 10, (1, 10, 4), generator=gen)
    given[:, :, 0] = torch.arange(10)  # every query keeps a visible token (fla: NaN otherwise)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = compat.naive_dsa(q, k, v, q_idx, k_idx, indices=given)
    assert any("lightning indexer is skipped" in str(w.message) for w in caught)
    fo = fla_dsa.naive_dsa(q, k, v, None, None, indices=given)
    torch.testing.assert_close(o, fo, rtol=TOL, atol=TOL)


def test_refusals_name_the_argument():
    q, k, v, q_idx, k_idx, w_idx = _inputs(6)
    with pytest.raises(TypeError, match="return_indices must be a bool"):
        compat.naive_dsa(q, k, v, q_idx, k_idx, return_indices=1)
    with pytest.raises(ValueError, match="q's heads"):
        compat.naive_dsa(q[:, :, :3], k, v, q_idx, k_idx)
    with pytest.raises(ValueError, match="topk must be >= 1"):
        compat.naive_dsa_indexer(q_idx, k_idx, w_idx, 0)
