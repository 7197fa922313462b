"""Softmax attention (section 2) and the d = 1 example of a nonsingular attention matrix (6.1)."""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_flag, as_matrix, non_empty, same_columns, same_rows


def softmax_attention(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, causal: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Softmax attention of one head, section 2 (Vaswani et al., 2017, equation 1).

        G = Q K^T / sqrt(d),   P_ij = exp(G_ij) / sum_l exp(G_il),   O = P V.

    Shapes: Q (n, d), K (m, d), V (m, d_v) -> O (n, d_v), P (n, m). With ``causal=True`` (n = m)
    the mask sets G_ij = -inf for j > i, so P is lower triangular and still row-stochastic.
    Each row's largest score is subtracted before the exponential: the softmax is unchanged by a
    constant added to a row, and the subtraction prevents overflow.
    """
    Q, K, V = as_matrix("Q", Q), as_matrix("K", K), as_matrix("V", V)
    causal = as_flag("causal", causal)
    non_empty("Q", Q)
    non_empty("K", K)
    same_columns(("Q", "K"), Q, K)
    same_rows(("K", "V"), K, V)
    if causal:
        same_rows(("Q", "K"), Q, K)  # the mask pairs query i with key i
    G = Q @ K.T / np.sqrt(Q.shape[1])  # the scores, (n, m)
    if causal:
        G = np.where(np.tril(np.ones(G.shape, dtype=bool)), G, -np.inf)
    P = np.exp(G - G.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    return P @ V, P


def softmax_d1_example() -> np.ndarray:
    """The 6 x 6 softmax matrix P1 of section 6.1 with d = 1: nonsingular but badly conditioned.

    Six evenly spaced queries q = linspace(-1, 1, 6) against six evenly spaced keys
    k = linspace(-0.8, 1.2, 6); scores q_i k_j. The spec prints determinant 5.09e-13 and condition
    number 1.28e+05.
    """
    q, k = np.linspace(-1.0, 1.0, 6), np.linspace(-0.8, 1.2, 6)
    _, P1 = softmax_attention(q[:, None], k[:, None], np.eye(6))  # q, k as (6, 1) columns
    return P1
