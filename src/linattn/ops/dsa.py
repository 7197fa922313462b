"""DeepSeek Sparse Attention (DSA; DeepSeek-AI 2025, "DeepSeek-V3.2", arXiv 2512.02556, section
2.1), as fla 0.6.0's ``naive_dsa`` defines it (fla has no kernel for it).

A lightning indexer scores every past token s of query t with HI small index heads, one index key
per token shared by the heads, and keeps the ``topk`` best; each query head then attends, in one
softmax, to the kept tokens only (shared by all heads):

    I_ts = sum_j w_tj ReLU(scale_I q^I_tj . k^I_s),   s <= t           (the index score, eq. 1)
    S_t  = the topk tokens s <= t of largest I_ts (all of them when t + 1 <= topk)
    o_t  = sum_{s in S_t} softmax_s(scale q_t . k_s) v_s                (eq. 2)

with scale_I = 1 / sqrt(DI) (it does not change the ranking), w = 1 for every head when none is
given, and scale = 1 / sqrt(K) by default. Ties in I_ts are broken toward the earlier token, so
the selection is a function of the scores (torch.topk's order among ties is not specified). The
selection is not differentiable: gradients reach q, k and v, not the indexer's inputs (the paper
trains the indexer by a separate KL loss). A precomputed selection may be given instead of the
indexer's inputs: entries -1 are empty slots, a token s > t is ignored, a token listed twice
counts once, and a query left with no token reads o_t = 0 (fla's naive code gives NaN).

Key and value heads may be grouped: q has HQ = G * H heads, and query head h reads key head
h // G. The attention gathers the kept keys of each query: O(T topk) work and memory beside
the indexer's O(T^2) scores.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks


def _scores(q_idx: Tensor, k_idx: Tensor, w_idx: Tensor | None, scale: float, act) -> Tensor:
    """I [T, S] of one sequence (eq. 1) before the causal mask."""
    score = act(torch.einsum("thd,sd->hts", q_idx, k_idx) * scale)
    if w_idx is None:
        return score.sum(0)
    return torch.einsum("hts,th->ts", score, w_idx)


def _select(q_idx: Tensor, k_idx: Tensor, w_idx: Tensor | None, topk: int, scale: float,
            act) -> Tensor:  # fmt: skip
    """The kept tokens [T, topk] of one sequence, best first, -1 in the empty slots."""
    T = q_idx.shape[0]
    t = torch.arange(T, device=q_idx.device)
    future = t[None, :] > t[:, None]
    scores = _scores(q_idx, k_idx, w_idx, scale, act).masked_fill(future, -math.inf)
    # stable sort: equal scores keep the earlier token first; future tokens sort last
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, : min(topk, T)]
    order = order.masked_fill(order > t[:, None], -1)
    return F.pad(order, (0, topk - order.shape[1]), value=-1)


def _attend(q: Tensor, k: Tensor, v: Tensor, indices: Tensor, scale: float) -> Tensor:
    """o [T, HQ, V] of one sequence: each query's softmax over its kept tokens (eq. 2)."""
    T, HQ, K = q.shape
    H = k.shape[1]
    t = torch.arange(T, device=q.device)[:, None]
    # a token counts once however often it is listed; -1 and future tokens not at all
    idx, _ = torch.sort(indices, dim=-1)
    repeated = torch.zeros_like(idx, dtype=torch.bool)
    repeated[:, 1:] = idx[:, 1:] == idx[:, :-1]
    keep = (idx >= 0) & (idx <= t) & ~repeated  # [T, S]
    at = idx.clamp(min=0)
    k_sel, v_sel = k[at], v[at]  # [T, S, H, K], [T, S, H, V]
    qg = q.reshape(T, H, HQ // H, K)
    logits = scale * torch.einsum("thgk,tshk->thgs", qg, k_sel)
    logits = logits.masked_fill(~keep[:, None, None, :], -math.inf)
    anything = keep.any(-1)[:, None, None, None]
    p = torch.softmax(logits.masked_fill(~anything, 0.0), dim=-1) * anything
    return torch.einsum("thgs,tshv->thgv", p, v_sel).reshape(T, HQ, v.shape[-1])


def _pieces(cu_seqlens: Tensor | None, B: int, T: int) -> list[tuple[int, int, int]]:
    """(row, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    bounds = cu_seqlens.tolist()
    return [(0, a, e) for a, e in zip(bounds[:-1], bounds[1:], strict=True) if e > a]


def _check_indexer(q_idx, k_idx, w_idx, B: int, T: int) -> None:
    _checks.tensor("q_idx", q_idx, 4)
    _checks.tensor("k_idx", k_idx, 3)
    if q_idx.shape[:2] != (B, T) or k_idx.shape != (B, T, q_idx.shape[3]):
        raise ValueError(
            f"q_idx must have shape [B, T, HI, DI] and k_idx [B, T, DI] with B, T = {(B, T)} and "
            f"one DI, got {tuple(q_idx.shape)} and {tuple(k_idx.shape)}"
        )
    if w_idx is not None:
        _checks.tensor("w_idx", w_idx, 3)
        if w_idx.shape != q_idx.shape[:3]:
            raise ValueError(
                f"w_idx must have shape [B, T, HI] = {tuple(q_idx.shape[:3])}, got "
                f"{tuple(w_idx.shape)}"
            )


def _activation(activation: object):
    if activation is None:
        return lambda x: x
    function = getattr(F, activation, None) if isinstance(activation, str) else None
    if not callable(function) or activation.startswith("_"):
        raise ValueError(
            f"activation must be None or the name of a torch.nn.functional function such as "
            f"'relu', got {activation!r}"
        )
    return function


def _check_topk(topk: object) -> int:
    topk = _checks.integer("topk", topk)
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    return topk


def lightning_indexer(
    q_idx: Tensor,
    k_idx: Tensor,
    w_idx: Tensor | None = None,
    *,
    topk: int,
    scale: float | None = None,
    activation: str | None = "relu",
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """DSA's lightning indexer (the module docstring, eq. 1): for every query t the ``topk``
    tokens s <= t of largest I_ts = sum_j w_tj ReLU(scale q_idx_tj . k_idx_s), best first.

    Args:
        q_idx: [B, T, HI, DI] index queries; k_idx: [B, T, DI] one index key per token;
            w_idx: [B, T, HI] head weights (None: 1 each).
        topk: tokens kept per query (>= 1). scale: None is 1 / sqrt(DI).
        activation: the name of a ``torch.nn.functional`` function applied to each head's
            product before the weighted sum (DSA's ReLU; None: none).
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1).

    Returns:
        indices: [B, T, topk] int64, offsets within each sequence, ties toward the earlier
        token, -1 in the slots past the t + 1 tokens query t can see.
    """
    _checks.tensor("q_idx", q_idx, 4)
    B, T = q_idx.shape[:2]
    _check_indexer(q_idx, k_idx, w_idx, B, T)
    topk = _check_topk(topk)
    _checks.scale(scale)
    _checks.seqlens(cu_seqlens, B, T)
    act = _activation(activation)
    scale = q_idx.shape[-1] ** -0.5 if scale is None else float(scale)
    dtype = compute_dtype(q_idx.dtype)
    qi, ki = q_idx.detach().to(dtype), k_idx.detach().to(dtype)
    wi = None if w_idx is None else w_idx.detach().to(dtype)
    indices = torch.full((B, T, topk), -1, dtype=torch.long, device=q_idx.device)
    for b, a, e in _pieces(cu_seqlens, B, T):
        w = None if wi is None else wi[b, a:e]
        indices[b, a:e] = _select(qi[b, a:e], ki[b, a:e], w, topk, scale, act)
    return indices


def deepseek_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_idx: Tensor | None = None,
    k_idx: Tensor | None = None,
    w_idx: Tensor | None = None,
    *,
    topk: int = 2048,
    indices: Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """DeepSeek Sparse Attention (the module docstring): each query attends in one softmax to the
    ``topk`` past tokens its lightning indexer scores best, or to ``indices`` when given.

    Args:
        q: [B, T, HQ, K]; k: [B, T, H, K]; v: [B, T, H, V] (HQ = G * H); one floating dtype.
        q_idx, k_idx, w_idx: the indexer's inputs (``lightning_indexer``); unused with indices.
        topk: tokens kept per query (>= 1).
        indices: [B, T, S] int64 selection (offsets within each sequence, -1 empty), instead
            of the indexer.
        scale: None is 1 / sqrt(K).
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1).

    Returns:
        (o [B, T, HQ, V] in v's dtype, computed in float32 or float64; the selection used
        [B, T, S]).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(name, x, 4)
    B, T, HQ, K = q.shape
    if k.shape[:2] != (B, T) or k.shape[3] != K or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"k must have shape [B, T, H, K] and v [B, T, H, V] with B, T, K = {(B, T, K)}, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    H = k.shape[2]
    if H == 0 or HQ % H:
        raise ValueError(f"q's heads ({HQ}) must be a multiple of k's and v's heads ({H})")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    topk = _check_topk(topk)
    _checks.scale(scale)
    _checks.seqlens(cu_seqlens, B, T)
    if indices is None:
        if q_idx is None or k_idx is None:
            raise ValueError("q_idx and k_idx are needed when no indices are given")
        _check_indexer(q_idx, k_idx, w_idx, B, T)
    else:
        _check_indices(indices, B, T, cu_seqlens)
    scale = K**-0.5 if scale is None else float(scale)
    if indices is None:
        indices = lightning_indexer(q_idx, k_idx, w_idx, topk=topk, cu_seqlens=cu_seqlens)
    dtype = compute_dtype(q.dtype)
    qc, kc, vc = (x.to(dtype) for x in (q, k, v))
    o = qc.new_zeros(B, T, HQ, v.shape[-1])
    for b, a, e in _pieces(cu_seqlens, B, T):
        o[b, a:e] = _attend(qc[b, a:e], kc[b, a:e], vc[b, a:e], indices[b, a:e], scale)
    return o.to(v.dtype), indices


def _check_indices(indices: object, B: int, T: int, cu_seqlens: Tensor | None) -> None:
    if not isinstance(indices, Tensor):
        raise TypeError(f"indices must be a torch.Tensor, got {type(indices).__name__}")
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
        raise TypeError(f"indices must be an integer tensor, got {indices.dtype}")
    if indices.dim() != 3 or indices.shape[:2] != (B, T) or indices.shape[2] < 1:
        raise ValueError(
            f"indices must have shape [B, T, S] with B, T = {(B, T)} and S >= 1, got "
            f"{tuple(indices.shape)}"
        )
    if cu_seqlens is None:
        length = torch.full((T,), T, device=indices.device)
    else:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(indices.device)
        length = torch.repeat_interleave(lengths, lengths)
    if indices.numel() and bool(((indices < -1) | (indices >= length[None, :, None])).any()):
        raise ValueError(
            "indices must be -1 or an offset within the query's own sequence (0 <= s < its length)"
        )
