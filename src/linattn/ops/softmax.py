"""Softmax attention (spec section 2): O = softmax(Q K^T * scale, causal mask) V.

The fused path is PyTorch's ``scaled_dot_product_attention``; the plain path writes the three steps
of section 2 out (scores, row-wise softmax with the row maximum subtracted, weighted sum) and is the
one used when the fused kernel is not asked for. Both are tested against each other.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops import checks as _checks


def causal_mask(T_q: int, T_k: int, device: torch.device | None = None) -> Tensor:
    """Boolean [T_q, T_k], True where query i may see key j: j <= i + (T_k - T_q).

    The queries are the last T_q positions of the T_k keys (bottom-right alignment), so a single
    query against a KV cache of length T_k sees every key: the generation step.
    """
    offset = T_k - T_q
    rows = torch.arange(T_q, device=device)[:, None]
    cols = torch.arange(T_k, device=device)[None, :]
    return cols <= rows + offset


def plain_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Section 2 step by step for [B, H, T, D] tensors: scores, softmax by rows, weighted sum."""
    scores = (q @ k.transpose(-1, -2)) * scale  # [B, H, T_q, T_k]
    if scores.shape[-1] == 0:  # no keys, hence no queries (T_q <= T_k): an empty output
        return scores @ v
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # Subtracting each row's maximum leaves the softmax unchanged and prevents overflow.
    scores = scores - scores.amax(dim=-1, keepdim=True).detach()
    weights = torch.exp(scores)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights @ v


def _attend(q, k, v, causal: bool, scale: float, fused: bool) -> Tensor:
    """[B, T, H, D] in and out; one batch of equal-length sequences."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, T, D]
    mask = causal_mask(q.shape[2], k.shape[2], q.device) if causal else None
    if fused:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    else:
        o = plain_attention(q, k, v, mask, scale)
    return o.transpose(1, 2)


def softmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    cu_seqlens: Tensor | None = None,
    fused: bool = True,
) -> Tensor:
    """o_i = sum_j softmax_j(scale q_i^T k_j) v_j over the keys j that query i may see (section 2).

    Args:
        q: [B, T_q, H, K]; k: [B, T_k, H, K]; v: [B, T_k, H, V]; one floating dtype.
        causal: mask the future. With T_q < T_k the queries are the last T_q positions (a query
            against a KV cache), so T_q <= T_k is required.
        scale: None means 1 / sqrt(K).
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1, T_q = T_k); each
            sequence attends only to itself.
        fused: use ``torch.nn.functional.scaled_dot_product_attention`` (default) or the plain
            three-step form of section 2.

    Returns:
        o: [B, T_q, H, V] in the input dtype.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(name, x, 4)
    causal = _checks.flag("causal", causal)
    fused = _checks.flag("fused", fused)
    B, T_q, H, K = q.shape
    if k.shape[0] != B or k.shape[2:] != q.shape[2:]:
        raise ValueError(
            f"k must have shape [B, T_k, H, K] = [{B}, T_k, {H}, {K}], got {tuple(k.shape)}"
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape [B, T_k, H, V] with B, T_k, H = {tuple(k.shape[:3])}"
            f", got {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    _checks.head_sizes("q, k, v", K, v.shape[3])
    if T_q > 0 and k.shape[1] < 1:
        raise ValueError(f"k needs at least one token for the T_q = {T_q} queries, got T_k = 0")
    if causal and T_q > k.shape[1]:
        raise ValueError(f"causal attention needs T_q <= T_k, got q {T_q} and k {k.shape[1]}")
    _checks.scale(scale)
    if cu_seqlens is not None and T_q != k.shape[1]:
        raise ValueError("cu_seqlens needs q and k of the same length T")
    _checks.seqlens(cu_seqlens, B, T_q)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    if cu_seqlens is None:
        return _attend(q, k, v, causal, scale, fused)
    bounds = cu_seqlens.tolist()
    parts = [
        _attend(q[:, a:b], k[:, a:b], v[:, a:b], causal, scale, fused)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(parts, dim=1)
