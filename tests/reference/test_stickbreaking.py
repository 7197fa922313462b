"""Stick-breaking attention's float64 loop: the weights and the stick left sum to one, the
nearest key breaks first, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference.stickbreaking import stickbreaking_attention


@pytest.mark.parametrize("attend_current", [False, True])
def test_weights_and_the_remainder_sum_to_one(attend_current):
    rng = np.random.default_rng(0)
    T = 8
    q, k = rng.normal(size=(T, 4)), rng.normal(size=(T, 4))
    A, rem = stickbreaking_attention(q, k, np.eye(T), attend_current=attend_current)  # o = A
    np.testing.assert_allclose(A.sum(axis=1) + rem, np.ones(T), rtol=0, atol=1e-15)
    assert np.all(A >= 0)
    visible = np.tril(np.ones((T, T)), 0 if attend_current else -1)
    assert np.all(A[visible == 0] == 0)


def test_the_nearest_key_breaks_the_stick_first():
    # q . k = 1 for every pair, scale 1: beta = sigmoid(1) for each key
    q, k = np.ones((3, 1)), np.ones((3, 1))
    A, rem = stickbreaking_attention(q, k, np.eye(3), scale=1.0)
    beta = 1 / (1 + np.exp(-1.0))
    np.testing.assert_allclose(A[2, :2], [beta * (1 - beta), beta], rtol=1e-15)
    np.testing.assert_allclose(rem, [1.0, 1 - beta, (1 - beta) ** 2], rtol=1e-15)


def test_refusals_name_the_argument():
    q = np.ones((3, 2))
    with pytest.raises(TypeError, match="attend_current"):
        stickbreaking_attention(q, q, q, attend_current=1)
    with pytest.raises(ValueError, match="q"):
        stickbreaking_attention(q, q[:2], q)
