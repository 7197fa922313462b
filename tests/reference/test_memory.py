"""The memory (sections 6.3, 7, 7.3): Figures 5 and 6, least squares, Kaczmarz, Table 1's rows."""

import numpy as np
import pytest

from linattn.reference import (
    figure5_example,
    figure6_example,
    kaczmarz_sweeps,
    least_squares_memory,
    recall_errors,
    recall_theory,
)
from linattn.reference.memory import unit


def test_figure5_matches_the_spec():
    f = figure5_example()
    np.testing.assert_array_equal(f["S2"], [[3, 1], [-1, 2]])
    np.testing.assert_array_equal(f["S3"], [[5, 1], [1, 2]])
    np.testing.assert_array_equal(f["keys"][:2] @ f["S2"], f["values"][:2])
    np.testing.assert_array_equal(f["crosstalk"], [[2, 0], [2, 0], [1, 1.5]])


def test_figure6_matches_the_spec():
    f = figure6_example()
    np.testing.assert_array_equal(f["additive_S3"], [[3, 5], [-1, 2]])
    np.testing.assert_array_equal(f["delta_S3"], [[0, 4], [-1, 2]])
    np.testing.assert_array_equal(f["u3"], [-3, 3])


def test_least_squares_is_exact_up_to_r_pairs_and_optimal_beyond():
    rng = np.random.default_rng(0)
    K, V = unit(rng.standard_normal((6, 8))), rng.standard_normal((6, 3))
    np.testing.assert_allclose(K @ least_squares_memory(K, V), V, atol=1e-13)
    K, V = unit(rng.standard_normal((20, 8))), rng.standard_normal((20, 3))
    S = least_squares_memory(K, V)
    best = np.sum((K @ S - V) ** 2)
    for _ in range(5):  # no perturbation of the least-squares memory lowers the error
        assert np.sum((K @ (S + 1e-3 * rng.standard_normal(S.shape)) - V) ** 2) > best


def test_kaczmarz_sweeps_converge_for_a_consistent_system():
    rng = np.random.default_rng(4)
    K, V = unit(rng.standard_normal((24, 32))), unit(rng.standard_normal((24, 32)))
    errors = [np.abs(K @ kaczmarz_sweeps(K, V, s) - V).max() for s in (1, 20, 200)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-4  # the spec prints 1.4e-05
    # One sweep is the delta rule with beta = 1 (unit keys).
    from linattn.reference import delta_rule

    np.testing.assert_allclose(kaczmarz_sweeps(K, V, 1), delta_rule(K, K, V, np.ones(24))[1])


def test_recall_theory():
    additive, least_squares = recall_theory(64, 32)
    assert additive == pytest.approx(np.sqrt(63 / 32))
    assert least_squares == pytest.approx(np.sqrt(0.5))
    assert recall_theory(16, 32)[1] == 0.0


def test_recall_errors_is_reproducible_and_consistent():
    a = recall_errors(8, r=16, repetitions=10, seed=5)
    assert a == recall_errors(8, r=16, repetitions=10, seed=5)
    assert a["delta, all pairs"] == a["delta, 8 newest"]  # n = 8: the newest 8 are all pairs
    assert a["least squares"] < 1e-12
    assert a["delta, all pairs"] < a["additive"]
    calls = []
    recall_errors(4, r=8, repetitions=3, on_repetition=lambda: calls.append(1))
    assert len(calls) == 3


def test_bad_memory_inputs():
    with pytest.raises(ValueError, match="repetitions must be an integer >= 1"):
        recall_errors(8, repetitions=0)
    with pytest.raises(ValueError, match="seed must be a nonnegative integer"):
        recall_errors(8, seed=-1)
    with pytest.raises(ValueError, match="K and V must have the same number of rows"):
        least_squares_memory(np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="sweeps must be an integer >= 1"):
        kaczmarz_sweeps(np.eye(2), np.eye(2), 0)
    with pytest.raises(ValueError, match="zero row"):
        kaczmarz_sweeps(np.zeros((2, 2)), np.eye(2), 1)
