"""The momentum delta rule, taken literally (float64, one head, token by token).

Momentum DeltaNet (arXiv:2605.05838), as fla 0.6.0 computes it (``fla.ops.momentum_delta_rule``):
the delta rule's gradient step with heavy-ball momentum, a second state M next to the memory S:

    w_t = v_t - S_{t-1}^T p_t
    M_t = exp(log_mu_t) M_{t-1} - eta_t k_t w_t^T
    S_t = exp(log_alpha_t) S_{t-1} - beta_t M_t,        o_t = S_t^T (scale q_t)
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, as_vector


def recurrence(
    q, k, v, p, log_alpha, log_mu, beta, eta, *, scale=1.0, initial_state=None,
    initial_momentum=None,
):  # fmt: skip
    """Run the momentum delta rule for one head; return (O [T, V], S_T [K, V], M_T [K, V]).

    q, k, p: [T, K]; v: [T, V]; log_alpha, log_mu, beta, eta: [T]; initial_state and
    initial_momentum: [K, V] or None (zeros).
    """
    q, k, v, p = (as_matrix(n, x) for n, x in (("q", q), ("k", k), ("v", v), ("p", p)))
    T, K = q.shape
    log_alpha, log_mu, beta, eta = (
        as_vector(n, x, T)
        for n, x in (("log_alpha", log_alpha), ("log_mu", log_mu), ("beta", beta), ("eta", eta))
    )
    scale = as_real("scale", scale)
    zeros = np.zeros((K, v.shape[1]))
    S = zeros if initial_state is None else as_matrix("initial_state", initial_state).copy()
    M = (
        zeros
        if initial_momentum is None
        else as_matrix("initial_momentum", initial_momentum).copy()
    )
    out = np.empty((T, v.shape[1]))
    for t in range(T):
        w = v[t] - S.T @ p[t]
        M = np.exp(log_mu[t]) * M - eta[t] * np.outer(k[t], w)
        S = np.exp(log_alpha[t]) * S - beta[t] * M
        out[t] = S.T @ (scale * q[t])
    return out, S, M
