"""Preconditioned DeltaNet's memory, taken literally (float64, one head, token by token).

Preconditioned DeltaNet: Curvature-aware Sequence Modeling for Linear Recurrences
(arXiv:2604.21100), as fla 0.6.0 computes it (``fla.ops.precond_gated_delta_rule``,
``fla.ops.precond_kda``). A diagonal curvature estimate A_t (the "ATK" state) preconditions the
key the delta rule writes along:

    A_t  = exp(g_atk_t) A_{t-1} + beta_atk_t k_t * k_t
    r_t  = log(A_t + eps) - c,   s_t = r_t / (1 + |r_t|),   kp_t = x^(-s_t) * k_t
    S'   = D_t S_{t-1}                     (D_t = exp(g_t), or Diag(exp g_t) per key channel)
    S_t  = S' + beta_t kp_t (v_t - S'^T k_t)^T,    o_t = S_t^T (scale q_t)

The read key k and the write key kp differ: the transition I - beta kp k^T is not symmetric.
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_real, as_vector


def recurrence(
    q, k, v, g_atk, beta_atk, beta, g=None, *, x=1.5, eps=1e-6, center=-0.2, scale=1.0,
    initial_state=None, initial_A_state=None,
):  # fmt: skip
    """Run the preconditioned delta rule for one head; return (O [T, V], S_T [K, V], A_T [K]).

    q, k: [T, K]; v: [T, V]; g_atk, beta_atk, beta: [T]; g: None, [T] or [T, K];
    center: the head's log_atk_scale; initial_state [K, V], initial_A_state [K] (or None: 0).
    """
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    T, K = q.shape
    g_atk = as_vector("g_atk", g_atk, T)
    beta_atk = as_vector("beta_atk", beta_atk, T)
    beta = as_vector("beta", beta, T)
    scale, x, eps, center = (
        as_real(n, t) for n, t in (("scale", scale), ("x", x), ("eps", eps), ("center", center))
    )
    S = (
        np.zeros((K, v.shape[1]))
        if initial_state is None
        else as_matrix("S0", initial_state).copy()
    )
    A = np.zeros(K) if initial_A_state is None else np.asarray(initial_A_state, np.float64).copy()
    g = None if g is None else np.asarray(g, dtype=np.float64)
    out = np.empty((T, v.shape[1]))
    for t in range(T):
        A = np.exp(g_atk[t]) * A + beta_atk[t] * k[t] * k[t]
        r = np.log(A + eps) - center
        s = r / (1.0 + np.abs(r))
        kp = x ** (-s) * k[t]
        if g is not None:
            decay = np.exp(g[t]) * np.ones(K)
            S = decay[:, None] * S
        u = beta[t] * (v[t] - S.T @ k[t])
        S = S + np.outer(kp, u)
        out[t] = S.T @ (scale * q[t])
    return out, S, A
