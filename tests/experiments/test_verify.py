"""`linattn verify`: every check of the spec passes, named as the spec names it, with its error."""

import argparse
import json
import math
import re

import numpy as np
import pytest

from linattn.experiments import verify
from linattn.experiments.verify import SECTIONS, Check, compare, report, run_checks, to_json
from linattn.reference import linear_attention_quadratic

# The checks that the spec prints, by the spec's names, with the largest error it prints.
SPEC_ERRORS = {
    "causal softmax: each row sums to one": 2.2e-16,
    "causal softmax: no weight above the diagonal": 0.0,
    "(phi(Q) phi(K)^T) V equals phi(Q) (phi(K)^T V)": 1.0e-16,
    "positive random features: estimate / exp(q.k)": 2.3e-03,
    "the recurrence equals the masked product": 3.3e-16,
    "chunks of C = 1 equal the masked product": 2.8e-16,
    "chunks of C = 7 equal the masked product": 2.2e-16,
    "chunks of C = 16 equal the masked product": 2.8e-16,
    "chunks of C = 64 equal the masked product": 2.2e-16,
    "Figure 5: S_2 and S_3": 0.0,
    "Figure 5: two orthogonal keys read exactly": 0.0,
    "Figure 5: the crosstalk after the third write": 0.0,
    "Figure 6: additive S_3": 0.0,
    "Figure 6: delta-rule S_3": 0.0,
    "Figure 6: the pseudo-value u_3": 0.0,
    "read-correct-write equals the Householder form": 2.2e-16,
    "the gradient formula, against a central difference": 7.5e-11,
    "the delta rule is one gradient step of size beta": 2.2e-16,
    "the read-back mixes the old read and the new value": 3.9e-16,
    "24 pairs swept 200 times: the reads converge": 1.4e-05,
    "delta rule: chunks of C = 1 equal the recurrence": 4.4e-16,
    "delta rule: chunks of C = 5 equal the recurrence": 8.9e-16,
    "delta rule: chunks of C = 16 equal the recurrence": 8.9e-16,
    "delta rule: chunks of C = 64 equal the recurrence": 1.1e-15,
    "WY form: the product of 6 transitions is I - K^T T K": 2.2e-16,
}


def half_unit(printed: str) -> float:
    """Half a unit of the last digit a number is printed with: "0.0063" -> 5e-5, "1.28e+05" ->
    500, "2.3e-03" -> 5e-5. A value within it of the printed number rounds to the same digits."""
    mantissa, _, exponent = printed.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def agrees_with_print(value: float, printed: str) -> bool:
    """|value - printed| <= half a unit of its last printed digit (a bound, not a string match:
    a -0.00 or a 1-ulp change that lands on the same digits passes alike)."""
    return abs(value - float(printed)) <= half_unit(printed) * (1 + 1e-9)


def test_half_unit_and_the_bound():
    assert half_unit("0.0063") == pytest.approx(5e-5)
    assert half_unit("1.28e+05") == pytest.approx(500.0)
    assert half_unit("5.09e-13") == pytest.approx(5e-16)
    assert half_unit("+1.00") == pytest.approx(5e-3)
    assert agrees_with_print(0.00634, "0.0063") and agrees_with_print(-1e-17, "+0.00")
    assert not agrees_with_print(0.00636, "0.0063") and not agrees_with_print(0.0062, "0.0063")


@pytest.fixture(scope="module")
def all_checks():
    return run_checks()


@pytest.fixture(scope="module")
def checks(all_checks):
    return {check.name: check for check in all_checks}


@pytest.mark.parametrize("section", SECTIONS, ids=[s.__name__ for s in SECTIONS])
def test_every_check_passes(section):
    for check in section():
        assert check.passed, check.line()


def test_every_printed_check_of_the_spec_is_there_in_order(all_checks):
    names = [check.name for check in all_checks]
    spec_names = [name for name in names if name in SPEC_ERRORS]
    assert spec_names == list(SPEC_ERRORS)  # all of them, in the spec's order


