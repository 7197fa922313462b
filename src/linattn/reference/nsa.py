"""Native sparse attention, taken literally: one query at a time, for one key/value head and its
G query heads (Yuan et al., 2025; the convention of fla 0.6.0's ``naive_nsa``).

Query t mixes three softmax attentions with gates:

- compression: block c's key and value are the means of its tokens' (blocks of ``block_size``
  tokens, the last one partial); t sees the blocks with (c + 1) block_size - 1 <= t;
- selection: the blocks ranked by their compression probability averaged over the G heads, the
  first, the current and the previous block scored 1; the best ``block_counts`` of them that t
  may see (seen, or one of those three) are kept, and t attends to their tokens s <= t;
- sliding window: the keys t - window_size < s <= t (none with window_size = 0).

    o_t = g_slc o_slc + g_cmp o_cmp + g_swa o_swa.
"""

from __future__ import annotations

import math

import numpy as np


def _softmax_read(logits: list[float], values: list[np.ndarray], width: int) -> np.ndarray:
    if not logits:
        return np.zeros(width)
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    Z = sum(weights)
    return sum(((w / Z) * val for w, val in zip(weights, values, strict=True)), np.zeros(width))


def native_sparse_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g_cmp: np.ndarray,
    g_slc: np.ndarray,
    g_swa: np.ndarray,
    block_counts: int,
    block_size: int,
    window_size: int = 0,
    scale: float | None = None,
) -> np.ndarray:
    """NSA for one key/value head (the module docstring): q [T, G, K], k [T, K], v [T, V], the
    gates [T, G] -> o [T, G, V]. ``scale`` None means 1 / sqrt(K)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    T, G, K = q.shape
    V = v.shape[1]
    if k.shape != (T, K) or v.shape[0] != T:
        raise ValueError(f"k must have shape {(T, K)} and v {T} rows, got {k.shape}, {v.shape}")
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    BS, S = int(block_size), int(block_counts)
    NC = -(-T // BS)
    k_cmp = [k[c * BS : (c + 1) * BS].mean(axis=0) for c in range(NC)]
    v_cmp = [v[c * BS : (c + 1) * BS].mean(axis=0) for c in range(NC)]
    o = np.zeros((T, G, V))
    for t in range(T):
        seen = [c for c in range(NC) if (c + 1) * BS - 1 <= t]
        forced = {0, t // BS, t // BS - 1}
        score = dict.fromkeys(range(NC), 0.0)
        o_cmp = np.zeros((G, V))
        for j in range(G):
            logits = [scale * float(q[t, j] @ k_cmp[c]) for c in seen]
            o_cmp[j] = _softmax_read(logits, [v_cmp[c] for c in seen], V)
            if seen:
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                for c, w in zip(seen, weights, strict=True):
                    score[c] += w / sum(weights) / G
        for c in forced:
            if 0 <= c < NC:
                score[c] = 1.0
        ranked = sorted(range(NC), key=lambda c: (-score[c], c))[: min(S, NC)]
        kept = {c for c in ranked if c in seen or c in forced}
        selected = [s for s in range(t + 1) if s // BS in kept]
        window = [s for s in range(max(0, t - window_size + 1), t + 1)] if window_size else []
        for j in range(G):
            o_slc = _softmax_read([scale * float(q[t, j] @ k[s]) for s in selected],
                                  [v[s] for s in selected], V)  # fmt: skip
            o[t, j] = g_slc[t, j] * o_slc + g_cmp[t, j] * o_cmp[j]
            if window:
                o_swa = _softmax_read([scale * float(q[t, j] @ k[s]) for s in window],
                                      [v[s] for s in window], V)  # fmt: skip
                o[t, j] += g_swa[t, j] * o_swa
    return o
