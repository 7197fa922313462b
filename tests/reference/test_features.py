"""Feature maps (section 4): elu + 1 and positive random features."""

import warnings

import numpy as np
import pytest

from linattn.reference import (
    elu_plus_one,
    positive_random_features,
    prf_relative_standard_error,
)


def test_elu_plus_one_values():
    X = np.array([[-1.0, 0.0, 0.5, 3.0]])
    np.testing.assert_allclose(elu_plus_one(X), [[np.exp(-1.0), 1.0, 1.5, 4.0]], rtol=1e-15)


def test_elu_plus_one_is_positive_and_does_not_overflow():
    X = np.array([[-700.0, -1.0, 1.0, 1e6]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from the discarded branch
        F = elu_plus_one(X)
    assert np.all(F > 0) and np.all(np.isfinite(F))


def test_positive_random_features_shape_and_positivity():
    rng = np.random.default_rng(0)
    X, W = rng.standard_normal((5, 3)), rng.standard_normal((11, 3))
    F = positive_random_features(X, W)
    assert F.shape == (5, 11) and np.all(F > 0)
    expected = np.exp(W @ X[0] - X[0] @ X[0] / 2) / np.sqrt(11)
    np.testing.assert_allclose(F[0], expected, rtol=1e-14)


def test_positive_random_features_estimate_the_exponential_kernel():
    # Unbiased: the estimate is within four relative standard errors of exp(q^T k).
    rng = np.random.default_rng(5)
    q, k = 0.4 * rng.standard_normal(4), 0.4 * rng.standard_normal(4)
    W = rng.standard_normal((200_000, 4))
    estimate = (positive_random_features(q[None], W) @ positive_random_features(k[None], W).T)[0, 0]
    se = prf_relative_standard_error(q, k, len(W))
    assert abs(estimate / np.exp(q @ k) - 1) < 4 * se


def test_relative_standard_error_formula():
    q, k = np.array([0.3, 0.0]), np.array([0.0, 0.4])
    assert prf_relative_standard_error(q, k, 100) == pytest.approx(
        np.sqrt((np.exp(0.25) - 1) / 100), rel=1e-14
    )


def test_bad_feature_inputs():
    with pytest.raises(ValueError, match="X and W"):
        positive_random_features(np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="k must have 2 entries"):
        prf_relative_standard_error(np.ones(2), np.ones(3), 10)
    with pytest.raises(ValueError, match="r must be"):
        prf_relative_standard_error(np.ones(2), np.ones(2), 0)
