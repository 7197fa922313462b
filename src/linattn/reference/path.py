"""The float64 oracle of PaTH attention (Yang et al. 2025, "PaTH Attention: Position Encoding via
Accumulating Householder Transformations"), one head, taken literally.

Every token t carries a transition H_t = I - beta_t w_t w_t^T (a Householder-like matrix: a
reflection when beta_t = 2 and |w_t| = 1, the identity when beta_t = 0). The score of key s for
query t (s <= t) is the key carried through the transitions of the tokens after it:

    a_ts = q_t^T H_t H_{t-1} ... H_{s+1} k_s          (a_tt = q_t^T k_t)
    o_t  = sum_{s <= t} softmax_s(c (a_ts + G_t - G_s)) v_s,    G_t = g_1 + ... + g_t

with c = ``scale`` (1/sqrt(D) by default) and g an optional log forget gate (fla 0.6.0's
convention, from its naive.py and its kernel, which agree: the gate's difference is inside the
scale). ``k_cache`` is what decoding keeps: every key carried to the last token,
H_T ... H_{s+1} k_s.
"""

from __future__ import annotations

import numpy as np


def path_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    w: np.ndarray,
    beta: np.ndarray,
    g: np.ndarray | None = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """PaTH attention for one head: q, k, w [T, D], v [T, V], beta [T], g [T] or None. Returns
    (O [T, V], k_cache [T, D]) by the module docstring's definition, matrix by matrix."""
    q, k, v, w = (np.asarray(x, dtype=np.float64) for x in (q, k, v, w))
    T, D = k.shape
    beta = np.asarray(beta, dtype=np.float64)
    c = D**-0.5 if scale is None else float(scale)
    G = np.zeros(T) if g is None else np.cumsum(np.asarray(g, dtype=np.float64))
    H = [np.eye(D) - beta[i] * np.outer(w[i], w[i]) for i in range(T)]
    O = np.zeros((T, v.shape[1]))
    for t in range(T):
        # The query carried back instead of each key forward: r = (H_t ... H_{s+1})^T q_t for s
        # from t down, one transition per step (each H_i is symmetric), so the scores cost
        # O(T^2) products rather than a product of t - s matrices per pair.
        logits = np.zeros(t + 1)
        r = q[t].copy()
        for s in range(t, -1, -1):
            logits[s] = c * (r @ k[s] + G[t] - G[s])
            r = H[s].T @ r  # now (H_t ... H_s)^T q_t, for the key before
        p = np.exp(logits - logits.max())
        O[t] = (p / p.sum()) @ v[: t + 1]
    cache = np.zeros_like(k)
    for s in range(T):
        x = k[s].copy()
        for i in range(s + 1, T):
            x = H[i] @ x
        cache[s] = x
    return O, cache
