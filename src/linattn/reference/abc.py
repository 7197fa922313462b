"""Float64 oracle of ABC (Peng et al. 2022, "ABC: Attention with Bounded-memory Control",
section 3, the cumulative-softmax control of fla 0.6.0's ``chunk_abc``), one head.

ABC writes every token into m slots with weights phi normalised over the tokens seen so far,
and reads them with a softmax over the slots. Taken literally, as sums over the prefix:

    z_t   = log sum_{i <= t} exp(s_i)                         (per slot)
    K~_t  = sum_{i <= t} exp(s_i - z_t) k_i^T  (+ exp(z_1 - z_t) K~_0)     (m x K)
    V~_t  = sum_{i <= t} exp(s_i - z_t) v_i^T  (+ exp(z_1 - z_t) V~_0)     (m x V)
    o_t   = V~_t^T softmax(K~_t (scale q_t))

An initial state (K~_0, V~_0) is fla's: it enters the first token undecayed, then decays with
the normaliser from there (exp(z_1 - z_t)). States in fla's layout: S_k = K~^T, S_v = V~.
"""

from __future__ import annotations

import numpy as np


def abc(q, k, v, s, *, scale=1.0, initial_state=None):
    """ABC on one head: q, k [T, K], v [T, V], s [T, m] slot logits; initial_state None or
    (S_k [K, m] or None, S_v [m, V] or None). Returns (O [T, V], (S_k [K, m], S_v [m, V])),
    float64, each token's memories summed afresh over its prefix."""
    q, k, v, s = (np.asarray(x, dtype=np.float64) for x in (q, k, v, s))
    if q.shape != k.shape or v.shape[0] != q.shape[0] or s.shape[0] != q.shape[0]:
        raise ValueError("q, k must be [T, K], v [T, V] and s [T, m] with one T")
    T, K = q.shape
    m, V = s.shape[1], v.shape[1]
    K0, V0 = np.zeros((m, K)), np.zeros((m, V))
    if initial_state is not None:
        if initial_state[0] is not None:
            K0 = np.array(initial_state[0], dtype=np.float64).T
        if initial_state[1] is not None:
            V0 = np.array(initial_state[1], dtype=np.float64)
    out = np.empty((T, V))
    Kt, Vt = K0, V0
    for t in range(T):
        z = np.logaddexp.reduce(s[: t + 1], axis=0)  # [m]
        phi = np.exp(s[: t + 1] - z)  # [t + 1, m]
        carry = np.exp(s[0] - z)  # exp(z_1 - z_t): z_1 = s_1
        Kt = phi.T @ k[: t + 1] + carry[:, None] * K0
        Vt = phi.T @ v[: t + 1] + carry[:, None] * V0
        scores = Kt @ (scale * q[t])
        p = np.exp(scores - scores.max())
        out[t] = Vt.T @ (p / p.sum())
    return out, (Kt.T.copy(), Vt.copy())
