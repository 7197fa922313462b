"""HGRN and HGRN2, taken literally.

HGRN (Qin et al. 2023, eq. 3-4), in fla's parametrisation (``fla.ops.hgrn``): every channel d is
its own gated recurrence

    h_t = exp(g_t) * h_{t-1} + x_t,    o_t = h_t                     (x, g [T, D], g <= 0)

(the layer feeds x = (1 - f_t) * c_t and g = log f_t). HGRN2 (Qin et al. 2024, section 3.1)
expands the hidden state by an outer product: with the forget gate f_t in (0, 1)^K,

    S_t = Diag(f_t) S_{t-1} + (1 - f_t) v_t^T,    o_t = S_t^T (scale q_t)

which is GLA (spec section 10) with keys 1 - f_t and log-decays log f_t.
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, same_rows, same_shape


def hgrn(x, g, *, initial_state=None):
    """HGRN's recurrence; x, g: [T, D]; initial_state [D] or None; returns (O [T, D], h_T [D])."""
    x, g = as_matrix("x", x), as_matrix("g", g)
    same_shape(("x", "g"), x, g)
    h = np.zeros(x.shape[1])
    if initial_state is not None:
        h = np.asarray(initial_state, dtype=np.float64).copy()
        if h.shape != (x.shape[1],):
            raise ValueError(f"initial_state must have shape {(x.shape[1],)}, got {h.shape}")
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        h = np.exp(g[t]) * h + x[t]
        out[t] = h
    return out, h


def hgrn2(q, f, v, *, scale=1.0, initial_state=None):
    """HGRN2's recurrence for one head; q, f: [T, K] (f in (0, 1)), v: [T, V]; initial_state
    [K, V] or None; returns (O [T, V], S_T [K, V])."""
    q, f, v = as_matrix("q", q), as_matrix("f", f), as_matrix("v", v)
    same_shape(("q", "f"), q, f)
    same_rows(("q", "v"), q, v)
    scale = as_real("scale", scale)
    if np.any(f <= 0.0) or np.any(f > 1.0):
        raise ValueError("f (the forget gate) must lie in (0, 1]")
    S = np.zeros((q.shape[1], v.shape[1]))
    if initial_state is not None:
        S = as_matrix("initial_state", initial_state).copy()
        if S.shape != (q.shape[1], v.shape[1]):
            raise ValueError(f"initial_state must have shape {(q.shape[1], v.shape[1])}")
    out = np.empty((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        S = f[t][:, None] * S + np.outer(1.0 - f[t], v[t])
        out[t] = S.T @ (scale * q[t])
    return out, S
