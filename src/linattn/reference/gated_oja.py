"""The gated Oja rule, taken literally (float64, one head, token by token).

Oja's rule (E. Oja, "A simplified neuron model as a principal component analyzer", J. Math.
Biology 15, 1982: dW = eta y (x - y W)) as a memory with a decay per value channel, as fla 0.6.0
computes it (``fla.ops.gated_oja_rule``):

    S'  = S_{t-1} Diag(exp gv_t)
    u_t = beta_t (k_t - S' v_t)
    S_t = S' + u_t v_t^T,        o_t = S_t^T (scale q_t)
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, as_vector


def recurrence(q, k, v, gv, beta, *, scale=1.0, initial_state=None):
    """Run the gated Oja rule for one head; return (O [T, V], S_T [K, V]).

    q, k: [T, K]; v: [T, V]; gv: None or [T, V] (log-decays); beta: [T]; initial_state: [K, V]
    or None (zeros).
    """
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    T, K = q.shape
    beta = as_vector("beta", beta, T)
    scale = as_real("scale", scale)
    gv = np.zeros_like(v) if gv is None else np.asarray(gv, dtype=np.float64)
    S = (
        np.zeros((K, v.shape[1]))
        if initial_state is None
        else as_matrix("S0", initial_state).copy()
    )
    out = np.empty((T, v.shape[1]))
    for t in range(T):
        S = S @ np.diag(np.exp(gv[t]))
        u = beta[t] * (k[t] - S @ v[t])
        S = S + np.outer(u, v[t])
        out[t] = S.T @ (scale * q[t])
    return out, S
