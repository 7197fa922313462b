"""The float64 RWKV-4 reference (``linattn.reference.rwkv4``)."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference import rwkv4


def test_wkv_is_the_decayed_weighted_average_with_the_bonus():
    rng = np.random.default_rng(0)
    T, C = 6, 3
    w, u, k, v = rng.standard_normal(C), rng.standard_normal(C), *rng.standard_normal((2, T, C))
    out, state = rwkv4.wkv(w, u, k, v)
    rate = np.exp(w)  # the decay per token is exp(-exp(w))
    for t in range(T):
        weights = [np.exp(-(t - 1 - s) * rate + k[s]) for s in range(t)]
        num = sum((wt * v[s] for s, wt in enumerate(weights)), np.zeros(C))
        den = sum(weights, np.zeros(C))
        bonus = np.exp(u + k[t])
        np.testing.assert_allclose(out[t], (num + bonus * v[t]) / (den + bonus), atol=1e-13)
    # the state: a = alpha exp(eps), b = beta exp(eps), eps the running maximum
    a = sum(np.exp(-(T - 1 - s) * rate + k[s]) * v[s] for s in range(T))
    b = sum(np.exp(-(T - 1 - s) * rate + k[s]) for s in range(T))
    eps = np.max([k[s] - (T - 1 - s) * rate for s in range(T)], axis=0)
    np.testing.assert_allclose(state, np.stack([a * np.exp(-eps), b * np.exp(-eps), eps]),
                               atol=1e-13)  # fmt: skip


def test_bad_input_is_refused_naming_the_argument():
    k = np.zeros((4, 3))
    with pytest.raises(ValueError, match="w must have 3 entries"):
        rwkv4.wkv(np.zeros(2), np.zeros(3), k, k)
    with pytest.raises(ValueError, match="initial_state must have shape"):
        rwkv4.wkv(np.zeros(3), np.zeros(3), k, k, initial_state=np.zeros((2, 3)))