@pytest.mark.parametrize("name", list(SPEC_ERRORS))
def test_largest_errors_are_of_the_spec_order(checks, name):
    printed, error = SPEC_ERRORS[name], checks[name].error
    if printed == 0.0:
        assert error == 0.0  # exact in the spec: small integers
    elif printed < 1e-14:
        assert error <= 1e-14  # rounding: a few units of 2.2e-16 (BLAS-dependent)
    else:  # not rounding: the same seeds, the same number to the spec's two printed digits
        assert agrees_with_print(error, f"{printed:.1e}"), (error, printed)


# The informational lines of the spec: a pattern of the line (NUM where it prints a measured
# number) and the numbers it prints, which ours must equal to their last printed digit.
NUM = r"([-+]?[0-9.]+(?:e[-+][0-9]+)?)"
SPEC_LINES = [
    ("relative standard error of the estimate: NUM", ("0.0063",)),
    ("d = 1, n = 6: determinant NUM, condition number NUM", ("5.09e-13", "1.28e+05")),
    (" softmax: rank 16, mean of the largest weight in a row NUM", ("0.39",)),
    ("  linear: rank  4, mean of the largest weight in a row NUM", ("0.10",)),
    ("beta = 0.0: eigenvalues from NUM to NUM, spectral norm NUM", ("+1.00", "+1.00", "1.00")),
    ("beta = 0.5: eigenvalues from NUM to NUM, spectral norm NUM", ("+0.50", "+1.00", "1.00")),
    ("beta = 1.0: eigenvalues from NUM to NUM, spectral norm NUM", ("+0.00", "+1.00", "1.00")),
    ("beta = 2.0: eigenvalues from NUM to NUM, spectral norm NUM", ("-1.00", "+1.00", "1.00")),
]


@pytest.mark.parametrize("pattern, printed", SPEC_LINES, ids=[p for p, _ in SPEC_LINES])
def test_the_informational_lines(checks, pattern, printed):
    details = "\n".join(check.detail for check in checks.values())
    regex = "^" + re.escape(pattern).replace("NUM", NUM) + "$"
    found = re.findall(regex, details, flags=re.MULTILINE)
    assert len(found) == 1, f"{len(found)} lines match {pattern!r}"
    numbers = found[0] if isinstance(found[0], tuple) else (found[0],)
    for value, spec in zip(numbers, printed, strict=True):
        assert agrees_with_print(float(value), spec), (pattern, value, spec)


def test_the_counted_lines(checks):
    """Exact integers (numbers of a cache and a state, their ratio, bytes): not rounding."""
    details = "\n".join(check.detail for check in checks.values())
    assert "cache 33,554,432 numbers, state 16,512, ratio 2032" in details
    assert "P at n = 32,768: 2 GiB" in details


def test_a_failing_check_is_reported_and_exits_1(monkeypatch, capsys):
    failing = compare("a check that fails", [1.0, 2.0], [1.0, 2.5])
    assert not failing.passed and failing.error == 0.5
    assert failing.line().endswith("FAIL")
    monkeypatch.setattr(verify, "SECTIONS", (lambda: [failing],))
    assert verify.run(argparse.Namespace(json=False)) == 1
    out = capsys.readouterr().out
    assert "a check that fails" in out and "FAIL" in out and "FAILED: 1 of 1" in out


def test_non_finite_errors_fail():
    assert not compare("nan", [float("nan")], [0.0]).passed


def test_line_format():
    line = Check("causal softmax: each row sums to one", 2.2e-16, 1e-12, True).line()
    assert line.startswith(f"{'causal softmax: each row sums to one':<58} largest error 2.2e-16")
    assert "tolerance 1.0e-12" in line and line.endswith("PASS")
    assert Check("a claim", math.nan, math.nan, False).line().endswith("claim" + " " * 22 + "FAIL")


