"""The float64 generalized delta rule (``linattn.reference.dplr``): the literal token loop, its
chunk form and the WY form of a chunk's transitions."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference import delta_rule, dplr


def draws(T=23, K=4, V=3, seed=0):
    rng = np.random.default_rng(seed)
    q, k, b = (rng.standard_normal((T, K)) for _ in range(3))
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    a = -rng.random((T, 1)) * b + 0.1 * rng.standard_normal((T, K))
    return q, k, rng.standard_normal((T, V)), a, b, -rng.random((T, K))


def test_one_step_is_the_transition_then_the_write():
    q, k, v, a, b, g = draws(T=1)
    S0 = np.random.default_rng(1).standard_normal((4, 3))
    o, S = dplr.recurrence(q, k, v, a, b, g, initial_state=S0, scale=0.5)
    want = (np.diag(np.exp(g[0])) + np.outer(a[0], b[0])) @ S0 + np.outer(k[0], v[0])
    np.testing.assert_allclose(S, want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(o[0], want.T @ (0.5 * q[0]), rtol=0, atol=1e-15)


def test_b_reads_the_state_before_the_decay():
    # With a reset (g = -inf: Diag = 0) the state still moves along a, by what b reads in S_{t-1}.
    q, k, v, a, b, _ = draws(T=1)
    S0 = np.ones((4, 3))
    _, S = dplr.recurrence(q, k, v, a, b, np.full((1, 4), -np.inf), initial_state=S0)
    np.testing.assert_allclose(S, np.outer(a[0], b[0] @ S0) + np.outer(k[0], v[0]), atol=1e-15)


@pytest.mark.parametrize("gate", [None, "head", "channel"])
@pytest.mark.parametrize("C", [1, 2, 5, 16, 64])
def test_chunks_equal_the_recurrence(gate, C):
    q, k, v, a, b, g = draws()
    g = None if gate is None else g[:, 0] if gate == "head" else g
    S0 = np.random.default_rng(2).standard_normal((4, 3))
    o, S = dplr.recurrence(q, k, v, a, b, g, initial_state=S0)
    o_c, S_c = dplr.chunked(q, k, v, a, b, g, C, initial_state=S0)
    np.testing.assert_allclose(o_c, o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(S_c, S, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate", [None, "head", "channel"])
def test_the_wy_form_is_the_product_of_the_transitions(gate):
    _, _, _, a, b, g = draws(T=9)
    g = None if gate is None else g[:, 0] if gate == "head" else g
    np.testing.assert_allclose(
        dplr.wy_transition(a, b, g), dplr.transition_product(a, b, g), rtol=0, atol=1e-14
    )


def test_the_delta_rules_a_and_b_give_the_delta_rule():
    q, k, v, _, _, _ = draws()
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta = np.random.default_rng(3).random(len(k)) * 2
    o, S = dplr.recurrence(q, k, beta[:, None] * v, -beta[:, None] * k, k)
    o_ref, S_ref = delta_rule(q, k, v, beta)
    np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(S, S_ref, rtol=0, atol=1e-13)


def test_bad_input_is_refused_naming_it():
    q, k, v, a, b, g = draws()
    with pytest.raises(ValueError, match="b"):
        dplr.recurrence(q, k, v, a, b[:, :2], g)
    with pytest.raises(ValueError, match="a"):
        dplr.recurrence(q, k, v, np.full_like(a, np.nan), b, g)
    with pytest.raises(ValueError, match="g"):
        dplr.recurrence(q, k, v, a, b, -g)
    with pytest.raises(ValueError, match="C"):
        dplr.chunked(q, k, v, a, b, g, 0)
