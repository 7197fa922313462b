"""Feature maps phi of linear attention (section 4): elu + 1 and positive random features."""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_vector, same_columns


def elu_plus_one(X: np.ndarray) -> np.ndarray:
    """phi(x) = elu(x) + 1 entry by entry, section 4 (Katharopoulos et al., 2020).

        phi(x) = x + 1 for x > 0,   exp(x) for x <= 0.

    Shape: X (n, d) -> (n, d), so r = d. Strictly positive.
    """
    X = as_matrix("X", X)
    # np.where evaluates both branches; clip the exponent so that large x cannot overflow
    # in the branch that is thrown away.
    return np.where(X > 0, X + 1.0, np.exp(np.minimum(X, 0.0)))


def positive_random_features(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Positive random features, section 4 (Choromanski et al., 2021).

        phi(x) = exp(-|x|^2 / 2) / sqrt(r) * (exp(w_1^T x), ..., exp(w_r^T x)),

    with the rows w_m of W drawn from N(0, I_d), so that E_w[phi(q)^T phi(k)] = exp(q^T k).
    Shapes: X (n, d), W (r, d) -> (n, r). For the softmax kernel, apply it to x / d^(1/4).
    """
    X, W = as_matrix("X", X), as_matrix("W", W)
    same_columns(("X", "W"), X, W)
    return np.exp(X @ W.T - 0.5 * (X**2).sum(axis=1, keepdims=True)) / np.sqrt(len(W))


def prf_relative_standard_error(q: np.ndarray, k: np.ndarray, r: int) -> float:
    """The relative standard error of the positive-random-feature estimate of exp(q^T k), section 4.

        sqrt((exp(|q + k|^2) - 1) / r)

    for r features; q, k of shape (d,).
    """
    q = as_vector("q", q)
    k = as_vector("k", k, len(q))
    r = as_positive_int("r", r)
    return float(np.sqrt((np.exp(((q + k) ** 2).sum()) - 1.0) / r))
