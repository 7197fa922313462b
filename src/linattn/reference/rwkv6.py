"""RWKV-6, taken literally: the additive rule with a gate, read before the token's write,
plus a bonus u on the token itself.

    o_t = (S_{t-1} + Diag(u) k_t v_t^T)^T (scale q_t),    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T

(Peng et al. 2024; fla's ``naive_recurrent_rwkv6``, whose w is g). ``recurrence`` is the token loop;
``chunked`` the chunk form of the read before the write, with G the inclusive cumulative log-gate
of a chunk and G_{t-1} its exclusive version:

    O = (q exp(G_{t-1})) S + A V + diag(sum_c q_tc u_c k_tc) V     (scale q)
    A[t, s] = sum_c q_tc k_sc exp(G_{t-1,c} - G_{s,c})  for s < t    (strictly lower)
    S <- Diag(exp G_C) S + (k exp(G_C - G))^T V

every exponent a sum of gates (<= 0). ``linattn.ops.rwkv6`` computes the same read as the additive
rule's inclusive read of the queries moved one token up (its module docstring).
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_chunk_size, as_matrix, as_real, same_rows, same_shape
from linattn.reference.dplr import _decayed_product, _log_gates, exclusive


def _inputs(q, k, v, u, scale, initial_state):
    """q, k [T, K], v [T, V], u [K], scale, S0 [K, V] (zeros for None), checked, as float64."""
    q, k, v = as_matrix("q", q), as_matrix("k", k), as_matrix("v", v)
    same_shape(("q", "k"), q, k)
    same_rows(("q", "v"), q, v)
    u = np.asarray(u, dtype=np.float64)
    if u.shape != (q.shape[1],):
        raise ValueError(f"u must have shape [K] = {(q.shape[1],)}, got {u.shape}")
    S = np.zeros((q.shape[1], v.shape[1]))
    if initial_state is not None:
        S = as_matrix("initial_state", initial_state).copy()
        if S.shape != (q.shape[1], v.shape[1]):
            raise ValueError(f"initial_state must have shape {(q.shape[1], v.shape[1])}")
    return q, k, v, u, as_real("scale", scale), S


def recurrence(q, k, v, g, u, *, scale=1.0, initial_state=None):
    """The token loop for one head; returns (O [T, V], S_T [K, V]), float64.

    q, k: [T, K]; v: [T, V]; g: None, [T] or [T, K] (log-decays <= 0); u: [K].
    """
    q, k, v, u, scale, S = _inputs(q, k, v, u, scale, initial_state)
    logs = _log_gates(g, *q.shape)
    out = np.empty((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        write = np.outer(k[t], v[t])
        out[t] = (S + u[:, None] * write).T @ (scale * q[t])
        S = np.exp(logs[t])[:, None] * S + write
    return out, S


def chunked(q, k, v, g, u, C=64, *, scale=1.0, initial_state=None):
    """The chunk form (the module docstring), chunks of C tokens (the last may be shorter);
    inputs and outputs as ``recurrence``."""
    q, k, v, u, scale, S = _inputs(q, k, v, u, scale, initial_state)
    C = as_chunk_size(C)
    n, K = q.shape
    logs = _log_gates(g, n, K)
    out = np.empty((n, v.shape[1]))
    for t0 in range(0, n, C):
        c = slice(t0, min(t0 + C, n))
        G = np.cumsum(logs[c], axis=0)
        Gx = exclusive(G)
        Q = scale * q[c]
        A = _decayed_product(Q, k[c], Gx, G, strict=True)
        bonus = np.einsum("tc,c,tc->t", Q, u, k[c])
        out[c] = (Q * np.exp(Gx)) @ S + A @ v[c] + bonus[:, None] * v[c]
        S = np.exp(G[-1])[:, None] * S + (k[c] * np.exp(G[-1] - G)).T @ v[c]
    return out, S
