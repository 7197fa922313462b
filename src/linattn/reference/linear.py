"""Linear attention (sections 4, 5 and 5.1): two orders, the recurrence, and chunks.

Every function takes the feature map ``phi`` (default elu + 1) and applies it to the rows of Q and
K; phi(Q), phi(K) are (n, r), V is (n, d). The normaliser is the same sum with V replaced by ones.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from linattn.reference.checks import (
    as_chunk_size,
    as_feature_map,
    as_flag,
    as_matrix,
    features,
    non_empty,
    positive_denominator,
    same_columns,
    same_rows,
    same_shape,
)
from linattn.reference.features import elu_plus_one

FeatureMap = Callable[[np.ndarray], np.ndarray]


def _features(Q, K, V, phi, causal=False):
    """Validate Q, K, V and phi; return phi(Q), phi(K), V as float64 arrays."""
    Q, K, V = as_matrix("Q", Q), as_matrix("K", K), as_matrix("V", V)
    phi = as_feature_map(phi)
    causal = as_flag("causal", causal)
    non_empty("Q", Q)
    non_empty("K", K)
    same_columns(("Q", "K"), Q, K)
    same_rows(("K", "V"), K, V)
    if causal:
        same_shape(("Q", "K"), Q, K)
    FQ, FK = features("Q", phi, Q), features("K", phi, K)
    same_columns(("phi(Q)", "phi(K)"), FQ, FK)
    return FQ, FK, V


def linear_attention_quadratic(
    Q: np.ndarray,
    K: np.ndarray,
    V: np.ndarray,
    phi: FeatureMap = elu_plus_one,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Linear attention in the left order, section 4: the n x n matrix first.

        A = phi(Q) phi(K)^T  (masked to its lower triangle if causal),
        A <- D^{-1} A with D = diag(row sums of A),   O = A V.

    Shapes: Q (n, d), K (m, d), V (m, d_v) -> O (n, d_v), A (n, m) row-stochastic.
    """
    FQ, FK, V = _features(Q, K, V, phi, causal)
    A = FQ @ FK.T  # (n, m): one weight per pair of tokens
    if causal:
        A = np.tril(A)
    denominator = A.sum(axis=1, keepdims=True)
    positive_denominator("the normaliser sum_j phi(q_i)^T phi(k_j)", denominator)
    A /= denominator
    return A @ V, A


def linear_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, phi: FeatureMap = elu_plus_one
) -> np.ndarray:
    """Linear attention in the right order, section 4: the r x d summary first.

        M = phi(K)^T V  (r x d),   z = phi(K)^T 1  (r),   o_i = M^T phi(q_i) / z^T phi(q_i).

    Shapes: Q (n, d), K (m, d), V (m, d_v) -> O (n, d_v). Equals the unmasked left order.
    """
    FQ, FK, V = _features(Q, K, V, phi)
    M, z = FK.T @ V, FK.sum(axis=0)  # (r, d_v), (r,)
    denominator = FQ @ z
    positive_denominator("the normaliser z^T phi(q)", denominator)
    return (FQ @ M) / denominator[:, None]


def causal_linear_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, phi: FeatureMap = elu_plus_one
) -> np.ndarray:
    """Causal linear attention as a recurrence, section 5 (Katharopoulos et al., 2020).

        S_t = S_{t-1} + phi(k_t) v_t^T,   z_t = z_{t-1} + phi(k_t),   S_0 = 0, z_0 = 0,
        o_t = S_t^T phi(q_t) / z_t^T phi(q_t).

    Shapes: Q, K (n, d), V (n, d_v) -> O (n, d_v); the state S_t is (r, d_v), z_t is (r,).
    """
    FQ, FK, V = _features(Q, K, V, phi, causal=True)
    S, z = np.zeros((FK.shape[1], V.shape[1])), np.zeros(FK.shape[1])
    out = np.empty((len(FQ), V.shape[1]))
    for t in range(len(FQ)):
        S += np.outer(FK[t], V[t])  # write one rank-one matrix
        z += FK[t]
        denominator = FQ[t] @ z
        positive_denominator("the normaliser z_t^T phi(q_t)", denominator)
        out[t] = FQ[t] @ S / denominator
    return out


def chunked_linear_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, C: int, phi: FeatureMap = elu_plus_one
) -> np.ndarray:
    """Causal linear attention in chunks of C tokens, section 5.1 (Yang et al., 2024a).

    For chunk c with rows Q_[c], K_[c], V_[c] and the state S_[c], z_[c] of all earlier chunks:

        O_[c] = (phi(Q_[c]) S_[c] + (phi(Q_[c]) phi(K_[c])^T * L_C) V_[c]) / (same with V -> 1),
        S_[c+1] = S_[c] + phi(K_[c])^T V_[c],   z_[c+1] = z_[c] + phi(K_[c])^T 1,

    with L_C the lower-triangular matrix of ones. Any C >= 1: the last chunk may be shorter.
    C = 1 is the recurrence; C >= n is the masked quadratic product.
    Shapes: Q, K (n, d), V (n, d_v) -> O (n, d_v).
    """
    C = as_chunk_size(C)
    FQ, FK, V = _features(Q, K, V, phi, causal=True)
    S, z = np.zeros((FK.shape[1], V.shape[1])), np.zeros(FK.shape[1])
    out = np.empty((len(FQ), V.shape[1]))
    for c in range(0, len(FQ), C):
        q, k, v = FQ[c : c + C], FK[c : c + C], V[c : c + C]  # (C', r), (C', r), (C', d_v)
        A = np.tril(q @ k.T)  # pairs inside the chunk, under the causal mask, (C', C')
        denominator = q @ z + A.sum(axis=1)
        positive_denominator("the normaliser z_t^T phi(q_t)", denominator)
        out[c : c + C] = (q @ S + A @ v) / denominator[:, None]
        S, z = S + k.T @ v, z + k.sum(axis=0)
    return out
