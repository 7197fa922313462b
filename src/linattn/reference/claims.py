"""The spec's claims that are not definitions: statements it proves or states, as computations.

Each function computes the quantity a claim is about, so that ``linattn verify`` can check it
against the spec's statement: the variance of the scores (section 2), the operation counts of the
two orders (section 4), the rank-r approximation error (Eckart-Young, 6.1), the sharpness bound
(6.2), the Gram matrix of positive features (6.3), the gradient of the linear loss (7.1) and the
reads of section 9's qualitative rows.
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_vector, same_columns
from linattn.reference.features import elu_plus_one


def score_variance(rng: np.random.Generator, d: int, samples: int) -> tuple[float, float]:
    """Section 2: the sample variance of q^T k and its standard error, for entries of q and k
    independent N(0, 1).

        Var(q^T k) = sum_m Var(q_m k_m) = d,   Var((q^T k)^2) = 2 d^2 + 6 d,

    so the standard error of the sample variance (the mean of (q^T k)^2, the mean being 0) is
    sqrt((2 d^2 + 6 d) / samples). Returns (variance, standard error).
    """
    _generator(rng)
    d, samples = as_positive_int("d", d), as_positive_int("samples", samples)
    scores = (rng.standard_normal((samples, d)) * rng.standard_normal((samples, d))).sum(axis=1)
    return float(np.mean(scores**2)), float(np.sqrt((2 * d * d + 6 * d) / samples))


def softmax_rows(G: np.ndarray) -> np.ndarray:
    """Section 2: the row-wise softmax P_ij = exp(G_ij) / sum_l exp(G_il) of scores G (n, m)."""
    G = as_matrix("G", G)
    P = np.exp(G - G.max(axis=1, keepdims=True))
    return P / P.sum(axis=1, keepdims=True)


def softmax_jacobian_norm(p: np.ndarray) -> float:
    """Section 2: the spectral norm of the softmax's Jacobian diag(p) - p p^T at a row p.

    At most 2 (1 - max_j p_j) (Gershgorin: row j sums to 2 p_j (1 - p_j)), so a row that puts
    almost all its weight on one key has a gradient close to zero.
    """
    p = as_vector("p", p)
    return float(np.linalg.norm(np.diag(p) - np.outer(p, p), 2))


def product_ops(A: np.ndarray, B: np.ndarray) -> int:
    """Section 1: a product of an a x b and a b x c matrix costs 2 a b c operations."""
    A, B = as_matrix("A", A), as_matrix("B", B)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not multiply: A is {A.shape}, B is {B.shape}")
    return 2 * A.shape[0] * A.shape[1] * B.shape[1]


def softmax_order(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """Section 4's table, softmax column: the products G = Q K^T / sqrt(d) and O = P V.

    Returns (operations counted product by product, the shape of the largest intermediate).
    4 n^2 d and (n, n) for Q, K, V of shape (n, d).
    """
    Q, K, V = as_matrix("Q", Q), as_matrix("K", K), as_matrix("V", V)
    G = Q @ K.T / np.sqrt(Q.shape[1])  # (n, n)
    P = softmax_rows(G)
    return product_ops(Q, K.T) + product_ops(P, V), G.shape


def linear_right_order(
    FQ: np.ndarray, FK: np.ndarray, V: np.ndarray
) -> tuple[int, tuple[int, ...]]:
    """Section 4's table, linear column: M = phi(K)^T V first, then phi(Q) M.

    Returns (operations counted product by product, the shape of the largest intermediate).
    4 n r d and (r, d) for features FQ, FK of shape (n, r) and V of shape (n, d).
    """
    FQ, FK, V = as_matrix("FQ", FQ), as_matrix("FK", FK), as_matrix("V", V)
    M = FK.T @ V  # (r, d)
    return product_ops(FK.T, V) + product_ops(FQ, M), M.shape


def rank_r_error(M: np.ndarray, r: int) -> float:
    """Section 6.1: the spectral-norm error of the truncated SVD of rank r, ||M - M_r||_2.

    By the Eckart-Young theorem it is sigma_{r+1}, the smallest error of any matrix of rank r.
    """
    M, r = as_matrix("M", M), as_positive_int("r", r)
    U, s, Vt = np.linalg.svd(M)
    M_r = (U[:, :r] * s[:r]) @ Vt[:r]
    return float(np.linalg.norm(M - M_r, 2))


def causal_linear_matrix(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Section 6.1: the masked linear attention matrix D^{-1} (phi(Q) phi(K)^T o L), elu + 1.

    Its diagonal is positive, so it is lower triangular and nonsingular: full rank n, although
    the unmasked matrix has rank at most r.
    """
    Q, K = as_matrix("Q", Q), as_matrix("K", K)
    A = np.tril(elu_plus_one(Q) @ elu_plus_one(K).T)
    return A / A.sum(axis=1, keepdims=True)


