"""The oracle against hand-written loops of the spec's own cells (sections 5 and 7)."""

from __future__ import annotations

import numpy as np

from linattn.reference.gated import recurrence, transition


def test_additive_rule_is_the_causal_numerator():
    # Section 5: S_t = S_{t-1} + k_t v_t^T, numerator o_t = S_t^T q_t, as a plain loop.
    rng = np.random.default_rng(0)
    Q, K, V = rng.random((9, 4)), rng.random((9, 4)), rng.standard_normal((9, 3))
    expected, S = np.empty((9, 3)), np.zeros((4, 3))
    for t in range(9):
        S = S + np.outer(K[t], V[t])
        expected[t] = Q[t] @ S
    out, final = recurrence(Q, K, V)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(final, K.T @ V, rtol=0, atol=1e-13)
    # and the masked product of section 5.1
    np.testing.assert_allclose(out, np.tril(Q @ K.T) @ V, rtol=0, atol=1e-13)


def test_delta_rule_is_read_correct_write():
    # Section 7: u = beta (v - S^T k); S += k u^T; o = S^T q.
    rng = np.random.default_rng(1)
    Q, K, V = rng.standard_normal((8, 4)), rng.standard_normal((8, 4)), rng.standard_normal((8, 2))
    K /= np.linalg.norm(K, axis=1, keepdims=True)
    beta = rng.random(8) * 2
    expected, S = np.empty((8, 2)), np.zeros((4, 2))
    for t in range(8):
        u = beta[t] * (V[t] - K[t] @ S)
        S = S + np.outer(K[t], u)
        expected[t] = Q[t] @ S
    out, final = recurrence(Q, K, V, beta, rule="delta")
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(final, S, rtol=0, atol=1e-13)


def test_figure6_delta_overwrites():
    keys = np.array([[1.0, 0], [0, 1], [1, 0]])
    values = np.array([[3.0, 1], [-1, 2], [0, 4]])
    _, S_add = recurrence(keys, keys, values)
    _, S_delta = recurrence(keys, keys, values, np.ones(3), rule="delta")
    np.testing.assert_array_equal(S_add, [[3, 5], [-1, 2]])
    np.testing.assert_array_equal(S_delta, [[0, 4], [-1, 2]])


def test_gated_transitions_decay_first():
    rng = np.random.default_rng(2)
    k, S = rng.standard_normal(3), rng.standard_normal((3, 2))
    g_channel = -rng.random(3)
    A = transition(k, 0.7, g_channel, rule="delta")
    # KDA: decay, then read-correct-write on the decayed state.
    decayed = np.exp(g_channel)[:, None] * S
    np.testing.assert_allclose(A @ S, decayed - 0.7 * np.outer(k, k @ decayed), atol=1e-14)
    A_scalar = transition(k, 0.7, -0.3, rule="delta")
    np.testing.assert_allclose(
        A_scalar, np.exp(-0.3) * (np.eye(3) - 0.7 * np.outer(k, k)), atol=1e-14
    )
    np.testing.assert_allclose(transition(k, g_t=g_channel), np.diag(np.exp(g_channel)))
