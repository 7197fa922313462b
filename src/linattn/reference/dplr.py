"""The generalized delta rule: a diagonal-plus-low-rank transition, taken literally.

    S_t = A_t S_{t-1} + k_t v_t^T,    A_t = Diag(exp g_t) + a_t b_t^T,    o_t = S_t^T (scale q_t)

b_t reads the state entering the token (S_{t-1}) and a_t is the direction of that write (fla's
``dplr_recurrence`` with its ``alpha`` our b and its ``beta`` our a). Each transition is built as
the full K x K matrix: the slow, obviously right definition that the fast forms are tested
against. g: None (IPLR: Diag = I), [T] (one log-decay per step) or [T, K] (per channel).

``chunked`` is the chunk form (the WY representation of a chunk's transitions, one
unit-lower-triangular solve per chunk; its derivation: ``linattn.ops.rules.dplr``),
``transition_product`` and ``wy_transition`` the product of C transitions both ways.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular

from linattn.reference.checks import as_chunk_size, as_matrix, as_real, same_rows, same_shape


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


def _log_gates(g, T: int, K: int) -> np.ndarray:
    """The log-gates as [T, K] (zeros without a gate; a gate per step repeated over K)."""
    g = _gate(g, T, K)
    if g is None:
        return np.zeros((T, K))
    return g[:, None] * np.ones(K) if g.ndim == 1 else g


def _decayed_product(x, y, Gx, Gy, strict: bool) -> np.ndarray:
    """A[t, s] = sum_c x_tc y_sc exp(Gx_tc - Gy_sc) for s < t (``strict``) or s <= t, else 0;
    the exponent cut to -inf above the diagonal before exp (every exponent taken <= 0)."""
    n = len(x)
    mask = np.tril(np.ones((n, n), dtype=bool), -1 if strict else 0)
    diff = np.where(mask[:, :, None], Gx[:, None, :] - Gy[None, :, :], -np.inf)
    return np.einsum("tc,sc,tsc->ts", x, y, np.exp(diff))


def exclusive(G: np.ndarray) -> np.ndarray:
    """G_{t-1} for each row t of the inclusive cumulative log-gate G [C, K] (0 on the first):
    the decay of the state a token's b reads."""
    return np.vstack([np.zeros((1, G.shape[1])), G[:-1]])


def _chunk_terms(a, b, k, G):
    """(Bd, A_ba, A_bk, T) of one chunk (the module docstring of ``linattn.ops.rules.dplr``):
    Bd = b exp(G_{t-1}), the strictly lower products with the exclusive left gate, and
    T = (I - A_ba)^{-1}."""
    Gx = exclusive(G)
    Bd = b * np.exp(Gx)
    A_ba = _decayed_product(b, a, Gx, G, strict=True)
    A_bk = _decayed_product(b, k, Gx, G, strict=True)
    eye = np.eye(len(a))
    T = solve_triangular(eye - A_ba, eye, lower=True, unit_diagonal=True)
    return Bd, A_ba, A_bk, T


def chunked(q, k, v, a, b, g=None, C=64, *, scale=1.0, initial_state=None):
    """The chunk form of the generalized delta rule, chunks of C tokens; returns (O, S_T).

    Per chunk entering with S (G its inclusive cumulative log-gate, ``linattn.ops.rules.dplr``):

        U_b = T (A_bk V + Bd S)                          the reads b_t^T S_{t-1} of its tokens
        O = (q exp(G)) S + A_qk V + A_qa U_b             (scale q)
        S <- Diag(exp G_C) S + (k exp(G_C - G))^T V + (a exp(G_C - G))^T U_b

    Inputs as ``recurrence``; C any integer >= 1 (the last chunk may be shorter).
    """
    q, k, a, b = (as_matrix(n, x) for n, x in (("q", q), ("k", k), ("a", a), ("b", b)))
    v = as_matrix("v", v)
    for name, x in (("k", k), ("a", a), ("b", b)):
        same_shape(("q", name), q, x)
    same_rows(("q", "v"), q, v)
    C, scale = as_chunk_size(C), as_real("scale", scale)
    n, K = q.shape
    logs = _log_gates(g, n, K)
    S = np.zeros((K, v.shape[1])) if initial_state is None else as_matrix("S", initial_state)
    out = np.empty((n, v.shape[1]))
    for t0 in range(0, n, C):
        c = slice(t0, min(t0 + C, n))
        G = np.cumsum(logs[c], axis=0)
        Bd, _, A_bk, T = _chunk_terms(a[c], b[c], k[c], G)
        U_b = T @ (A_bk @ v[c] + Bd @ S)
        Q = scale * q[c]
        A_qk = _decayed_product(Q, k[c], G, G, strict=False)
        A_qa = _decayed_product(Q, a[c], G, G, strict=False)
        out[c] = (Q * np.exp(G)) @ S + A_qk @ v[c] + A_qa @ U_b
        E = np.exp(G[-1] - G)  # exp(G_C - G): every exponent <= 0
        S = np.exp(G[-1])[:, None] * S + (k[c] * E).T @ v[c] + (a[c] * E).T @ U_b
    return out, S


def transition_product(a, b, g=None) -> np.ndarray:
    """A_C ... A_1, the product of C transitions Diag(exp g_t) + a_t b_t^T, one by one."""
    a, b = as_matrix("a", a), as_matrix("b", b)
    same_shape(("a", "b"), a, b)
    logs = _log_gates(g, *a.shape)
    M = np.eye(a.shape[1])
    for t in range(len(a)):
        M = transition(a[t], b[t], logs[t]) @ M
    return M


def wy_transition(a, b, g=None) -> np.ndarray:
    """The same product in its WY form: Diag(exp G_C) + Ae^T T Bd, with Ae = a exp(G_C - G),
    Bd = b exp(G_{t-1}) and T = (I - A_ba)^{-1} (one unit-lower-triangular solve)."""
    a, b = as_matrix("a", a), as_matrix("b", b)
    same_shape(("a", "b"), a, b)
    G = np.cumsum(_log_gates(g, *a.shape), axis=0)
    Bd, _, _, T = _chunk_terms(a, b, np.zeros_like(a), G)
    Ae = a * np.exp(G[-1] - G)
    return np.diag(np.exp(G[-1])) + Ae.T @ T @ Bd
