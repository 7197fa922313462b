"""`linattn verify`: every check of the spec passes, named as the spec names it, with its error."""

import argparse
import json
import math

import pytest

from linattn.experiments import verify
from linattn.experiments.verify import SECTIONS, Check, compare, report, run_checks, to_json

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
    else:
        assert f"{error:.1e}" == f"{printed:.1e}"  # not rounding: the same seeds, the same number


def test_the_informational_lines(checks):
    details = "\n".join(check.detail for check in checks.values())
    assert "relative standard error of the estimate: 0.0063" in details
    assert "d = 1, n = 6: determinant 5.09e-13, condition number 1.28e+05" in details
    assert " softmax: rank 16, mean of the largest weight in a row 0.39" in details
    assert "  linear: rank  4, mean of the largest weight in a row 0.10" in details
    for line in (
        "beta = 0.0: eigenvalues from +1.00 to +1.00, spectral norm 1.00",
        "beta = 0.5: eigenvalues from +0.50 to +1.00, spectral norm 1.00",
        "beta = 1.0: eigenvalues from +0.00 to +1.00, spectral norm 1.00",
        "beta = 2.0: eigenvalues from -1.00 to +1.00, spectral norm 1.00",
    ):
        assert line in details
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
