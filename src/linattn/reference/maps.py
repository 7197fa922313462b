"""Rank and sharpness of attention matrices (sections 6.1 and 6.2, Figure 4)."""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_real
from linattn.reference.linear import linear_attention_quadratic
from linattn.reference.softmax import softmax_attention


def attention_maps(
    rng: np.random.Generator, n: int = 16, d: int = 4, scale: float = 1.5
) -> tuple[np.ndarray, np.ndarray]:
    """The softmax and the linear (elu + 1) attention matrices of the same queries and keys, 6.1.

    Draws Q then K, each ``scale * rng.standard_normal((n, d))``; returns (P, A), both (n, n) and
    unmasked. Figure 4 uses ``np.random.default_rng(1)``: P has rank 16, A has rank 4 (= r = d).
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    n, d = as_positive_int("n", n), as_positive_int("d", d)
    scale = as_real("scale", scale)
    Q, K = scale * rng.standard_normal((n, d)), scale * rng.standard_normal((n, d))
    return softmax_attention(Q, K, np.eye(n))[1], linear_attention_quadratic(Q, K, np.eye(n))[1]


def matrix_rank(M: np.ndarray) -> int:
    """The numerical rank of M, section 6.1: the number of singular values above
    sigma_max * max(shape) * machine epsilon (NumPy's default). At most r for the unmasked linear
    attention matrix D^{-1} phi(Q) phi(K)^T; n for a softmax matrix with distinct scores.
    """
    return int(np.linalg.matrix_rank(as_matrix("M", M)))


def mean_peak_weight(M: np.ndarray) -> float:
    """The sharpness measure of section 6.2: the mean over rows of the largest weight in a row,

        (1/n) sum_i max_j M_ij,

    1/n for uniform rows, 1 when every row puts all its weight on one key.
    """
    return float(as_matrix("M", M).max(axis=1).mean())
