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


def test_softmax_unshifted_equals_the_shifted_softmax_and_overflows_where_it_does_not():
    G = np.random.default_rng(8).standard_normal((5, 7))
    assert np.abs(claims.softmax_unshifted(G) - claims.softmax_rows(G)).max() < 1e-15
    assert not np.all(np.isfinite(claims.softmax_unshifted(G + 800)))
    assert np.all(np.isfinite(claims.softmax_rows(G + 800)))


def test_nadaraya_watson_is_a_weighted_average_for_any_nonnegative_kernel():
    rng = np.random.default_rng(9)
    Q, K, V = rng.standard_normal((4, 3)), rng.standard_normal((6, 3)), rng.standard_normal((6, 2))
    out = claims.nadaraya_watson(Q, K, V, lambda q, k: float(np.exp(-((q - k) ** 2).sum())))
    assert np.all(out <= V.max(axis=0) + 1e-15) and np.all(out >= V.min(axis=0) - 1e-15)
    one = claims.nadaraya_watson(Q, K, V, lambda q, k: 1.0)
    assert np.abs(one - V.mean(axis=0)).max() < 1e-15
    with pytest.raises(ValueError, match="same number of columns"):
        claims.nadaraya_watson(Q, K[:, :2], V, claims.exponential_kernel)


def test_tensor_powers_and_the_exponential_series():
    q, k = np.array([0.3, -0.2]), np.array([0.5, 0.4])
    assert claims.tensor_power(q, 0).tolist() == [1.0]
    assert claims.tensor_power(q, 3).shape == (8,)
    assert claims.tensor_power(q, 3) @ claims.tensor_power(k, 3) == pytest.approx((q @ k) ** 3)
    features = claims.exponential_series_features
    assert features(q, 12) @ features(k, 12) == pytest.approx(np.exp(q @ k), abs=1e-14)
    assert abs(features(q, 2) @ features(k, 2) - np.exp(q @ k)) > 1e-3
    with pytest.raises(ValueError, match="terms must be an integer >= 1"):
        features(q, 0)


def test_random_feature_ratio_shapes_and_its_exact_output():
    rng = np.random.default_rng(10)
    q, K, V = 0.3 * rng.standard_normal(3), 0.3 * rng.standard_normal((4, 3)), np.eye(4)
    kernels, outputs, exact = claims.random_feature_ratio(q, K, V, 5, 7, rng)
    assert kernels.shape == (7, 4) and outputs.shape == (7, 4) and exact.shape == (4,)
    assert np.all(kernels > 0) and np.allclose(outputs.sum(axis=1), 1)
    assert np.allclose(exact, softmax_attention(q[None] * np.sqrt(3), K, V)[0][0])
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        claims.random_feature_ratio(q, K, V, 5, 7, 0)


def test_the_counted_steps_and_blocks():
    rng = np.random.default_rng(11)
    t, r, d = 9, 5, 3
    K, V, q = rng.standard_normal((t, d)), rng.standard_normal((t, d)), rng.standard_normal(d)
    o, ops = claims.counted_softmax_step(q, K, V)
    assert ops == 4 * t * d and np.allclose(o, softmax_attention(q[None], K, V)[0][0])
    S = rng.standard_normal((r, d))
    fq, fk, v = rng.random(r), rng.random(r), rng.standard_normal(d)
    read, S1, ops = claims.counted_linear_step(S, fq, fk, v)
    assert (
        ops == 4 * r * d and np.allclose(S1, S + np.outer(fk, v)) and np.allclose(read, S1.T @ fq)
    )
    read, S2, ops = claims.counted_delta_step(S, fq, fk, v, 0.5)
    assert ops == 6 * r * d and np.allclose(fk @ S2, fk @ S + 0.5 * (fk @ fk) * (v - fk @ S))
    FQ, FK, W = rng.random((10, r)), rng.random((10, r)), rng.standard_normal((10, d))
    for C in (1, 3, 10, 12):  # 3 does not divide 10: the last block is short
        out, ops = claims.counted_chunked_linear(FQ, FK, W, C)
        assert np.allclose(out, np.tril(FQ @ FK.T) @ W)
        if 10 % C == 0:
            assert ops == 2 * 10 * C * (r + d) + 4 * 10 * r * d


def test_delta_read_change_and_total_read_error():
    rng = np.random.default_rng(12)
    S, K = rng.standard_normal((4, 2)), rng.standard_normal((3, 4))
    k, v = rng.standard_normal(4), rng.standard_normal(2)
    change, u = claims.delta_read_change(S, K, k, v, 0.3)
    assert np.allclose(change, np.outer(K @ k, u)) and np.allclose(u, 0.3 * (v - S.T @ k))
    assert claims.total_read_error(np.eye(2), np.ones((2, 2)), np.zeros((2, 2))) == 4.0


def test_hybrid_cache_numbers():
    assert claims.hybrid_cache_numbers("LLLA", 10, 4) == 80
    assert claims.hybrid_cache_numbers("AAAA", 10, 4) == 320
    assert claims.hybrid_cache_numbers("L", 10, 4) == 0
    for bad in ("", "LLXA", None):
        with pytest.raises(ValueError, match="pattern must be a non-empty string"):
            claims.hybrid_cache_numbers(bad, 10, 4)
