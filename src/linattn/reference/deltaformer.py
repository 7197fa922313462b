"""The float64 oracle of DeltaFormer (Zhong et al. 2025, "Understanding Transformer from the
Perspective of Associative Memory"), one head, taken literally: the delta rule's pseudo-values with
a softmax kernel, then softmax attention over them.

    u_t = v_t - beta_t sum_{s < t} kappa_t(s) u_s,   kappa_t = softmax_{s < t}(c q'_t . k_s)
    o_t = sum_{s <= t} softmax_s(c q_t.k_s) u_s

with c = ``scale`` (1/sqrt(D) by default) and q' the write stage's queries: fla 0.6.0 (its
naive.py and kernel) uses q itself; the paper's associative-memory reading uses the keys,
q' = k. ``kernel="linear"`` replaces both softmaxes by the bare product c q.k (no
normalisation): then u is the delta rule's pseudo-value sequence (spec section 8), and with
q' = k, values beta_t v_t and scale 1 the output is the delta rule's (``linattn verify``).
"""

from __future__ import annotations

import numpy as np


def _weights(scores: np.ndarray, kernel: str) -> np.ndarray:
    if kernel == "linear" or scores.size == 0:
        return scores
    e = np.exp(scores - scores.max())
    return e / e.sum()


def deltaformer(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    beta: np.ndarray | None = None,
    scale: float | None = None,
    kernel: str = "softmax",
    u_queries: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """DeltaFormer for one head: q, k [T, D], v [T, V], beta [T] (None: ones), u_queries [T, D]
    (None: q, fla's). Returns (O [T, V], U [T, V]) by the loop of the module docstring."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    T, D = k.shape
    c = D**-0.5 if scale is None else float(scale)
    beta = np.ones(T) if beta is None else np.asarray(beta, dtype=np.float64)
    qu = q if u_queries is None else np.asarray(u_queries, dtype=np.float64)
    U = np.zeros_like(v)
    O = np.zeros_like(v)
    for t in range(T):
        w = _weights(c * (k[:t] @ qu[t]), kernel)
        U[t] = v[t] - beta[t] * (w @ U[:t])
        a = _weights(c * (k[: t + 1] @ q[t]), kernel)
        O[t] = a @ U[: t + 1]
    return O, U
