"""linattn.reference.gsa: gated slot attention's float64 loop, on cases worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference.gsa import abc_control, gated_slot_attention


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_one_token_by_hand():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 3)), rng.normal(size=(1, 3)), rng.normal(size=(1, 2))
    s, g = rng.random((1, 4)), np.log(rng.random((1, 4)))
    Sk0, Sv0 = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    o, (Sk, Sv) = gated_slot_attention(q, k, v, s, g, scale=0.5, initial_state=(Sk0, Sv0))
    alpha = np.exp(g[0])
    Sk_want = Sk0 * alpha + np.outer(k[0], s[0])  # the slots are S_k's columns
    Sv_want = alpha[:, None] * Sv0 + np.outer(s[0], v[0])
    np.testing.assert_allclose(Sk, Sk_want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(Sv, Sv_want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(o[0], Sv_want.T @ _softmax(Sk_want.T @ (0.5 * q[0])), atol=1e-15)


def test_abc_control_is_the_cumulative_softmax():
    s = np.random.default_rng(1).normal(size=(6, 3))
    weights, gates = abc_control(s)
    z = np.logaddexp.accumulate(s, axis=0)
    np.testing.assert_allclose(weights, np.exp(s - z), atol=1e-15)
    np.testing.assert_allclose(gates[1:], z[:-1] - z[1:], atol=1e-15)
    assert np.all(gates[0] == 0)


def test_bad_shapes_are_refused():
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match="q, k must be"):
        gated_slot_attention(x, x[:2], x, x)
    with pytest.raises(ValueError, match="g must have the shape of s"):
        gated_slot_attention(x, x, x, x, np.zeros((3, 1)))