def test_json_is_the_same_checks(all_checks):
    checks = all_checks
    payload = json.loads(to_json(checks))
    assert payload["passed"] is True
    assert [row["name"] for row in payload["checks"]] == [c.name for c in checks]
    assert report(checks).splitlines()[-1] == f"all {len(checks)} checks passed"


# The spec's claims that it proves or states without printing a check, by section.
CLAIM_SECTIONS = {
    "variance_checks": 4,  # 2: Var(q.k) = d at two d, the rows sharpen, their gradient vanishes
    "cost_table_checks": 3,  # 4: 4 n^2 d and n x n, 4 n r d and r x d, cheaper when n > r
    "reordering_checks": 2,  # 5.1: (A o L) V row by row, and it is not the reordered product
    "eckart_young_checks": 4,  # 6.1: sigma_(r+1) twice, no rank-4 matrix beats it, causal rank
    "sharpness_checks": 2,  # 6.2: the bound, and softmax rows that do become one-hot
    "positive_feature_checks": 3,  # 6.3: no two positive features orthogonal, crosstalk
    "linear_loss_checks": 2,  # 7.1: the gradient -k v^T anywhere, a step corrects nothing
    "overwrite_checks": 3,  # 9: a new value under an old key, three mechanisms
    "stored_pair_checks": 5,  # 9: reading one stored pair, three mechanisms
}


@pytest.mark.parametrize("section", list(CLAIM_SECTIONS))
def test_the_claims_are_checked_and_pass(section):
    checks = getattr(verify, section)()
    assert len(checks) == CLAIM_SECTIONS[section]
    assert all(check.passed for check in checks), [c.line() for c in checks if not c.passed]
    assert getattr(verify, section) in SECTIONS


def _failing(section, monkeypatch, target, replacement):
    monkeypatch.setattr(target[0], target[1], replacement)
    return [check.name for check in getattr(verify, section)() if not check.passed]


def test_the_variance_check_fails_for_a_variance_of_2d(monkeypatch):
    real = verify.claims.score_variance
    failed = _failing(
        "variance_checks",
        monkeypatch,
        (verify.claims, "score_variance"),
        lambda rng, d, samples: (2 * real(rng, d, samples)[0], real(rng, d, samples)[1]),
    )
    assert failed[:2] == [
        "section 2: q.k has variance d = 16; / sqrt(d), variance 1",
        "section 2: q.k has variance d = 256; / sqrt(d), variance 1",
    ]


def test_the_jacobian_check_fails_when_the_gradient_is_not_small(monkeypatch):
    failed = _failing(
        "variance_checks", monkeypatch, (verify.claims, "softmax_jacobian_norm"), lambda p: 0.5
    )
    assert failed == ["section 2: a row on one key has a gradient close to zero"]


def test_the_cost_table_fails_for_an_order_that_builds_n_by_n(monkeypatch):
    failed = _failing(
        "cost_table_checks",
        monkeypatch,
        (verify.claims, "linear_right_order"),
        lambda FQ, FK, V: verify.claims.softmax_order(FQ, FK, V),
    )
    assert failed == ["section 4: linear attention costs 4 n r d, through r x d"]


def test_the_cost_table_fails_if_linear_attention_were_4_n_r_d_squared(monkeypatch):
    failed = _failing(
        "cost_table_checks",
        monkeypatch,
        (verify, "linear_attention_ops"),
        lambda n, r, d: 4 * n * r * d * d,
    )
    assert failed == ["section 4: linear attention is cheaper exactly when n > r"]


def test_the_reordering_claim_fails_without_the_mask(monkeypatch):
    # With the mask replaced by all ones the two products agree, and the claim must fail.
    failed = _failing("reordering_checks", monkeypatch, (verify.np, "tril"), lambda A: A)
    assert "section 5.1: (A o L) V differs from phi(Q) (phi(K)^T V)" in failed


