"""DeepSeek Sparse Attention, taken literally for one key/value head and its G query heads: one
query at a time, its index scores one token at a time (DeepSeek-AI 2025, "DeepSeek-V3.2",
arXiv 2512.02556, section 2.1; the convention of fla 0.6.0's ``naive_dsa``):

    I_ts = sum_j w_tj ReLU(q^I_tj . k^I_s / sqrt(DI)),   s <= t
    S_t  = the topk tokens s <= t of largest I_ts, ties to the earlier token
    o_t  = sum_{s in S_t} softmax_s(scale q_t . k_s) v_s
"""

from __future__ import annotations

import math

import numpy as np


def deepseek_sparse_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_idx: np.ndarray,
    k_idx: np.ndarray,
    w_idx: np.ndarray | None,
    topk: int,
    scale: float | None = None,
) -> np.ndarray:
    """DSA of one key head (the module docstring): q [T, G, K], k [T, K], v [T, V], q_idx
    [T, HI, DI], k_idx [T, DI], w_idx [T, HI] or None (weights 1) -> o [T, G, V]."""
    q, k, v, q_idx, k_idx = (np.asarray(x, dtype=np.float64) for x in (q, k, v, q_idx, k_idx))
    if q.ndim != 3 or k.ndim != 2 or v.ndim != 2 or q_idx.ndim != 3 or k_idx.ndim != 2:
        raise ValueError(
            "q, q_idx must be [T, G, K], [T, HI, DI]; k, v, k_idx [T, K], [T, V], [T, DI]"
        )
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be an int >= 1, got {topk!r}")
    T, G, K = q.shape
    HI, DI = q_idx.shape[1:]
    w = np.ones((T, HI)) if w_idx is None else np.asarray(w_idx, dtype=np.float64)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    o = np.zeros((T, G, v.shape[1]))
    for t in range(T):
        index = []
        for s in range(t + 1):
            score = sum(w[t, j] * max(0.0, float(q_idx[t, j] @ k_idx[s]) / math.sqrt(DI))
                        for j in range(HI))  # fmt: skip
            index.append((-score, s))
        kept = [s for _, s in sorted(index)[:topk]]
        for g in range(G):
            logits = [scale * float(q[t, g] @ k[s]) for s in kept]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            Z = sum(weights)
            for weight, s in zip(weights, kept, strict=True):
                o[t, g] += (weight / Z) * v[s]
    return o
