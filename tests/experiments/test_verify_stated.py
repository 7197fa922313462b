"""The claims the spec states without printing a check: each `linattn verify` line is
computed by the reference, passes, and fails when the computation it rests on is broken."""

import numpy as np
import pytest

from linattn.experiments import verify

# Section function: its number of lines.
STATED_SECTIONS = {
    "softmax_shift_checks": 2,  # 2: a constant added to a row; the subtraction prevents overflow
    "kernel_smoother_checks": 4,  # 3: Nadaraya-Watson twice, the tensor powers, their series
    "random_feature_bias_checks": 2,  # 4: each kernel value unbiased, the ratio biased at finite r
    "counted_cost_checks": 4,  # 5, 5.1, 9: 4td / 4rd / 6rd and 2nC(r + d) + 4nrd, counted
    "read_change_checks": 3,  # 7.3: (k_i^T k_t) u_t^T, least squares is the best memory
    "hybrid_cache_checks": 2,  # 10: the 3:1 hybrid's cache is 75 percent smaller, "up to"
}


@pytest.mark.parametrize("section", list(STATED_SECTIONS))
def test_the_stated_claims_are_checked_and_pass(section):
    checks = getattr(verify, section)()
    assert len(checks) == STATED_SECTIONS[section]
    assert all(check.passed for check in checks), [c.line() for c in checks if not c.passed]
    assert getattr(verify, section) in verify.SECTIONS
    assert all(len(check.name) <= verify.NAME_WIDTH for check in checks)


def test_the_count_of_checks():
    # 64 before the stated claims; claims add 17.
    assert len(verify.run_checks()) >= 64 + sum(STATED_SECTIONS.values())


def _failing(section, monkeypatch, target, replacement):
    monkeypatch.setattr(target[0], target[1], replacement)
    return [check.name for check in getattr(verify, section)() if not check.passed]


def test_the_shift_check_fails_for_a_softmax_over_columns(monkeypatch):
    def by_columns(G):
        E = np.exp(G)
        return E / E.sum(axis=0, keepdims=True)

    failed = _failing(
        "softmax_shift_checks", monkeypatch, (verify.claims, "softmax_unshifted"), by_columns
    )
    assert failed == ["section 2: a constant added to a row leaves the softmax"]


def test_the_overflow_check_fails_for_a_softmax_that_does_not_subtract(monkeypatch):
    plain = verify.claims.softmax_unshifted
    failed = _failing("softmax_shift_checks", monkeypatch, (verify.claims, "softmax_rows"), plain)
    assert failed == ["section 2: subtracting the largest score prevents overflow"]


def test_nadaraya_watson_fails_without_the_normaliser(monkeypatch):
    def unnormalised(Q, K, V, kernel):
        return np.array([[kernel(q, k) for k in K] for q in Q]) @ V

    failed = _failing(
        "kernel_smoother_checks", monkeypatch, (verify.claims, "nadaraya_watson"), unnormalised
    )
    assert failed == [
        "section 3: softmax is the Nadaraya-Watson estimator",
        "section 3: linear attention: same, kernel phi(q).phi(k)",
    ]


def test_nadaraya_watson_fails_for_a_kernel_without_the_scale(monkeypatch):
    unscaled = lambda q, k: float(np.exp(q @ k))  # noqa: E731
    failed = _failing(
        "kernel_smoother_checks", monkeypatch, (verify.claims, "exponential_kernel"), unscaled
    )
    assert failed == ["section 3: softmax is the Nadaraya-Watson estimator"]


def test_the_series_fails_without_the_factorials(monkeypatch):
    def no_factorials(x, terms):
        return np.concatenate([verify.claims.tensor_power(x, m) for m in range(terms)])

    failed = _failing(
        "kernel_smoother_checks",
        monkeypatch,
        (verify.claims, "exponential_series_features"),
        no_factorials,
    )
    assert failed == ["section 3: 10 tensor-power blocks give exp(q.k)"]


def test_the_tensor_powers_fail_for_a_sum_instead_of_a_product(monkeypatch):
    real = verify.claims.tensor_power
    failed = _failing(
        "kernel_smoother_checks",
        monkeypatch,
        (verify.claims, "tensor_power"),
        lambda x, m: real(x, m) if m < 2 else np.add.outer(real(x, m - 1), x).ravel(),
    )
    assert "section 3: (q.k)^m = <q^(x)m, k^(x)m>, m = 0 to 5" in failed


