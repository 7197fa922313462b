"""The float64 Based and ReBased references (``linattn.reference.based``)."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference import based


def _draws(T=7, K=3, V=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((T, K)), rng.standard_normal((T, K)), rng.standard_normal((T, V))


def test_based_is_the_normalised_masked_taylor_kernel():
    q, k, v = _draws()
    A = 0.5 * q @ k.T
    W = np.tril(1 + A + A**2 / 2)
    np.testing.assert_allclose(
        based.based(q, k, v, scale=0.5), W @ v / (W.sum(1, keepdims=True) + 1e-6), atol=1e-13
    )
    np.testing.assert_allclose(based.based(q, k, v, scale=0.5, normalize=False), W @ v, atol=1e-13)


def test_rebased_is_the_normalised_masked_squared_kernel():
    q, k, v = _draws(seed=1)
    W = np.tril((0.5 * q @ k.T) ** 2)
    np.testing.assert_allclose(
        based.rebased(q, k, v, scale=0.5, eps=1e-3), W @ v / (W.sum(1, keepdims=True) + 1e-3),
        atol=1e-13,
    )  # fmt: skip


def test_bad_input_is_refused_naming_the_argument():
    q, k, v = _draws()
    with pytest.raises(TypeError, match="normalize must be True or False"):
        based.based(q, k, v, normalize=1)
    with pytest.raises(ValueError, match="q and k"):
        based.rebased(q, k[:, :2], v)
