"""Float64 oracle of gated slot attention (Zhang et al. 2024, "Gated Slot Attention for
Efficient Linear-Time Sequence Modeling", section 3), one head, token by token.

GSA keeps m memory slots: a key memory K~ and a value memory V~, each decayed per slot by the
gate alpha_t = exp(g_t) and written with the slot weights s_t; a query reads K~ into slot scores,
a softmax over the m slots turns them into probabilities, and those read V~:

    K~_t = Diag(alpha_t) K~_{t-1} + s_t k_t^T          (m x K)
    V~_t = Diag(alpha_t) V~_{t-1} + s_t v_t^T          (m x V)
    o_t  = V~_t^T softmax(K~_t (scale q_t))

(the paper writes s_t = 1 - alpha_t; fla 0.6.0's ops take s and g apart). States are returned
in fla's layout: S_k = K~^T (K x m) and S_v = V~ (m x V). Without g the slots follow ABC's
cumulative-softmax control (``linattn.reference.abc``'s definition, written as this recurrence):
s_t <- exp(s_t - z_t), g_t = z_{t-1} - z_t, z_t = log sum_{i <= t} exp(s_i), g_1 = 0.
"""

from __future__ import annotations

import numpy as np


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def abc_control(s) -> tuple[np.ndarray, np.ndarray]:
    """ABC's slot control of logits s [T, m]: (exp(s_t - z_t), z_{t-1} - z_t), z_0 := z_1."""
    s = np.asarray(s, dtype=np.float64)
    weights, gates = np.empty_like(s), np.empty_like(s)
    z_prev = None
    for t in range(s.shape[0]):
        z = np.logaddexp(z_prev, s[t]) if z_prev is not None else s[t].copy()
        weights[t] = np.exp(s[t] - z)
        gates[t] = 0.0 if z_prev is None else z_prev - z
        z_prev = z
    return weights, gates


def gated_slot_attention(q, k, v, s, g=None, *, scale=1.0, initial_state=None):
    """GSA on one head: q, k [T, K], v [T, V], s [T, m], g [T, m] or None (ABC's control);
    initial_state None or (S_k [K, m] or None, S_v [m, V] or None). Returns (O [T, V],
    (S_k [K, m], S_v [m, V])) in float64, the loop of the module docstring."""
    q, k, v, s = (np.asarray(x, dtype=np.float64) for x in (q, k, v, s))
    if q.shape != k.shape or v.shape[0] != q.shape[0] or s.shape[0] != q.shape[0]:
        raise ValueError("q, k must be [T, K], v [T, V] and s [T, m] with one T")
    if g is None:
        s, g = abc_control(s)
    g = np.asarray(g, dtype=np.float64)
    if g.shape != s.shape:
        raise ValueError(f"g must have the shape of s {s.shape}, got {g.shape}")
    T, K = q.shape
    m, V = s.shape[1], v.shape[1]
    Kt = np.zeros((m, K))  # K~ (slots x keys)
    Vt = np.zeros((m, V))
    if initial_state is not None:
        if initial_state[0] is not None:
            Kt = np.array(initial_state[0], dtype=np.float64).T.copy()
        if initial_state[1] is not None:
            Vt = np.array(initial_state[1], dtype=np.float64).copy()
    out = np.empty((T, V))
    for t in range(T):
        decay = np.diag(np.exp(g[t]))
        Kt = decay @ Kt + np.outer(s[t], k[t])
        Vt = decay @ Vt + np.outer(s[t], v[t])
        p = _softmax(Kt @ (scale * q[t]))
        out[t] = Vt.T @ p
    return out, (Kt.T.copy(), Vt)
