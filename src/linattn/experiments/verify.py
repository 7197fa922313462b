"""Recompute every numerical check that the spec prints, with the spec's seeds.

One line per check: its name (as the spec names it), the largest error, the tolerance and the
verdict; the spec's informational lines (the determinant, the ranks, the eigenvalues, ...) are
printed above the check they belong to. Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from linattn.reference import (
    attention_maps,
    attention_matrix_bytes,
    break_even_tokens,
    causal_linear_attention,
    chunked_delta_rule,
    chunked_linear_attention,
    crossover_tokens,
    delta_rule,
    delta_state_numbers,
    figure5_example,
    figure6_example,
    householder_spectrum,
    kv_cache_numbers,
    linear_attention,
    linear_attention_quadratic,
    linear_fraction,
    linear_state_numbers,
    matrix_rank,
    mean_peak_weight,
    positive_random_features,
    prf_relative_standard_error,
    softmax_attention,
    softmax_d1_example,
    transition_product,
    wy_transition,
)
from linattn.reference.costs import (
    delta_to_linear_chunk_ratio,
    layer_dense_ops,
    layer_linear_ops,
    layer_softmax_ops,
)
from linattn.reference.memory import kaczmarz_sweeps, unit

NAME_WIDTH = 58  # the spec's `check` pads names to 58 characters


@dataclass(frozen=True)
class Check:
    """One check of the spec: ``error`` is the largest absolute difference (NaN for a claim that
    is not a difference, such as a rank), ``detail`` the spec's informational line, if any."""

    name: str
    error: float
    tolerance: float
    passed: bool
    detail: str = ""

    def line(self) -> str:
        """The printed line: name, largest error, tolerance, verdict."""
        verdict = "PASS" if self.passed else "FAIL"
        if math.isnan(self.error):
            measured = f"{'claim':<27}"
        else:
            measured = f"largest error {self.error:.1e}  "
            measured += f"tolerance {self.tolerance:.1e}  " if self.tolerance else ""
        return f"{self.name:<{NAME_WIDTH}} {measured}{verdict}".rstrip()


def compare(
    name: str, got: object, want: object, tolerance: float = 1e-12, detail: str = ""
) -> Check:
    """The spec's ``check``: the largest |got - want|, passed when below ``tolerance``."""
    error = float(np.abs(np.asarray(got, dtype=float) - np.asarray(want, dtype=float)).max())
    return Check(name, error, tolerance, bool(error < tolerance), detail)


def claim(name: str, holds: bool, detail: str = "") -> Check:
    """A check that is a statement, not a difference (a rank, a sign, an inequality)."""
    return Check(name, math.nan, math.nan, bool(holds), detail)


def _section2_draws() -> tuple[np.random.Generator, np.ndarray, np.ndarray, np.ndarray]:
    """The generator of sections 2-5 and its first draws: Q, K, V, each (64, 8)."""
    rng = np.random.default_rng(20261019)
    Q, K, V = (rng.standard_normal((64, 8)) for _ in range(3))
    return rng, Q, K, V


def softmax_checks() -> list[Check]:
    """Section 2: the causal softmax matrix is row-stochastic and lower triangular."""
    _, Q, K, V = _section2_draws()
    _, P = softmax_attention(Q, K, V, causal=True)
    return [
        compare("causal softmax: each row sums to one", P.sum(axis=1), 1),
        compare("causal softmax: no weight above the diagonal", np.triu(P, 1), 0),
    ]


def linear_order_checks() -> list[Check]:
    """Section 4: the left and the right order give the same output."""
    _, Q, K, V = _section2_draws()
    left, _ = linear_attention_quadratic(Q, K, V)
    right = linear_attention(Q, K, V)
    return [compare("(phi(Q) phi(K)^T) V equals phi(Q) (phi(K)^T V)", left, right)]


