"""Softmax attention (section 2) and the d = 1 example (6.1) against direct definitions."""

import numpy as np
import pytest

from linattn.reference import softmax_attention, softmax_d1_example


def test_softmax_matches_the_definition():
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((5, 3)), rng.standard_normal((7, 3)), rng.standard_normal((7, 2))
    O, P = softmax_attention(Q, K, V)
    E = np.exp(Q @ K.T / np.sqrt(3))  # small scores: the unshifted exponential is safe here
    np.testing.assert_allclose(P, E / E.sum(axis=1, keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(O, P @ V, rtol=1e-14)


def test_causal_softmax_is_row_stochastic_and_lower_triangular():
    rng = np.random.default_rng(20261019)
    Q, K, V = (rng.standard_normal((64, 8)) for _ in range(3))
    O, P = softmax_attention(Q, K, V, causal=True)
    np.testing.assert_allclose(P.sum(axis=1), 1, atol=1e-15)
    assert np.all(np.triu(P, 1) == 0)
    # Row i is the unmasked softmax over the first i + 1 keys.
    i = 10
    _, Pi = softmax_attention(Q[i : i + 1], K[: i + 1], V[: i + 1])
    np.testing.assert_allclose(P[i, : i + 1], Pi[0], rtol=1e-14)


def test_large_scores_do_not_overflow():
    Q = np.array([[1000.0, 0.0]])
    K = np.array([[1.0, 0.0], [0.0, 1.0]])
    O, P = softmax_attention(Q, K, np.eye(2))
    assert np.all(np.isfinite(P))
    np.testing.assert_allclose(P, [[1.0, 0.0]], atol=1e-300)


def test_the_d1_example_is_nonsingular_and_ill_conditioned():
    P1 = softmax_d1_example()
    assert P1.shape == (6, 6)
    # The spec prints determinant 5.09e-13 and condition number 1.28e+05.
    assert f"{np.linalg.det(P1):.2e}" == "5.09e-13"
    assert f"{np.linalg.cond(P1):.2e}" == "1.28e+05"
    assert np.linalg.matrix_rank(P1) == 6


def test_causal_needs_as_many_queries_as_keys():
    with pytest.raises(ValueError, match="Q and K"):
        softmax_attention(np.ones((3, 2)), np.ones((4, 2)), np.ones((4, 2)), causal=True)
