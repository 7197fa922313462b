"""Retention (RetNet) and lightning attention, taken literally: linear attention whose state
decays by one constant per head.

    S_t = gamma S_{t-1} + k_t v_t^T,    o_t = S_t^T (scale q_t)

RetNet (Sun et al. 2023, eq. 1 and section 2.2) fixes gamma_h = 1 - 2^(-5 - h) for heads
h = 0 .. H - 1; lightning attention (Qin et al. 2024; fla's ``lightning_attn``) uses
gamma_h = exp(-(8 / H) (1 - layer_idx / num_layers) h). Spec section 10 (one decay per head).
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, same_rows, same_shape


def retention_decays(H: int) -> np.ndarray:
    """RetNet's gamma_h = 1 - 2^(-5 - h), h = 0 .. H - 1, float64."""
    return 1.0 - 2.0 ** (-5.0 - np.arange(H, dtype=np.float64))


def lightning_decays(H: int, layer_idx: int, num_layers: int) -> np.ndarray:
    """Lightning attention's gamma_h = exp(-(8 / H) (1 - layer_idx / num_layers) h), float64."""
    return np.exp(-(8.0 / H) * (1.0 - layer_idx / num_layers) * np.arange(H, dtype=np.float64))


def constant_decay(q, k, v, gamma, *, scale=1.0, initial_state=None):
    """The token loop of one head with the constant decay ``gamma`` in (0, 1]; returns
    (O [T, V], S_T [K, V]), float64. q, k: [T, K]; v: [T, V]; initial_state [K, V] or None."""
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    same_shape(("q", "k"), q, k)
    same_rows(("q", "v"), q, v)
    gamma, scale = as_real("gamma", gamma), as_real("scale", scale)
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
    S = np.zeros((q.shape[1], v.shape[1]))
    if initial_state is not None:
        S = as_matrix("initial_state", initial_state).copy()
        if S.shape != (q.shape[1], v.shape[1]):
            raise ValueError(f"initial_state must have shape {(q.shape[1], v.shape[1])}")
    out = np.empty((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        S = gamma * S + np.outer(k[t], v[t])
        out[t] = S.T @ (scale * q[t])
    return out, S
