"""RWKV-4's WKV (Peng et al. 2023, eq. 14), taken literally: per channel c, with the decay
w_c > 0 per token, the bonus u_c and weights exp(k_t),

    wkv_t = (a_{t-1} + exp(u + k_t) v_t) / (b_{t-1} + exp(u + k_t))
    a_t = exp(-w) a_{t-1} + exp(k_t) v_t,    b_t = exp(-w) b_{t-1} + exp(k_t)

(a, b: the numerator and denominator states). fla 0.6.0 (``fused_recurrent_rwkv4``) takes the
parameter w with decay exp(-exp(w)) and stores the states as (alpha, beta, eps) with
a = alpha exp(eps), b = beta exp(eps), eps_t = max(eps_{t-1} - exp(w), k_t) its running
maximum (a max-plus recurrence, which this module runs as literally as the sums).
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_vector, same_shape


def wkv(w, u, k, v, *, initial_state=None):
    """The WKV of one sequence: w, u [C] (fla's parameters: decay exp(-exp(w))); k, v [T, C];
    initial_state [3, C] (alpha, beta, eps) or None (a = b = 0, eps = -1e38 as fla's models
    start it). Returns (wkv [T, C], state [3, C] in fla's (alpha, beta, eps))."""
    k, v = as_matrix("k", k), as_matrix("v", v)
    same_shape(("k", "v"), k, v)
    C = k.shape[1]
    w, u = as_vector("w", w, C), as_vector("u", u, C)
    decay = -np.exp(w)  # the log-decay per token
    if initial_state is None:
        alpha, beta, eps = np.zeros(C), np.zeros(C), np.full(C, -1e38)
    else:
        state = np.asarray(initial_state, dtype=np.float64)
        if state.shape != (3, C):
            raise ValueError(f"initial_state must have shape {(3, C)}, got {state.shape}")
        alpha, beta, eps = state
    a, b = alpha * np.exp(eps), beta * np.exp(eps)  # the sums themselves
    out = np.empty_like(k)
    for t in range(k.shape[0]):
        bonus = np.exp(u + k[t])
        out[t] = (a + bonus * v[t]) / (b + bonus)
        a = np.exp(decay) * a + np.exp(k[t]) * v[t]
        b = np.exp(decay) * b + np.exp(k[t])
        eps = np.maximum(eps + decay, k[t])
    return out, np.stack([a * np.exp(-eps), b * np.exp(-eps), eps])
