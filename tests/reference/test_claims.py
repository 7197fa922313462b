"""The spec's claims as computations (linattn.reference.claims): each one checked against its
statement, and against an input that breaks it."""

import numpy as np
import pytest

from linattn.reference import claims, elu_plus_one, linear_attention_quadratic, softmax_attention
from linattn.reference.costs import linear_attention_ops, softmax_training_ops


@pytest.mark.parametrize("d", [1, 8, 64])
def test_score_variance_is_d_within_its_standard_error(d):
    variance, se = claims.score_variance(np.random.default_rng(d), d, 40_000)
    assert abs(variance - d) < 4 * se
    # The standard error is the one of the mean of (q.k)^2: compare with its sample estimate.
    rng = np.random.default_rng(d + 1)
    squares = ((rng.standard_normal((40_000, d)) * rng.standard_normal((40_000, d))).sum(1)) ** 2
    assert se == pytest.approx(squares.std() / np.sqrt(len(squares)), rel=0.1)


def test_softmax_jacobian_norm_within_its_bound_and_of_a_uniform_row():
    rng = np.random.default_rng(0)
    for scale in (0.1, 3.0, 30.0):
        for p in claims.softmax_rows(scale * rng.standard_normal((20, 7))):
            assert claims.softmax_jacobian_norm(p) <= 2 * (1 - p.max()) + 1e-15
    assert claims.softmax_jacobian_norm(np.full(4, 0.25)) == pytest.approx(0.25)


def test_the_two_orders_count_4n2d_and_4nrd():
    rng = np.random.default_rng(0)
    n, d = 12, 3
    Q, K, V = (rng.standard_normal((n, d)) for _ in range(3))
    FQ, FK = np.hstack([Q, Q**2]), np.hstack([K, K**2])  # r = 6 features
    assert claims.softmax_order(Q, K, V) == (softmax_training_ops(n, d), (n, n))
    assert claims.linear_right_order(FQ, FK, V) == (linear_attention_ops(n, 6, d), (6, d))
    assert claims.product_ops(np.ones((2, 3)), np.ones((3, 5))) == 60
    with pytest.raises(ValueError, match="A and B do not multiply"):
        claims.product_ops(np.ones((2, 3)), np.ones((2, 5)))


def test_rank_r_error_is_the_next_singular_value_and_beats_other_rank_r_matrices():
    rng = np.random.default_rng(3)
    M = rng.standard_normal((7, 7))
    sigma = np.linalg.svd(M, compute_uv=False)
    for r in range(1, 7):
        assert claims.rank_r_error(M, r) == pytest.approx(sigma[r], abs=1e-12)
        other = rng.standard_normal((7, r)) @ rng.standard_normal((r, 7))
        assert np.linalg.norm(M - other, 2) >= sigma[r]


def test_the_causal_mask_gives_full_rank_where_the_unmasked_matrix_has_rank_r():
    rng = np.random.default_rng(4)
    Q, K = rng.standard_normal((10, 2)), rng.standard_normal((10, 2))
    _, A = linear_attention_quadratic(Q, K, np.eye(10))
    causal = claims.causal_linear_matrix(Q, K)
    assert np.linalg.matrix_rank(A) <= 2 and np.linalg.matrix_rank(causal) == 10
    assert np.allclose(causal.sum(axis=1), 1) and np.all(np.triu(causal, 1) == 0)


def test_sharpness_bound_holds_for_linear_rows_and_fails_for_softmax_rows():
    rng = np.random.default_rng(6)
    Q, K = rng.standard_normal((12, 4)), rng.standard_normal((9, 4))
    bound = claims.sharpness_bound(elu_plus_one(K))
    _, A = linear_attention_quadratic(100 * Q, K, np.eye(9))
    assert np.all(claims.weight_ratios(A) <= bound[None] * (1 + 1e-12))
    _, P = softmax_attention(100 * Q, K, np.eye(9))
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.nanmax(claims.weight_ratios(P) / bound[None]) > 1  # the bound is linear's
    with pytest.raises(ValueError, match="FK must be strictly positive"):
        claims.sharpness_bound(np.eye(3))


def test_crosstalk_vanishes_exactly_for_orthogonal_keys():
    rng = np.random.default_rng(7)
    V = rng.standard_normal((3, 2))
    assert np.all(claims.crosstalk(np.eye(3), V) == 0)
    Q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    assert np.abs(claims.crosstalk(Q.T, V)).max() < 1e-14
    assert np.abs(claims.crosstalk(elu_plus_one(np.eye(3)), V)).max() > 0.1
    assert claims.feature_gram(elu_plus_one(np.eye(3))).min() > 0


def test_linear_loss_gradient_is_minus_k_v_transpose_at_any_state():
    rng = np.random.default_rng(8)
    k, v = rng.standard_normal(4), rng.standard_normal(3)
    for S in (np.zeros((4, 3)), rng.standard_normal((4, 3)), 1e3 * rng.standard_normal((4, 3))):
        gradient = claims.linear_loss_gradient(S, k, v)
        assert np.allclose(gradient, -np.outer(k, v), rtol=0, atol=1e-9)


def test_softmax_read_is_the_weighted_average_of_the_values():
    rng = np.random.default_rng(9)
    K, V, q = rng.standard_normal((5, 3)), rng.standard_normal((5, 2)), rng.standard_normal(3)
    O, _ = softmax_attention(q[None], K, V)
    assert np.allclose(claims.softmax_read(K, V, q), O[0], rtol=0, atol=1e-15)


def test_bad_claim_inputs():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        claims.score_variance(0, 4, 10)
    with pytest.raises(ValueError, match="samples must be an integer >= 1"):
        claims.score_variance(np.random.default_rng(0), 4, 0)
    with pytest.raises(ValueError, match="r must be an integer >= 1"):
        claims.rank_r_error(np.eye(3), 0)
    with pytest.raises(ValueError, match="G must be a 2-D array"):
        claims.softmax_rows(np.ones(3))