def test_the_bias_claim_fails_for_an_unbiased_ratio(monkeypatch):
    real = verify.claims.random_feature_ratio

    def exact_ratio(q, K, V, r, draws, rng):
        kernels, outputs, exact = real(q, K, V, r, draws, rng)
        return kernels, outputs - outputs.mean(axis=0) + exact, exact

    failed = _failing(
        "random_feature_bias_checks",
        monkeypatch,
        (verify.claims, "random_feature_ratio"),
        exact_ratio,
    )
    assert failed == ["section 4: the random-feature output is biased at finite r"]


def test_the_unbiased_claim_fails_for_biased_kernel_estimates(monkeypatch):
    real = verify.claims.random_feature_ratio

    def biased(q, K, V, r, draws, rng):
        kernels, outputs, exact = real(q, K, V, r, draws, rng)
        return 1.1 * kernels, outputs, exact

    failed = _failing(
        "random_feature_bias_checks", monkeypatch, (verify.claims, "random_feature_ratio"), biased
    )
    assert failed == ["section 4: r = 2 features: each kernel value is unbiased"]


def test_the_step_costs_fail_for_a_step_that_reads_twice(monkeypatch):
    real = verify.claims.counted_linear_step

    def reads_twice(S, fq, fk, v):
        read, state, ops = real(S, fq, fk, v)
        return read, state, ops + 2 * S.size  # one more read S^T phi(q), 2 r d

    failed = _failing(
        "counted_cost_checks", monkeypatch, (verify.claims, "counted_linear_step"), reads_twice
    )
    assert failed == ["section 9: a step costs 4td, 4rd, 6rd operations, counted"]


def test_the_step_reads_fail_for_a_delta_step_without_the_correction(monkeypatch):
    def additive(S, q, k, v, beta):
        S = S + beta * np.outer(k, v)
        return S.T @ q, S, 6 * S.size

    failed = _failing(
        "counted_cost_checks", monkeypatch, (verify.claims, "counted_delta_step"), additive
    )
    assert failed == ["section 9: the counted steps compute the three reads"]


def test_the_chunk_cost_fails_for_unmasked_blocks_counted_twice(monkeypatch):
    real = verify.claims.counted_chunked_linear

    def counted_twice(FQ, FK, V, C):
        out, ops = real(FQ, FK, V, C)
        return out, ops + 2 * len(V) * C * FK.shape[1]

    failed = _failing(
        "counted_cost_checks", monkeypatch, (verify.claims, "counted_chunked_linear"), counted_twice
    )
    assert failed == ["section 5.1: blocks of C cost 2nC(r + d) + 4nrd, counted"]


def test_the_chunked_output_fails_without_the_state(monkeypatch):
    def no_state(FQ, FK, V, C):
        out = np.vstack(
            [np.tril(FQ[s : s + C] @ FK[s : s + C].T) @ V[s : s + C] for s in range(0, len(V), C)]
        )
        return out, verify.linear_training_ops(len(V), FK.shape[1], V.shape[1], C)

    failed = _failing(
        "counted_cost_checks", monkeypatch, (verify.claims, "counted_chunked_linear"), no_state
    )
    assert failed == ["section 5.1: the counted blocks compute the masked product"]


def test_the_read_change_fails_for_an_additive_write(monkeypatch):
    def additive(S, K, k, v, beta):
        return K @ np.outer(k, beta * v), beta * (v - S.T @ k)

    failed = _failing(
        "read_change_checks", monkeypatch, (verify.claims, "delta_read_change"), additive
    )
    assert failed == ["section 7.3: writing k_t changes read k_i by (k_i.k_t) u_t"]


def test_least_squares_fails_for_the_additive_memory(monkeypatch):
    failed = _failing(
        "read_change_checks", monkeypatch, (verify, "least_squares_memory"), lambda K, V: K.T @ V
    )
    assert failed == [
        "section 7.3: least squares minimises total squared error",
        "section 7.3: least squares is exact for n = 24 <= r = 32",
    ]


def test_the_hybrid_claim_fails_for_a_cache_in_every_layer(monkeypatch):
    real = verify.claims.hybrid_cache_numbers
    failed = _failing(
        "hybrid_cache_checks",
        monkeypatch,
        (verify.claims, "hybrid_cache_numbers"),
        lambda pattern, t, d: real("A" * len(pattern), t, d),
    )
    assert failed == [
        "section 10: a 3:1 hybrid's KV cache is 75 percent smaller",
        "section 10: with the states counted, up to 75 percent",
    ]


def test_the_new_lines_are_printed():
    text = verify.report(verify.run_checks())
    for line in (
        "t = 40, d = r = 8: counted 1,280, 256, 384 operations (softmax, linear attention, "
        "delta rule)",
        "n = 64, r = d = 8, C = 1, 8, 16, 64: counted 18,432, 32,768, 49,152, 147,456 operations",
    ):
        assert line in text
