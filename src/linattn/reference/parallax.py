"""Parallax attention, taken literally: one query at a time (fla 0.6.0's ``naive_parallax``,
"parameterized local linear attention", Algorithm 1 of arXiv 2605.29157).

Query t's softmax weights P_ts over its keys s (t - window_size < s <= t) are corrected to first
order by a second query r_t, whose scores r_t^T k_s are not scaled:

    P_ts = exp(scale q_t^T k_s) / sum_u exp(scale q_t^T k_u),   c_t = sum_s P_ts r_t^T k_s,
    o_t = sum_s P_ts (1 + c_t - r_t^T k_s) v_s.
"""

from __future__ import annotations

import math

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_real, same_rows, same_shape


def parallax(
    q: np.ndarray,
    r: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float | None = None,
    window_size: int | None = None,
) -> np.ndarray:
    """Parallax attention of one head (the module docstring): q, r, k [T, K], v [T, V] -> o."""
    q, r, k, v = (as_matrix(n, x) for n, x in (("q", q), ("r", r), ("k", k), ("v", v)))
    same_shape(("q", "r"), q, r)
    same_shape(("q", "k"), q, k)
    same_rows(("q", "v"), q, v)
    T = q.shape[0]
    scale = 1.0 / math.sqrt(q.shape[1]) if scale is None else as_real("scale", scale)
    window = T if window_size is None else as_positive_int("window_size", window_size)
    o = np.zeros((T, v.shape[1]))
    for t in range(T):
        keys = range(max(0, t - window + 1), t + 1)
        logits = [scale * float(q[t] @ k[s]) for s in keys]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        Z = sum(weights)
        P = [w / Z for w in weights]
        c = sum(p * float(r[t] @ k[s]) for p, s in zip(P, keys, strict=True))
        for p, s in zip(P, keys, strict=True):
            o[t] += p * (1.0 + c - float(r[t] @ k[s])) * v[s]
    return o