def test_eckart_young_fails_for_a_worse_approximation(monkeypatch):
    real = verify.claims.rank_r_error
    failed = _failing(
        "eckart_young_checks",
        monkeypatch,
        (verify.claims, "rank_r_error"),
        lambda M, r: real(M, max(r - 1, 1)) if r > 1 else real(M, r),
    )
    assert failed == [
        "Eckart-Young, d = 1 softmax: best rank-r error sigma_(r+1)",
        "Eckart-Young, Figure 4: best rank-r error sigma_(r+1)",
    ]


def test_the_causal_rank_claim_fails_for_the_unmasked_matrix(monkeypatch):
    def unmasked(Q, K):
        return linear_attention_quadratic(Q, K, np.eye(len(K)))[1]

    failed = _failing(
        "eckart_young_checks", monkeypatch, (verify.claims, "causal_linear_matrix"), unmasked
    )
    assert failed == ["section 6.1: the causal mask raises the linear rank to n"]


def test_the_sharpness_bound_fails_when_halved(monkeypatch):
    real = verify.claims.sharpness_bound
    failed = _failing(
        "sharpness_checks", monkeypatch, (verify.claims, "sharpness_bound"), lambda FK: real(FK) / 2
    )
    assert failed == ["section 6.2: no query beats the keys' bound on A_ij / A_il"]


def test_positive_feature_checks_fail_for_a_map_with_zeros(monkeypatch):
    relu = lambda X: np.maximum(X, 0.0)  # noqa: E731
    failed = _failing("positive_feature_checks", monkeypatch, (verify, "elu_plus_one"), relu)
    assert failed == [
        "section 6.3: positive features: no two keys orthogonal",
        "section 6.3: the same keys through elu + 1: crosstalk",
    ]


def test_the_linear_loss_checks_fail_for_the_squared_loss(monkeypatch):
    squared = lambda S, k, v: np.outer(k, S.T @ k - v)  # noqa: E731
    failed = _failing(
        "linear_loss_checks", monkeypatch, (verify.claims, "linear_loss_gradient"), squared
    )
    assert failed == [
        "section 7.1: the linear loss has gradient -k v^T at any S",
        "section 7.1: a step on it at a stored v reads 2 v back",
    ]


def test_the_overwrite_checks_fail_for_a_cache_that_keeps_only_the_last_value(monkeypatch):
    failed = _failing(
        "overwrite_checks", monkeypatch, (verify.claims, "softmax_read"), lambda K, V, q: V[-1]
    )
    assert failed == ["section 9: softmax keeps both values of a key in its cache"]


def test_the_stored_pair_checks_fail_for_a_memory_without_crosstalk(monkeypatch):
    failed = _failing(
        "stored_pair_checks", monkeypatch, (verify.claims, "crosstalk"), lambda K, V: 0 * V
    )
    assert failed == ["section 9: r + 1 = 5 keys in R^4 have crosstalk"]


def test_the_new_claims_are_printed(all_checks):
    text = report(all_checks)
    for line in (
        "r = d = 128, n = 1 to 4,096: fewer operations from n = 129",
        "Figure 4's queries and keys, r = 4: unmasked rank 4, masked rank 16",
        "d = 1, n = 6: the softmax matrix is nonsingular (det > 0)",
    ):
        assert line in text


def test_the_dplr_checks_are_there_and_pass():
    checks = verify.dplr_checks()
    assert [c.name for c in checks] == [
        *(f"DPLR: chunks of C = {C} equal the recurrence" for C in (1, 5, 16, 64)),
        "DPLR WY form: the product of 16 transitions",
        "DPLR with the delta rule's a, b is the delta rule",
        "DPLR with the delta rule's a, b is Gated DeltaNet",
        "DPLR with the delta rule's a, b is KDA",
    ]
    assert all(c.passed and c.error < 1e-14 for c in checks), [c.line() for c in checks]
    assert verify.dplr_checks in SECTIONS