def random_feature_checks() -> list[Check]:
    """Section 4: positive random features estimate exp(q^T k) within four standard errors."""
    rng, *_ = _section2_draws()  # q, k and W come after Q, K, V from the same generator
    q, k = 0.5 * rng.standard_normal(8), 0.5 * rng.standard_normal(8)
    W = rng.standard_normal((1_000_000, 8))
    estimate = positive_random_features(q[None], W) @ positive_random_features(k[None], W).T
    se = prf_relative_standard_error(q, k, len(W))
    return [
        compare(
            "positive random features: estimate / exp(q.k)",
            estimate / np.exp(q @ k),
            1,
            4 * se,
            detail=f"relative standard error of the estimate: {se:.4f}",
        )
    ]


def recurrence_checks() -> list[Check]:
    """Sections 5 and 5.1: the recurrence and chunks of any size equal the masked product."""
    _, Q, K, V = _section2_draws()
    masked, _ = linear_attention_quadratic(Q, K, V, causal=True)
    checks = [
        compare(
            "the recurrence equals the masked product", causal_linear_attention(Q, K, V), masked
        )
    ]
    for C in (1, 7, 16, 64):
        checks.append(
            compare(
                f"chunks of C = {C} equal the masked product",
                chunked_linear_attention(Q, K, V, C),
                masked,
            )
        )
    return checks


def rank_checks() -> list[Check]:
    """Section 6.1: the d = 1 softmax matrix is nonsingular; Figure 4's ranks and peak weights."""
    P1 = softmax_d1_example()
    determinant, condition = np.linalg.det(P1), np.linalg.cond(P1)
    checks = [
        claim(
            "d = 1, n = 6: the softmax matrix is nonsingular (det > 0)",
            determinant > 0,
            detail=f"d = 1, n = 6: determinant {determinant:.2e}, condition number {condition:.2e}",
        )
    ]
    P4, A4 = attention_maps(np.random.default_rng(1))  # n = 16, d = r = 4
    for name, M, holds, statement in (
        ("softmax", P4, lambda rank: rank == 16, "full rank, 16"),
        ("linear", A4, lambda rank: rank <= 4, "rank at most r = 4"),
    ):
        rank, peak = matrix_rank(M), mean_peak_weight(M)
        checks.append(
            claim(
                f"Figure 4: the {name} matrix has {statement}",
                holds(rank),
                detail=f"{name:>8}: rank {rank:2d}, mean of the largest weight in a row {peak:.2f}",
            )
        )
    return checks


def figure5_checks() -> list[Check]:
    """Section 6.3, Figure 5: orthogonal keys read exactly; a third key adds crosstalk."""
    f = figure5_example()
    return [
        compare(
            "Figure 5: S_2 and S_3",
            np.concatenate([f["S2"], f["S3"]]),
            [[3, 1], [-1, 2], [5, 1], [1, 2]],
        ),
        compare(
            "Figure 5: two orthogonal keys read exactly", f["keys"][:2] @ f["S2"], f["values"][:2]
        ),
        compare(
            "Figure 5: the crosstalk after the third write",
            f["crosstalk"],
            [[2, 0], [2, 0], [1, 1.5]],
        ),
    ]


def figure6_checks() -> list[Check]:
    """Section 7, Figure 6: the delta rule replaces the value under a repeated key."""
    f = figure6_example()
    return [
        compare("Figure 6: additive S_3", f["additive_S3"], [[3, 5], [-1, 2]]),
        compare("Figure 6: delta-rule S_3", f["delta_S3"], [[0, 4], [-1, 2]]),
        compare("Figure 6: the pseudo-value u_3", f["u3"], [-3, 3]),
    ]


def _section71_draws() -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """The state S (8, 8), beta = 0.7, a unit key k and a value v of sections 7.1 and 7.2."""
    rng2 = np.random.default_rng(7)
    S, beta = rng2.standard_normal((8, 8)), 0.7
    k, v = rng2.standard_normal(8), rng2.standard_normal(8)
    return S, beta, k / np.linalg.norm(k), v


