"""The generalized delta rule (issue 30): a diagonal-plus-low-rank transition, taken literally.

    S_t = A_t S_{t-1} + k_t v_t^T,    A_t = Diag(exp g_t) + a_t b_t^T,    o_t = S_t^T (scale q_t)

b_t reads the state entering the token (S_{t-1}) and a_t is the direction of that write (fla's
``dplr_recurrence`` with its ``alpha`` our b and its ``beta`` our a). Each transition is built as
the full K x K matrix: the slow, obviously right definition that the fast forms are tested
against. g: None (IPLR: Diag = I), [T] (one log-decay per step) or [T, K] (per channel).
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, same_rows, same_shape


def transition(a_t, b_t, g_t=None) -> np.ndarray:
    """The K x K matrix A_t = Diag(exp g_t) + a_t b_t^T of one step (g_t None, a number or [K])."""
    a_t, b_t = np.asarray(a_t, dtype=np.float64), np.asarray(b_t, dtype=np.float64)
    if g_t is None:
        decay = np.ones_like(a_t)
    else:
        decay = np.exp(np.asarray(g_t, dtype=np.float64)) * np.ones_like(a_t)
    return np.diag(decay) + np.outer(a_t, b_t)


def _gate(g, T: int, K: int):
    """g None, [T] or [T, K] as float64 (checked)."""
    if g is None:
        return None
    g = np.asarray(g, dtype=np.float64)
    if g.shape not in ((T,), (T, K)):
        raise ValueError(f"g must be None, [T] = {(T,)} or [T, K] = {(T, K)}, got {g.shape}")
    if np.isnan(g).any() or (g > 0).any():
        raise ValueError("g is a log-decay and must be <= 0 (and not NaN)")
    return g


def recurrence(q, k, v, a, b, g=None, *, scale=1.0, initial_state=None):
    """Run S_t = (Diag(exp g_t) + a_t b_t^T) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t) for one
    head; return (O [T, V], S_T [K, V]), float64.

    q, k, a, b: [T, K]; v: [T, V]; g: None, [T] or [T, K]; initial_state: [K, V] or None (zeros).
    """
    q, k, a, b = (as_matrix(n, x) for n, x in (("q", q), ("k", k), ("a", a), ("b", b)))
    v = as_matrix("v", v)
    for name, x in (("k", k), ("a", a), ("b", b)):
        same_shape(("q", name), q, x)
    same_rows(("q", "v"), q, v)
    scale = as_real("scale", scale)
    T, K = q.shape
    g = _gate(g, T, K)
    S = np.zeros((K, v.shape[1]))
    if initial_state is not None:
        S = as_matrix("initial_state", initial_state).copy()
        if S.shape != (K, v.shape[1]):
            raise ValueError(f"initial_state must have shape {(K, v.shape[1])}, got {S.shape}")
    out = np.empty((T, v.shape[1]))
    for t in range(T):
        A = transition(a[t], b[t], None if g is None else g[t])
        S = A @ S + np.outer(k[t], v[t])
        out[t] = S.T @ (scale * q[t])
    return out, S
