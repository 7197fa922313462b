"""The float64 oracle of MesaNet (von Oswald et al. 2025, "MesaNet: Sequence Modeling by Locally
Optimal Test-Time Training"), one head, taken literally.

Two gated additive memories, both decayed by gamma_t = exp(g_t) and written with strength beta_t:

    H_t = gamma_t H_{t-1} + beta_t k_t k_t^T          (K x K, the keys' second moment)
    G_t = gamma_t G_{t-1} + beta_t k_t v_t^T          (K x V, keys against values)

and the read is the regularised least-squares memory applied to the query,

    o_t = G_t^T (H_t + Diag(lambda))^{-1} q_t,

that is S_t = argmin_S sum_s (decay) beta_s |S^T k_s - v_s|^2 + sum_i lambda_i |S_i|^2 read at q_t
(spec section 7.3: the least-squares memory, here ridge-regularised and decayed). lambda is one
number per key channel (fla's ``lamb`` [H, K]). The solve is exact (``numpy.linalg.solve``); the
ops solve by conjugate gradients (``linattn.ops.mesa``).
"""

from __future__ import annotations

import numpy as np


def mesa_net(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray | None,
    beta: np.ndarray,
    lamb: np.ndarray,
    h_kk0: np.ndarray | None = None,
    h_kv0: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MesaNet for one head: q, k [T, K], v [T, V], g and beta [T] (g None: no decay), lamb [K],
    initial states h_kk0 [K, K] and h_kv0 [K, V]. Returns (O [T, V], H_T [K, K], G_T [K, V]) with
    o_t = G_t^T (H_t + Diag(lamb))^{-1} q_t (the module docstring)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    T, K = k.shape
    beta = np.asarray(beta, dtype=np.float64)
    gamma = np.ones(T) if g is None else np.exp(np.asarray(g, dtype=np.float64))
    H = np.zeros((K, K)) if h_kk0 is None else np.array(h_kk0, dtype=np.float64)
    G = np.zeros((K, v.shape[1])) if h_kv0 is None else np.array(h_kv0, dtype=np.float64)
    ridge = np.diag(np.asarray(lamb, dtype=np.float64))
    out = np.zeros((T, v.shape[1]))
    for t in range(T):
        H = gamma[t] * H + beta[t] * np.outer(k[t], k[t])
        G = gamma[t] * G + beta[t] * np.outer(k[t], v[t])
        out[t] = G.T @ np.linalg.solve(H + ridge, q[t])
    return out, H, G


def mesa_memory(K: np.ndarray, V: np.ndarray, lamb: float) -> np.ndarray:
    """The memory S (r x d, read as S^T k) that MesaNet holds after storing the rows of K and V
    once (beta = 1, no decay, lambda = ``lamb`` on every channel): its two states from ``mesa_net``
    and S = (H_n + lamb I)^{-1} G_n = (K^T K + lamb I)^{-1} K^T V, the least-squares memory of
    section 7.3 regularised (Table 1's MesaNet column)."""
    K, V = np.asarray(K, dtype=np.float64), np.asarray(V, dtype=np.float64)
    n, r = K.shape
    _, H, G = mesa_net(K, K, V, None, np.ones(n), np.full(r, float(lamb)))
    return np.linalg.solve(H + lamb * np.eye(r), G)