def regression_checks() -> list[Check]:
    """Section 7.1: one delta-rule write is one gradient step on |S^T k - v|^2 / 2."""
    S, beta, k, v = _section71_draws()
    _, read_correct_write = delta_rule(k[None], k[None], v[None], [beta], initial_state=S)
    householder = (np.eye(8) - beta * np.outer(k, k)) @ S + beta * np.outer(k, v)
    gradient = np.outer(k, S.T @ k - v)  # the gradient of |S^T k - v|^2 / 2 at S

    def loss(M: np.ndarray) -> float:
        return 0.5 * float(np.sum((M.T @ k - v) ** 2))

    E = np.zeros_like(S)
    E[2, 3] = 1e-6
    central = (loss(S + E) - loss(S - E)) / 2e-6
    return [
        compare("read-correct-write equals the Householder form", read_correct_write, householder),
        compare(
            "the gradient formula, against a central difference", central, gradient[2, 3], 1e-8
        ),
        compare(
            "the delta rule is one gradient step of size beta",
            read_correct_write,
            S - beta * gradient,
        ),
        compare(
            "the read-back mixes the old read and the new value",
            read_correct_write.T @ k,
            (1 - beta) * (S.T @ k) + beta * v,
        ),
    ]


def spectrum_checks() -> list[Check]:
    """Section 7.2: I - beta k k^T has eigenvalues 1 - beta and 1, and spectral norm 1."""
    _, _, k, _ = _section71_draws()
    checks = []
    for beta in (0.0, 0.5, 1.0, 2.0):
        low, high, norm = householder_spectrum(k, beta)
        checks.append(
            compare(
                f"beta = {beta}: eigenvalues 1 - beta and 1, spectral norm 1",
                [low, high, norm],
                [1 - beta, 1, 1],
                detail=f"beta = {beta}: eigenvalues from {_signless(low):+.2f} to "
                f"{_signless(high):+.2f}, spectral norm {norm:.2f}",
            )
        )
    return checks


def _signless(x: float) -> float:
    """x rounded to 2 decimals, with -0.00 shown as +0.00 (an eigenvalue of -1e-17 is zero)."""
    return round(x, 2) + 0.0


def kaczmarz_checks() -> list[Check]:
    """Section 7.3: 24 pairs in R^32 swept 200 times are read back (Kaczmarz converges)."""
    rng4 = np.random.default_rng(4)
    K24, V24 = unit(rng4.standard_normal((24, 32))), unit(rng4.standard_normal((24, 32)))
    S = kaczmarz_sweeps(K24, V24, 200)
    return [compare("24 pairs swept 200 times: the reads converge", K24 @ S, V24, 1e-4)]


def chunked_delta_checks() -> list[Check]:
    """Section 8: chunks of any size equal the recurrence; the WY form of 6 transitions."""
    rng3 = np.random.default_rng(3)
    Qd, Kd = unit(rng3.standard_normal((64, 8))), unit(rng3.standard_normal((64, 8)))
    Vd = rng3.standard_normal((64, 8))
    beta = 1 / (1 + np.exp(-rng3.standard_normal(64)))  # write strengths through a sigmoid
    recurrent, _ = delta_rule(Qd, Kd, Vd, beta)
    checks = [
        compare(
            f"delta rule: chunks of C = {C} equal the recurrence",
            chunked_delta_rule(Qd, Kd, Vd, beta, C)[0],
            recurrent,
        )
        for C in (1, 5, 16, 64)
    ]
    checks.append(
        compare(
            "WY form: the product of 6 transitions is I - K^T T K",
            transition_product(Kd[:6], beta[:6]),
            wy_transition(Kd[:6], beta[:6]),
        )
    )
    return checks


