"""The delta rule (sections 7, 7.2, 8): recurrence, pseudo-values, chunks, WY form."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn.reference import (
    chunked_delta_rule,
    delta_rule,
    householder_spectrum,
    pseudo_values,
    transition_product,
    ut_transform,
    wy_transition,
)
from linattn.reference.memory import unit


def draws(n=19, r=6, d=4, seed=3, beta_high=1.0):
    rng = np.random.default_rng(seed)
    Q, K = unit(rng.standard_normal((n, r))), unit(rng.standard_normal((n, r)))
    V = rng.standard_normal((n, d))
    beta = rng.uniform(0.0, beta_high, n)
    return Q, K, V, beta


def test_the_recurrence_is_the_householder_form():
    Q, K, V, beta = draws()
    S0 = np.random.default_rng(9).standard_normal((6, 4))
    O, S = delta_rule(Q, K, V, beta, initial_state=S0)
    H = S0.copy()
    for t in range(len(K)):
        H = (np.eye(6) - beta[t] * np.outer(K[t], K[t])) @ H + beta[t] * np.outer(K[t], V[t])
        np.testing.assert_allclose(O[t], H.T @ Q[t], atol=1e-13)
    np.testing.assert_allclose(S, H, atol=1e-13)


def test_with_beta_one_the_newest_pair_reads_back_exactly():
    Q, K, V, _ = draws()
    for t in (1, 5, 18):
        _, S = delta_rule(Q[: t + 1], K[: t + 1], V[: t + 1], np.ones(t + 1))
        np.testing.assert_allclose(K[t] @ S, V[t], atol=1e-13)


def test_pseudo_values_solve_the_triangular_system():
    Q, K, V, beta = draws(n=7)
    S = np.random.default_rng(1).standard_normal((6, 4))
    U = pseudo_values(K, V, beta, S)
    # The definition: u_t = beta_t (v_t - S_{t-1}^T k_t), S_t = S_{t-1} + k_t u_t^T.
    state = S.copy()
    for t in range(7):
        u = beta[t] * (V[t] - K[t] @ state)
        np.testing.assert_allclose(U[t], u, atol=1e-13)
        state += np.outer(K[t], u)
    T = ut_transform(K, beta)
    np.testing.assert_allclose(U, T @ (V - K @ S), atol=1e-13)
    L = np.tril(beta[:, None] * (K @ K.T), -1)
    np.testing.assert_allclose((np.eye(7) + L) @ T, np.diag(beta), atol=1e-14)
    assert np.all(np.triu(T, 1) == 0)


@pytest.mark.parametrize("C", [1, 2, 4, 5, 18, 19, 20, 64])
def test_chunks_of_any_size_equal_the_recurrence(C):
    Q, K, V, beta = draws(beta_high=2.0)
    S0 = np.random.default_rng(2).standard_normal((6, 4))
    O, S = delta_rule(Q, K, V, beta, initial_state=S0)
    Oc, Sc = chunked_delta_rule(Q, K, V, beta, C, initial_state=S0)
    np.testing.assert_allclose(Oc, O, atol=1e-12)
    np.testing.assert_allclose(Sc, S, atol=1e-12)


@pytest.mark.parametrize("C", [1, 2, 6, 9])
def test_the_wy_form_is_the_transition_product(C):
    _, K, _, beta = draws(n=C, beta_high=2.0)
    product = transition_product(K, beta)
    np.testing.assert_allclose(wy_transition(K, beta), product, atol=1e-13)
    # Latest on the left: the product applied to S is the recurrence with zero values.
    S = np.random.default_rng(4).standard_normal((6, 3))
    _, S_after = delta_rule(K, K, np.zeros((C, 3)), beta, initial_state=S)
    np.testing.assert_allclose(product @ S, S_after, atol=1e-13)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0, 1.5, 2.0])
def test_householder_spectrum(beta):
    k = unit(np.random.default_rng(7).standard_normal((1, 8)))[0]
    low, high, norm = householder_spectrum(k, beta)
    assert low == pytest.approx(min(1 - beta, 1.0), abs=1e-14)
    assert high == pytest.approx(max(1 - beta, 1.0), abs=1e-14)
    assert norm == pytest.approx(1.0, abs=1e-14)


def test_bad_delta_inputs():
    Q, K, V, beta = draws()
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        delta_rule(Q, K, V, beta + 2.5)
    with pytest.raises(ValueError, match="beta must have 19 entries"):
        delta_rule(Q, K, V, beta[:-1])
    with pytest.raises(ValueError, match="Q and K must have the same shape"):
        delta_rule(Q[:, :5], K, V, beta)
    with pytest.raises(ValueError, match="K and V must have the same number of rows"):
        chunked_delta_rule(Q, K, V[:-1], beta, 4)
    with pytest.raises(ValueError, match="C must be an integer >= 1"):
        chunked_delta_rule(Q, K, V, beta, -3)
    with pytest.raises(ValueError, match=r"initial_state must have shape \(6, 4\)"):
        delta_rule(Q, K, V, beta, initial_state=np.zeros((4, 6)))
    with pytest.raises(ValueError, match=r"S must have shape"):
        pseudo_values(K, V, beta, np.zeros((6, 5)))
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        householder_spectrum(K[0], 2.5)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20), C=st.integers(1, 24), seed=st.integers(0, 2**16))
def test_chunked_equals_recurrent_for_any_n_and_chunk_size(n, C, seed):
    Q, K, V, beta = draws(n=n, seed=seed, beta_high=2.0)
    O, S = delta_rule(Q, K, V, beta)
    Oc, Sc = chunked_delta_rule(Q, K, V, beta, C)
    np.testing.assert_allclose(Oc, O, atol=1e-10)
    np.testing.assert_allclose(Sc, S, atol=1e-10)
