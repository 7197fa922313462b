"""Linear attention (sections 4, 5, 5.1): two orders, the recurrence and chunks agree."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn.reference import (
    causal_linear_attention,
    chunked_linear_attention,
    elu_plus_one,
    linear_attention,
    linear_attention_quadratic,
    positive_random_features,
)


def draws(n=23, d=4, dv=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, dv))


def test_the_two_orders_agree():
    Q, K, V = draws()
    left, A = linear_attention_quadratic(Q, K, V)
    np.testing.assert_allclose(left, linear_attention(Q, K, V), atol=1e-14)
    np.testing.assert_allclose(A.sum(axis=1), 1, atol=1e-15)


def test_the_two_orders_agree_with_random_features():
    Q, K, V = draws(d=3)
    W = np.random.default_rng(1).standard_normal((16, 3))

    def phi(X):
        return positive_random_features(X, W)

    left, A = linear_attention_quadratic(Q, K, V, phi=phi)
    np.testing.assert_allclose(left, linear_attention(Q, K, V, phi=phi), atol=1e-13)
    assert np.linalg.matrix_rank(A) <= 16


def test_unmasked_rows_are_the_kernel_smoother():
    Q, K, V = draws()
    FQ, FK = elu_plus_one(Q), elu_plus_one(K)
    i = 5
    weights = FK @ FQ[i]
    expected = weights @ V / weights.sum()
    np.testing.assert_allclose(linear_attention(Q, K, V)[i], expected, rtol=1e-13)


def test_the_recurrence_equals_the_masked_product():
    Q, K, V = draws()
    masked, A = linear_attention_quadratic(Q, K, V, causal=True)
    assert np.all(np.triu(A, 1) == 0)
    np.testing.assert_allclose(causal_linear_attention(Q, K, V), masked, atol=1e-14)


@pytest.mark.parametrize("C", [1, 2, 3, 5, 7, 11, 22, 23, 24, 100])
def test_chunks_of_any_size_equal_the_masked_product(C):
    Q, K, V = draws(n=23)  # 23 is prime: most C leave a short last chunk
    masked, _ = linear_attention_quadratic(Q, K, V, causal=True)
    np.testing.assert_allclose(chunked_linear_attention(Q, K, V, C), masked, atol=1e-14)


def test_a_feature_map_with_zero_rows_is_rejected():
    Q, K, V = draws()

    def relu(X):
        return np.maximum(X, 0.0)

    Q = -np.abs(Q)  # every feature of every query is zero: the normaliser is zero
    with pytest.raises(ValueError, match="normaliser"):
        linear_attention(Q, K, V, phi=relu)
    with pytest.raises(ValueError, match="normaliser"):
        chunked_linear_attention(Q, K, V, 4, phi=relu)


def test_a_negative_feature_map_is_rejected():
    Q, K, V = draws()
    with pytest.raises(ValueError, match="nonnegative"):
        linear_attention(Q, K, V, phi=lambda X: X)


def test_bad_chunk_sizes():
    Q, K, V = draws()
    with pytest.raises(ValueError, match="C must be an integer >= 1"):
        chunked_linear_attention(Q, K, V, 0)
    with pytest.raises(TypeError, match="C must be an integer"):
        chunked_linear_attention(Q, K, V, 2.0)
    with pytest.raises(TypeError, match="phi"):
        linear_attention(Q, K, V, phi="elu")


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20), C=st.integers(1, 24), seed=st.integers(0, 2**16))
def test_chunked_equals_recurrent_for_any_n_and_chunk_size(n, C, seed):
    Q, K, V = draws(n=n, seed=seed)
    np.testing.assert_allclose(
        chunked_linear_attention(Q, K, V, C), causal_linear_attention(Q, K, V), atol=1e-13
    )
