"""Mixture of block attention (MoBA; Lu et al., 2025), taken literally for one head: one query
at a time, its blocks chosen one by one (the convention of fla 0.6.0's ``parallel_moba``).

Blocks of ``chunk_size`` tokens; query t scores each block that ends before its own block
starts by q_t^T (the block's mean key), keeps the ``topk - 1`` best, and attends in one softmax
(scale 1 / sqrt(K)) to their tokens and to its own block's tokens s <= t. With topk = 1 it
attends to every s <= t (fla's shortcut to causal attention).
"""

from __future__ import annotations

import math

import numpy as np


def mixture_of_block_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, chunk_size: int, topk: int
) -> np.ndarray:
    """MoBA of one head (the module docstring): q, k [T, K], v [T, V] -> o [T, V]."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    T, K = q.shape
    C = int(chunk_size)
    scale = 1.0 / math.sqrt(K)
    o = np.zeros((T, v.shape[1]))
    for t in range(T):
        own = t // C
        gates = {c: float(q[t] @ k[c * C : (c + 1) * C].mean(axis=0)) for c in range(own)}
        kept = sorted(gates, key=lambda c: (-gates[c], c))[: max(0, topk - 1)]
        keys = [s for c in sorted(kept) for s in range(c * C, (c + 1) * C)]
        keys += list(range(own * C if topk > 1 else 0, t + 1))  # topk = 1: causal attention
        logits = [scale * float(q[t] @ k[s]) for s in keys]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        Z = sum(weights)
        for w, s in zip(weights, keys, strict=True):
            o[t] += (w / Z) * v[s]
    return o