def sharpness_bound(FK: np.ndarray) -> np.ndarray:
    """Section 6.2: the bound max_m phi(k_j)_m / phi(k_l)_m on A_ij / A_il, for every (j, l).

    FK (n, r) positive features of the keys -> (n, n). No query makes a row of the linear
    attention matrix more peaked: A_ij / A_il is a weighted average of the ratios b_m / c_m.
    """
    FK = as_matrix("FK", FK)
    if not np.all(FK > 0):
        raise ValueError("FK must be strictly positive (the bound divides by phi(k_l))")
    return (FK[:, None, :] / FK[None, :, :]).max(axis=2)


def weight_ratios(A: np.ndarray) -> np.ndarray:
    """Section 6.2: A_ij / A_il for every row i and pair (j, l): (n, m) -> (n, m, m)."""
    A = as_matrix("A", A)
    return A[:, :, None] / A[:, None, :]


def feature_gram(FK: np.ndarray) -> np.ndarray:
    """Section 6.3: the inner products phi(k_i)^T phi(k_j) of the keys' features, (n, n)."""
    FK = as_matrix("FK", FK)
    return FK @ FK.T


def crosstalk(K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Section 6.3: the reads k_i^T S / |k_i|^2 of the additive memory S = K^T V, minus V.

        k_i^T S = |k_i|^2 v_i^T + sum_{j != i} (k_i^T k_j) v_j^T.

    Zero for every choice of values exactly when the keys are mutually orthogonal.
    """
    K, V = as_matrix("K", K), as_matrix("V", V)
    reads = K @ (K.T @ V) / (K**2).sum(axis=1, keepdims=True)
    return reads - V


def linear_loss(S: np.ndarray, k: np.ndarray, v: np.ndarray) -> float:
    """Section 7.1: the linear loss -<S^T k, v> of the additive rule (Yang et al., 2024b)."""
    S, k, v = as_matrix("S", S), as_vector("k", k), as_vector("v", v)
    return -float((S.T @ k) @ v)


def linear_loss_gradient(S: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Section 7.1: the gradient of -<S^T k, v> by central differences, entry by entry.

    The spec's claim is that it is -k v^T whatever S holds, so a step of size 1 against it is
    the additive write S + k v^T. The difference quotient is exact for a linear function up to
    rounding, so the step h = 1 is taken.
    """
    S, k, v = as_matrix("S", S), as_vector("k", k), as_vector("v", v)
    gradient = np.empty_like(S)
    for index in np.ndindex(S.shape):
        E = np.zeros_like(S)
        E[index] = 1.0
        gradient[index] = (linear_loss(S + E, k, v) - linear_loss(S - E, k, v)) / 2
    return gradient


def softmax_read(K: np.ndarray, V: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Section 9: what softmax attention returns for query q from a cache of keys K and values V,
    sum_j P_j v_j with P = softmax(K q / sqrt(d))."""
    K, V, q = as_matrix("K", K), as_matrix("V", V), as_vector("q", q)
    same_columns(("K", "q"), K, q[None])
    return softmax_rows((K @ q)[None] / np.sqrt(len(q)))[0] @ V


def _generator(rng: object) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
