"""LightNet (Qin et al. 2024, "You only scan once"), taken literally as fla 0.6.0 computes it
(``fla.ops.lightnet``: ``fla.ops.gsa.gate.fused_additive_gate``, then GLA).

Per key channel c the keys are a softmax over time so far: with the log-normaliser
z_t = log(exp(z_{t-1}) + exp(x_t)) (z_0 = -inf, or the given initial log-normaliser),

    S_t = sum_{s <= t} exp(x_s - z_t) v_s^T  (+ exp(z_0 - z_t) S_0)
        = Diag(exp(z_{t-1} - z_t)) S_{t-1} + exp(x_t - z_t) v_t^T,    o_t = S_t^T (scale q_t)

i.e. GLA (spec section 10) with keys exp(x_t - z_t) and log-decays z_{t-1} - z_t (0 while
z_{t-1} = -inf).
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, same_rows, same_shape


def lightnet(q, x, v, *, scale=1.0, initial_state=None, initial_normalizer=None):
    """The token loop for one head: q, x (key logits): [T, K]; v: [T, V]; initial_state
    [K, V] or None; initial_normalizer [K] (log-space, -inf allowed) or None. Returns
    (O [T, V], S_T [K, V], z_T [K])."""
    q, x, v = as_matrix("q", q), as_matrix("x", x), as_matrix("v", v)
    same_shape(("q", "x"), q, x)
    same_rows(("q", "v"), q, v)
    scale = as_real("scale", scale)
    K, V = q.shape[1], v.shape[1]
    S = np.zeros((K, V)) if initial_state is None else as_matrix("initial_state", initial_state)
    if S.shape != (K, V):
        raise ValueError(f"initial_state must have shape {(K, V)}, got {S.shape}")
    z = np.full(K, -np.inf)
    if initial_normalizer is not None:
        z = np.asarray(initial_normalizer, dtype=np.float64).copy()
        if z.shape != (K,):
            raise ValueError(f"initial_normalizer must have shape {(K,)}, got {z.shape}")
    out = np.empty((q.shape[0], V))
    for t in range(q.shape[0]):
        z_new = np.logaddexp(z, x[t])
        decay = np.where(z == -np.inf, 1.0, np.exp(z - z_new))
        S = decay[:, None] * S + np.outer(np.exp(x[t] - z_new), v[t])
        z = z_new
        out[t] = S.T @ (scale * q[t])
    return out, S, z
