"""The float64 LightNet reference (``linattn.reference.lightnet``)."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference import lightnet


def test_the_state_is_a_softmax_over_time_of_the_key_logits():
    rng = np.random.default_rng(0)
    q, x, v = rng.standard_normal((6, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    o, S, z = lightnet.lightnet(q, x, v, scale=0.5)
    for t in range(6):
        weights = np.exp(x[: t + 1]) / np.exp(x[: t + 1]).sum(0)  # [t + 1, K]
        St = weights.T @ v[: t + 1]
        np.testing.assert_allclose(o[t], St.T @ (0.5 * q[t]), rtol=0, atol=1e-13)
    np.testing.assert_allclose(z, np.log(np.exp(x).sum(0)), rtol=0, atol=1e-13)


def test_an_initial_state_enters_with_the_weight_of_its_normaliser():
    rng = np.random.default_rng(1)
    q, x, v = rng.standard_normal((4, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    S0, z0 = rng.standard_normal((3, 2)), rng.standard_normal(3)
    _, S, z = lightnet.lightnet(q, x, v, initial_state=S0, initial_normalizer=z0)
    total = np.exp(z0) + np.exp(x).sum(0)
    expected = (np.exp(z0)[:, None] * S0 + np.exp(x).T @ v) / total[:, None]
    np.testing.assert_allclose(S, expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(z, np.log(total), rtol=0, atol=1e-13)


def test_bad_input_is_refused_naming_the_argument():
    q = np.zeros((3, 2))
    with pytest.raises(ValueError, match="initial_normalizer must have shape"):
        lightnet.lightnet(q, q, q, initial_normalizer=np.zeros(3))
    with pytest.raises(ValueError, match="initial_state must have shape"):
        lightnet.lightnet(q, q, q, initial_state=np.zeros((3, 3)))