def cost_checks() -> list[Check]:
    """Sections 5, 8 and 9: the memory numbers of Figure 3 and the claims of the cost model."""
    d = r = 128
    t, n_p, d_model = 131_072, 32_768, 4_096
    cache, state = kv_cache_numbers(t, d), linear_state_numbers(r, d)
    even = break_even_tokens(r, d)
    gib = attention_matrix_bytes(n_p) / 2**30
    ratios = [delta_to_linear_chunk_ratio(C, r, d) for C in range(1, 4097)]
    crossover = crossover_tokens(d_model)
    return [
        claim(
            f"Figure 3: the state equals the cache after {even} tokens",
            kv_cache_numbers(even, d) <= state < kv_cache_numbers(even + 1, d),
            detail=f"cache {cache:,} numbers, state {state:,}, ratio {cache / state:.0f} "
            f"(delta rule {cache / delta_state_numbers(r, d):.0f}); "
            f"P at n = {n_p:,}: {gib:g} GiB",
        ),
        claim(
            "section 8: a delta chunk costs 1.5 to 1.75 additive ones",
            1.5 <= min(ratios) and max(ratios) <= 1.75,
            detail=f"r = d = {d}, C = 1 to 4,096: delta / additive chunk cost "
            f"from {min(ratios):.3f} to {max(ratios):.3f}",
        ),
        claim(
            f"section 9: attention costs more beyond n = {crossover:,}",
            layer_softmax_ops(crossover, d_model) == layer_dense_ops(crossover, d_model)
            and layer_softmax_ops(crossover + 1, d_model) > layer_dense_ops(crossover + 1, d_model),
            detail=f"d_model = {d_model:,}: 4 n^2 d_model > 24 n d_model^2 beyond "
            f"{crossover:,} tokens",
        ),
        compare(
            "section 9: linear attention is r / (6 d_model) of the rest",
            layer_linear_ops(n_p, r, d_model) / layer_dense_ops(n_p, d_model),
            linear_fraction(r, d_model),
            detail=f"r = {r}, d_model = {d_model:,}: fraction {linear_fraction(r, d_model):.2%}",
        ),
    ]


# The checks in the order the spec prints them.
SECTIONS: tuple[Callable[[], list[Check]], ...] = (
    softmax_checks,
    linear_order_checks,
    random_feature_checks,
    recurrence_checks,
    rank_checks,
    figure5_checks,
    figure6_checks,
    regression_checks,
    spectrum_checks,
    kaczmarz_checks,
    chunked_delta_checks,
    cost_checks,
)


def run_checks() -> list[Check]:
    """Every check of the spec, in the spec's order."""
    return [check for section in SECTIONS for check in section()]


def report(checks: list[Check]) -> str:
    """The printed report: informational lines, one line per check, and a summary."""
    lines = []
    for check in checks:
        if check.detail:
            lines.append(check.detail)
        lines.append(check.line())
    failed = [check.name for check in checks if not check.passed]
    if failed:
        lines.append(f"FAILED: {len(failed)} of {len(checks)} checks: " + "; ".join(failed))
    else:
        lines.append(f"all {len(checks)} checks passed")
    return "\n".join(lines)


def to_json(checks: list[Check]) -> str:
    """The same as JSON: {"passed": bool, "checks": [{name, error, tolerance, passed, detail}]}."""

    def clean(check: Check) -> dict[str, object]:
        row = asdict(check)
        for key in ("error", "tolerance"):
            row[key] = None if math.isnan(row[key]) else row[key]
        return row

    payload = {"passed": all(c.passed for c in checks), "checks": [clean(c) for c in checks]}
    return json.dumps(payload, indent=2)


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn verify``."""
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")


def run(args: argparse.Namespace) -> int:
    """Run every check, print them; exit status 1 if any fails."""
    checks = run_checks()
    print(to_json(checks) if args.json else report(checks))
    failed = [check for check in checks if not check.passed]
    if failed and args.json:
        print(f"linattn verify: {len(failed)} checks failed", file=sys.stderr)
    return 1 if failed else 0