def test_the_dplr_chunk_checks_fail_with_the_inclusive_gate(monkeypatch):
    # b reads the state entering its token: decayed to G_{t-1}, not G_t.
    failed = _failing("dplr_checks", monkeypatch, (verify.dplr, "exclusive"), lambda G: G)
    assert failed == [
        *(f"DPLR: chunks of C = {C} equal the recurrence" for C in (1, 5, 16, 64)),
        "DPLR WY form: the product of 16 transitions",
    ]


def test_the_dplr_checks_fail_without_the_solve(monkeypatch):
    # T = I instead of (I - A_ba)^{-1}: the reads ignore the chunk's own earlier writes along a.
    eye = lambda A, B, **kw: B  # noqa: E731
    failed = _failing("dplr_checks", monkeypatch, (verify.dplr, "solve_triangular"), eye)
    assert failed == [
        *(f"DPLR: chunks of C = {C} equal the recurrence" for C in (5, 16, 64)),
        "DPLR WY form: the product of 16 transitions",
    ]


def test_the_dplr_rows_fail_for_a_transition_without_its_diagonal(monkeypatch):
    # Diag(exp g) dropped from the transition: the gated rows are no longer Gated DeltaNet, KDA.
    undecayed = lambda a, b, g=None: np.eye(len(a)) + np.outer(a, b)  # noqa: E731
    failed = _failing("dplr_checks", monkeypatch, (verify.dplr, "transition"), undecayed)
    assert "DPLR with the delta rule's a, b is Gated DeltaNet" in failed
    assert "DPLR with the delta rule's a, b is KDA" in failed
    assert "DPLR with the delta rule's a, b is the delta rule" not in failed


def test_the_state_tracking_constructions(monkeypatch):
    """7 lines, exact to rounding; a broken construction fails its line."""
    checks = verify.state_tracking_checks()
    assert len(checks) == 7 and all(check.passed for check in checks)
    assert verify.state_tracking_checks in SECTIONS
    exact = [c for c in checks if not math.isnan(c.error)]
    assert all(c.error < 1e-12 for c in exact)
    st = verify.state_tracking
    # reads that forget instead of flipping (beta = 1 on a one: the eigenvalue 0, not -1)
    monkeypatch.setattr(st, "parity_by_reflection", lambda x, k: 1.0 - np.asarray(x, float))
    failed = [c.name for c in verify.state_tracking_checks() if not c.passed]
    assert failed == ["parity, 10,000 tokens: beta_t = 2 x_t reads (-1)^parity"]


def test_the_delta_product_checks_are_there_and_pass():
    checks = verify.delta_product_checks()
    assert [c.name for c in checks] == [
        "DeltaProduct n_h = 1 is the delta rule",
        "DeltaProduct n_h = 1 with a gate is Gated DeltaNet",
        "DeltaProduct n_h = 3: the delta rule in chunks of 5 rows",
        "DeltaProduct n_h = 3: the delta rule in chunks of 16 rows",
        "DeltaProduct n_h = 3, gated: the interleaved recurrence",
        "DeltaProduct n_h = 3: a token's A_t is 3 Householders",
    ]
    assert all(c.passed and c.error < 1e-13 for c in checks), [c.line() for c in checks]
    assert verify.delta_product_checks in SECTIONS


def test_the_delta_product_checks_fail_with_the_gate_at_every_write(monkeypatch):
    # The decay once a token, not once a write: a loop decaying at each write disagrees.
    def every_write(Q, K, V, beta, g=None, *, num_householder, scale=1.0, initial_state=None):
        g_rows = None if g is None else np.repeat(g, num_householder)
        Q_rows = np.repeat(Q, num_householder, axis=0)
        o, S = verify.gated.recurrence(Q_rows, K, V, beta, g_rows, rule="delta", scale=scale,
                                       initial_state=initial_state)  # fmt: skip
        return o[num_householder - 1 :: num_householder], S

    failed = _failing("delta_product_checks", monkeypatch, (verify.gated, "delta_product"),
                      every_write)  # fmt: skip
    assert failed == ["DeltaProduct n_h = 3, gated: the interleaved recurrence"]
