"""Rank and sharpness of attention matrices (sections 6.1, 6.2, Figure 4)."""

import numpy as np
import pytest

from linattn.reference import (
    attention_maps,
    elu_plus_one,
    linear_attention_quadratic,
    matrix_rank,
    mean_peak_weight,
)


def test_figure4_ranks_and_peak_weights():
    P, A = attention_maps(np.random.default_rng(1))
    assert P.shape == A.shape == (16, 16)
    # The spec prints: softmax rank 16, peak 0.39; linear rank 4, peak 0.10.
    assert (matrix_rank(P), matrix_rank(A)) == (16, 4)
    assert f"{mean_peak_weight(P):.2f}" == "0.39"
    assert f"{mean_peak_weight(A):.2f}" == "0.10"


@pytest.mark.parametrize(("n", "d"), [(10, 2), (30, 3), (40, 8)])
def test_unmasked_linear_rank_is_at_most_r(n, d):
    P, A = attention_maps(np.random.default_rng(n), n=n, d=d)
    assert matrix_rank(A) <= d
    assert matrix_rank(P) > d


def test_mean_peak_weight_of_uniform_and_one_hot_rows():
    assert mean_peak_weight(np.full((8, 8), 1 / 8)) == pytest.approx(1 / 8)
    assert mean_peak_weight(np.eye(5)) == 1.0


def test_no_linear_row_is_more_peaked_than_its_keys_allow():
    # Section 6.2: A_ij / A_il <= max_m phi(k_j)_m / phi(k_l)_m, whatever the query's scale.
    rng = np.random.default_rng(6)
    Q, K = rng.standard_normal((12, 4)), rng.standard_normal((9, 4))
    FK = elu_plus_one(K)
    bound = (FK[:, None, :] / FK[None, :, :]).max(axis=2)  # (j, l)
    for scale in (1.0, 10.0, 100.0):
        _, A = linear_attention_quadratic(scale * Q, K, np.eye(9))
        ratios = A[:, :, None] / A[:, None, :]  # (i, j, l)
        assert np.all(ratios <= bound[None] * (1 + 1e-12))


def test_bad_map_inputs():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        attention_maps(1)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        attention_maps(np.random.default_rng(0), n=0)
    with pytest.raises(ValueError, match="M must be a 2-D array"):
        matrix_rank(np.ones(3))
