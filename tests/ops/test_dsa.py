"""DeepSeek sparse attention (``linattn.ops.dsa``) against its float64 loop: grouped heads, packed
sequences with length-1 pieces, topk = 1 and topk >= T, given indices, ties, gradients,
refusals. fla's naive_dsa is pinned in tests/compat/test_dsa.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.ops.dsa import deepseek_sparse_attention, lightning_indexer
from linattn.reference.dsa import deepseek_sparse_attention as dsa_loop


def _inputs(T=13, HQ=4, H=2, K=8, V=5, HI=3, DI=6, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return {"q": normal(1, T, HQ, K), "k": normal(1, T, H, K), "v": normal(1, T, H, V),
            "q_idx": normal(1, T, HI, DI), "k_idx": normal(1, T, DI),
            "w_idx": normal(1, T, HI)}  # fmt: skip


def _loop(x, topk, cu=None, scale=None, weights=True):
    """The float64 loop over every key head and every packed piece."""
    T, HQ, H = x["q"].shape[1], x["q"].shape[2], x["k"].shape[2]
    G = HQ // H
    o = torch.zeros(1, T, HQ, x["v"].shape[-1], dtype=torch.float64)
    bounds = [0, T] if cu is None else cu
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b == a:
            continue
        n = {name: t[0, a:b].double().numpy() for name, t in x.items()}
        w = n["w_idx"] if weights else None
        for h in range(H):
            got = dsa_loop(n["q"][:, h * G : (h + 1) * G], n["k"][:, h], n["v"][:, h],
                           n["q_idx"], n["k_idx"], w, topk, scale)  # fmt: skip
            o[0, a:b, h * G : (h + 1) * G] = torch.from_numpy(got)
    return o


@pytest.mark.parametrize("topk", [1, 4, 13, 50])
@pytest.mark.parametrize("weights", [True, False])
def test_equals_the_float64_loop(topk, weights):
    x = _inputs()
    w = x["w_idx"] if weights else None
    o, indices = deepseek_sparse_attention(x["q"], x["k"], x["v"], x["q_idx"], x["k_idx"], w,
                                           topk=topk, scale=0.4)  # fmt: skip
    torch.testing.assert_close(o, _loop(x, topk, scale=0.4, weights=weights), rtol=0, atol=1e-12)
    assert indices.shape == (1, 13, topk) and indices.dtype == torch.long
    t = torch.arange(13)[:, None]
    visible = torch.minimum(t + 1, torch.tensor(topk))  # query t sees t + 1 tokens
    assert torch.equal((indices[0] >= 0).sum(-1, keepdim=True), visible)
    assert bool((indices[0] <= t).all())


def test_packed_sequences_equal_the_loop_per_piece():
    x = _inputs(T=20)
    cu = [0, 1, 9, 10, 20]
    o, indices = deepseek_sparse_attention(*x.values(), topk=3, cu_seqlens=torch.tensor(cu))
    torch.testing.assert_close(o, _loop(x, 3, cu), rtol=0, atol=1e-12)
    assert indices[0, 0].tolist() == [0, -1, -1] and indices[0, 9].tolist() == [0, -1, -1]
    assert int(indices[0, 10:].max()) < 10  # offsets within each piece


def test_keeping_every_token_is_causal_softmax_attention():
    x = _inputs()
    o, _ = deepseek_sparse_attention(*x.values(), topk=13)
    q, k, v = (x[n].transpose(1, 2) for n in ("q", "k", "v"))
    k, v = (t.repeat_interleave(2, dim=1) for t in (k, v))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(o, want, rtol=0, atol=1e-12)


def test_ties_go_to_the_earlier_token():
    x = _inputs()
    same = torch.ones_like(x["k_idx"])  # every past token scores the same
    indices = lightning_indexer(x["q_idx"].abs(), same, topk=3)
    assert indices[0, 12].tolist() == [0, 1, 2] and indices[0, 1].tolist() == [0, 1, -1]


def test_the_indexer_ranks_by_the_weighted_relu_scores():
    x = _inputs()
    indices = lightning_indexer(x["q_idx"], x["k_idx"], x["w_idx"], topk=4)
    scores = torch.einsum("thd,sd->ths", x["q_idx"][0], x["k_idx"][0]).relu() / 6**0.5
    scores = torch.einsum("ths,th->ts", scores, x["w_idx"][0])
    for t in range(4, 13):
        best = scores[t, : t + 1].argsort(descending=True, stable=True)[:4]
        assert indices[0, t].tolist() == best.tolist()
    plain = lightning_indexer(x["q_idx"], x["k_idx"], x["w_idx"], topk=4, activation=None)
    assert not torch.equal(plain, indices)  # the ReLU matters


def test_given_indices_count_each_visible_token_once():
    x = _inputs(T=6)
    given = torch.tensor([[0, -1], [1, 1], [0, 5], [2, 0], [-1, -1], [3, 4]])[None]
    o, used = deepseek_sparse_attention(x["q"], x["k"], x["v"], indices=given)
    assert used is given
    for t, keep in enumerate([[0], [1], [0], [0, 2], [], [3, 4]]):
        if not keep:
            assert bool((o[0, t] == 0).all())  # nothing visible: o_t = 0
            continue
        q, k, v = x["q"][0, t], x["k"][0, keep], x["v"][0, keep]
        k, v = (z.repeat_interleave(2, dim=1) for z in (k, v))  # [S, HQ, D]
        p = torch.softmax(torch.einsum("hd,shd->hs", q, k) / 8**0.5, dim=-1)
        torch.testing.assert_close(o[0, t], torch.einsum("hs,shd->hd", p, v), rtol=0, atol=1e-12)


def test_gradients_reach_q_k_v_through_the_kept_tokens():
    x = _inputs(T=7, HQ=2, H=1, K=3, V=2, HI=2, DI=3)

    def f(q, k, v):
        return deepseek_sparse_attention(q, k, v, x["q_idx"], x["k_idx"], x["w_idx"], topk=3)[0]

    leaves = [x[n].clone().requires_grad_() for n in ("q", "k", "v")]
    assert torch.autograd.gradcheck(f, leaves)
    q_idx = x["q_idx"].clone().requires_grad_()
    o, _ = deepseek_sparse_attention(*leaves, q_idx, x["k_idx"], topk=3)
    o.sum().backward()
    assert q_idx.grad is None  # the selection is not differentiable


def test_float32_is_near_the_loop():
    x = _inputs(dtype=torch.float32)
    o, _ = deepseek_sparse_attention(*x.values(), topk=4)
    assert o.dtype == torch.float32
    error = (o.double() - _loop(x, 4)).norm() / _loop(x, 4).norm()
    assert error < 1e-6, error


def test_refusals_name_the_argument():
    x = _inputs()
    q, k, v, qi, ki, wi = x.values()
    with pytest.raises(ValueError, match="q's heads"):
        deepseek_sparse_attention(q[:, :, :3], k, v, qi, ki, topk=2)
    with pytest.raises(ValueError, match="k must have shape"):
        deepseek_sparse_attention(q, k[..., :4], v, qi, ki, topk=2)
    with pytest.raises(ValueError, match="topk must be >= 1"):
        deepseek_sparse_attention(q, k, v, qi, ki, topk=0)
    with pytest.raises(TypeError, match="topk must be an int"):
        deepseek_sparse_attention(q, k, v, qi, ki, topk=2.0)
    with pytest.raises(ValueError, match="q_idx and k_idx are needed"):
        deepseek_sparse_attention(q, k, v, topk=2)
    with pytest.raises(ValueError, match="k_idx \\[B, T, DI\\]"):
        deepseek_sparse_attention(q, k, v, qi, ki[..., :2], topk=2)
    with pytest.raises(ValueError, match="w_idx must have shape"):
        deepseek_sparse_attention(q, k, v, qi, ki, wi[..., :2], topk=2)
    with pytest.raises(ValueError, match="indices must be -1 or an offset"):
        deepseek_sparse_attention(q, k, v, indices=torch.full((1, 13, 2), 13))
    with pytest.raises(TypeError, match="indices must be an integer tensor"):
        deepseek_sparse_attention(q, k, v, indices=torch.zeros(1, 13, 2))
    with pytest.raises(ValueError, match="indices must be -1 or an offset"):  # past its piece
        deepseek_sparse_attention(q, k, v, indices=torch.full((1, 13, 1), 5),
                                  cu_seqlens=torch.tensor([0, 5, 13]))  # fmt: skip
    with pytest.raises(ValueError, match="activation must be None or the name"):
        lightning_indexer(qi, ki, topk=2, activation="nope")
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        lightning_indexer(qi, ki, topk=2, cu_seqlens=torch.tensor([1, 13]))
