"""The delta rule (sections 7, 7.2 and 8): recurrent, chunked through the UT transform, WY form.

Keys (and queries) have phi folded in and unit length in the spec; the formulas hold for any keys,
but the transition I - beta k k^T has spectral norm 1 only for unit keys and beta in [0, 2].
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular

from linattn.reference.checks import (
    as_beta,
    as_chunk_size,
    as_matrix,
    as_scalar_beta,
    as_vector,
    same_rows,
    same_shape,
)


def _state(name: str, S: np.ndarray | None, r: int, d: int) -> np.ndarray:
    """The state S (r, d): zeros if None, else a checked float64 copy."""
    if S is None:
        return np.zeros((r, d))
    S = as_matrix(name, S)
    if S.shape != (r, d):
        raise ValueError(f"{name} must have shape {(r, d)} (keys x values), got {S.shape}")
    return S.copy()


def _qkv_beta(Q, K, V, beta):
    """Validate Q, K (n, r), V (n, d) and beta (n,)."""
    Q, K, V = as_matrix("Q", Q), as_matrix("K", K), as_matrix("V", V)
    same_shape(("Q", "K"), Q, K)
    same_rows(("K", "V"), K, V)
    return Q, K, V, as_beta(beta, len(K))


def delta_rule(
    Q: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    beta: np.ndarray,
    initial_state: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The delta rule in its recurrent form, section 7 (Schlag, Irie and Schmidhuber, 2021).

        u_t = beta_t (v_t - S_{t-1}^T k_t),   S_t = S_{t-1} + k_t u_t^T,   o_t = S_t^T q_t,

    equivalently S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, with S_0 = 0 (or
    ``initial_state``). Shapes: Q, K (n, r), V (n, d), beta (n,) -> O (n, d), final S (r, d).
    """
    Q, K, V, beta = _qkv_beta(Q, K, V, beta)
    S = _state("initial_state", initial_state, K.shape[1], V.shape[1])
    out = np.empty((len(Q), V.shape[1]))
    for t in range(len(Q)):
        u = beta[t] * (V[t] - K[t] @ S)  # the pseudo-value: new value minus what k_t reads now
        S += np.outer(K[t], u)
        out[t] = Q[t] @ S
    return out, S


def ut_transform(K: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """The UT transform of one chunk, section 8 (Joffrain et al., 2006; Yang et al., 2024b, eq. 10).

        T = (I + L)^{-1} diag(beta),   L_ti = beta_t k_t^T k_i for i < t (strictly lower).

    Shapes: K (C, r), beta (C,) -> T (C, C), lower triangular.
    """
    K = as_matrix("K", K)
    beta = as_beta(beta, len(K))
    return solve_triangular(_unit_lower(K, beta), np.diag(beta), lower=True)


def pseudo_values(K: np.ndarray, V: np.ndarray, beta: np.ndarray, S: np.ndarray) -> np.ndarray:
    """The pseudo-values U of one chunk that starts from the state S, section 8.

        (I + L) U = diag(beta) (V - K S),   L_ti = beta_t k_t^T k_i for i < t,

    solved by forward substitution (I + L is unit lower triangular).
    Shapes: K (C, r), V (C, d), beta (C,), S (r, d) -> U (C, d).
    """
    K, V = as_matrix("K", K), as_matrix("V", V)
    same_rows(("K", "V"), K, V)
    beta = as_beta(beta, len(K))
    S = _state("S", S, K.shape[1], V.shape[1])
    right = beta[:, None] * (V - K @ S)  # diag(beta) (V - K S), (C, d)
    return solve_triangular(_unit_lower(K, beta), right, lower=True, unit_diagonal=True)


def chunked_delta_rule(
    Q: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    beta: np.ndarray,
    C: int,
    initial_state: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The delta rule in chunks of C tokens, section 8 (Yang et al., 2024b, sections 3.1-3.2).

    For each chunk, from the state S of all earlier chunks:

        1. U = pseudo_values(K_[c], V_[c], beta_[c], S)        # (I + L) U = diag(beta)(V - K S)
        2. O_[c] = Q_[c] S + (Q_[c] K_[c]^T * L_C) U           # chunked linear attention with U
        3. S <- S + K_[c]^T U

    Any C >= 1: the last chunk may be shorter. Shapes as ``delta_rule``.
    """
    C = as_chunk_size(C)
    Q, K, V, beta = _qkv_beta(Q, K, V, beta)
    S = _state("initial_state", initial_state, K.shape[1], V.shape[1])
    out = np.empty((len(Q), V.shape[1]))
    for c in range(0, len(Q), C):
        q, k, v, b = Q[c : c + C], K[c : c + C], V[c : c + C], beta[c : c + C]
        U = pseudo_values(k, v, b, S)  # (C', d)
        out[c : c + C] = q @ S + np.tril(q @ k.T) @ U
        S = S + k.T @ U
    return out, S


def transition_product(K: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """The product of a chunk's transitions, latest on the left, section 8.

        A_C ... A_2 A_1,   A_t = I - beta_t k_t k_t^T.

    Shapes: K (C, r), beta (C,) -> (r, r).
    """
    K = as_matrix("K", K)
    beta = as_beta(beta, len(K))
    product = np.eye(K.shape[1])
    for t in range(len(K)):
        product = (np.eye(K.shape[1]) - beta[t] * np.outer(K[t], K[t])) @ product
    return product


def wy_transition(K: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """The compact WY / UT form of a chunk's transition product, section 8.

        I - K^T T K,   T = (I + L)^{-1} diag(beta)   (Schreiber and Van Loan, 1989).

    Equals ``transition_product(K, beta)``. Shapes: K (C, r), beta (C,) -> (r, r).
    """
    K = as_matrix("K", K)
    return np.eye(K.shape[1]) - K.T @ ut_transform(K, beta) @ K


def householder_spectrum(k: np.ndarray, beta: float) -> tuple[float, float, float]:
    """The spectrum of one transition A = I - beta k k^T, section 7.2.

    For a unit key k in R^r (r >= 2): eigenvalue 1 - beta once (on k) and 1 on k-perp, so for beta
    in [0, 2] the spectral norm is 1. Returns (smallest eigenvalue, largest eigenvalue,
    spectral norm). Shape: k (r,).
    """
    k = as_vector("k", k)
    beta = as_scalar_beta(beta)
    if len(k) < 2:
        raise ValueError(f"k must have at least 2 entries (r >= 2), got {len(k)}")
    A = np.eye(len(k)) - beta * np.outer(k, k)
    eigenvalues = np.linalg.eigvalsh(A)
    return float(eigenvalues.min()), float(eigenvalues.max()), float(np.linalg.norm(A, 2))


def _unit_lower(K: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """I + L with L_ti = beta_t k_t^T k_i for i < t, (C, C)."""
    return np.eye(len(K)) + np.tril(beta[:, None] * (K @ K.T), -1)
