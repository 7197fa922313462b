"""The float64 retention / lightning attention reference (``linattn.reference.retention``)."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference import gated, retention


def test_retnet_s_and_lightning_s_decays():
    np.testing.assert_allclose(retention.retention_decays(3), [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128])
    # layer 1 of 4, H = 2: slope (8 / 2) (1 - 1 / 4) = 3 per head
    np.testing.assert_allclose(retention.lightning_decays(2, 1, 4), [1.0, np.exp(-3.0)])


def test_the_loop_is_the_closed_form_sum():
    rng = np.random.default_rng(0)
    q, k, v, S0 = (rng.standard_normal(s) for s in ((9, 4), (9, 4), (9, 3), (4, 3)))
    o, S = retention.constant_decay(q, k, v, 0.9, scale=0.5, initial_state=S0)
    for t in range(9):
        St = 0.9 ** (t + 1) * S0 + sum(0.9 ** (t - s) * np.outer(k[s], v[s]) for s in range(t + 1))
        np.testing.assert_allclose(o[t], St.T @ (0.5 * q[t]), rtol=0, atol=1e-13)
    ref = gated.recurrence(q, k, v, g=np.full(9, np.log(0.9)), scale=0.5, initial_state=S0)
    np.testing.assert_allclose(S, ref[1], rtol=0, atol=1e-13)


def test_bad_input_is_refused_naming_the_argument():
    q = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"gamma must lie in \(0, 1\]"):
        retention.constant_decay(q, q, q, 1.5)
    with pytest.raises(ValueError, match="initial_state must have shape"):
        retention.constant_decay(q, q, q, 0.5, initial_state=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="q and k"):
        retention.constant_decay(q, np.zeros((3, 3)), q, 0.5)
