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
    claims,
    crossover_tokens,
    delta_rule,
    delta_state_numbers,
    dplr,
    elu_plus_one,
    figure5_example,
    figure6_example,
    gated,
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
    rwkv6,
    softmax_attention,
    softmax_d1_example,
    softmax_training_ops,
    state_tracking,
    transition_product,
    wy_transition,
)
from linattn.reference.costs import (
    delta_step_ops,
    delta_to_linear_chunk_ratio,
    layer_dense_ops,
    layer_linear_ops,
    layer_softmax_ops,
    linear_attention_ops,
    linear_step_ops,
    linear_training_ops,
    softmax_step_ops,
)
from linattn.reference.memory import kaczmarz_sweeps, least_squares_memory, unit

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


def random_feature_bias_checks() -> list[Check]:
    """Section 4: with r random features each kernel value is estimated without bias, but the
    output, a ratio of two such estimates, is biased at finite r; the bias shrinks as r grows."""
    _, Q, K, V = _section2_draws()
    q, keys, values = 0.5 * Q[0], 0.5 * K[:4], V[:4, :2]  # one query, four pairs
    biases, ses = [], []
    for r in (2, 32):
        kernels, outputs, exact = claims.random_feature_ratio(
            q, keys, values, r, 20_000, np.random.default_rng(15)
        )
        biases.append(float(np.abs(outputs.mean(axis=0) - exact).max()))
        ses.append(float((outputs.std(axis=0) / np.sqrt(len(outputs))).max()))
        if r == 2:
            kernel_se = kernels.std(axis=0) / np.sqrt(len(kernels))
            kernel_z = np.abs(kernels.mean(axis=0) - np.exp(keys @ q)) / kernel_se
    return [
        claim(
            "section 4: r = 2 features: each kernel value is unbiased",
            bool(np.all(kernel_z < 4)),
            detail="20,000 draws of r = 2 features, 4 keys: kernel means from exp(q.k) by "
            + ", ".join(f"{z:.1f}" for z in kernel_z)
            + " standard errors",
        ),
        claim(
            "section 4: the random-feature output is biased at finite r",
            biases[0] > 4 * ses[0] and biases[1] > 4 * ses[1] and biases[1] < biases[0],
            detail=f"largest bias of the output (a ratio): r = 2 {biases[0]:.3f} "
            f"({biases[0] / ses[0]:.0f} standard errors), r = 32 {biases[1]:.3f} "
            f"({biases[1] / ses[1]:.0f}): consistent, but biased",
        ),
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


def read_change_checks() -> list[Check]:
    """Section 7.3: a delta-rule write with key k_t changes the read of k_i by (k_i^T k_t) u_t^T;
    the least-squares memory minimises the total squared read error, exactly when n <= r."""
    rng = np.random.default_rng(16)
    S, K = rng.standard_normal((8, 3)), unit(rng.standard_normal((5, 8)))
    k, v, beta = unit(rng.standard_normal((1, 8)))[0], rng.standard_normal(3), 0.7
    change, u = claims.delta_read_change(S, K, k, v, beta)
    K40, V40 = unit(rng.standard_normal((40, 32))), rng.standard_normal((40, 4))
    best = claims.total_read_error(K40, V40, least_squares_memory(K40, V40))
    _, delta = delta_rule(K40, K40, V40, np.ones(40))
    others = [K40.T @ V40, delta] + [
        least_squares_memory(K40, V40) + 0.01 * rng.standard_normal((32, 4)) for _ in range(200)
    ]
    errors = [claims.total_read_error(K40, V40, M) for M in others]
    K24 = K40[:24]
    return [
        compare(
            "section 7.3: writing k_t changes read k_i by (k_i.k_t) u_t",
            change,
            np.outer(K @ k, u),
        ),
        claim(
            "section 7.3: least squares minimises total squared error",
            best <= min(errors),
            detail=f"40 pairs in R^32: total squared read error {best:.2f} least squares, "
            f"{errors[0]:.2f} additive, {errors[1]:.2f} delta rule, at least "
            f"{min(errors[2:]):.2f} for 200 perturbations of it",
        ),
        compare(
            "section 7.3: least squares is exact for n = 24 <= r = 32",
            K24 @ least_squares_memory(K24, V40[:24]),
            V40[:24],
            1e-10,
        ),
    ]


def _signless(x: float) -> float:
    """x rounded to 2 decimals, with -0.00 shown as +0.00 (an eigenvalue of -1e-17 is zero)."""
    return round(x, 2) + 0.0


def kaczmarz_checks() -> list[Check]:
    """Section 7.3: 24 pairs in R^32 swept 200 times are read back (Kaczmarz converges)."""
    rng4 = np.random.default_rng(4)
    K24, V24 = unit(rng4.standard_normal((24, 32))), unit(rng4.standard_normal((24, 32)))
    S = kaczmarz_sweeps(K24, V24, 200)
    return [compare("24 pairs swept 200 times: the reads converge", K24 @ S, V24, 1e-4)]


def mesa_checks() -> list[Check]:
    """Section 7.3 and MesaNet: MesaNet's memory after n pairs (no decay, beta = 1) is
    the least-squares memory of the pairs and lambda's prior pairs (sqrt(lambda) e_i, 0), that is
    (K^T K + lambda I)^{-1} K^T V; read by ``linattn.ops.mesa`` (conjugate gradients) with
    r queries e_i after the pairs, which return the memory's rows."""
    import torch

    from linattn.ops import mesa

    rng = np.random.default_rng(52)
    n, r, d, lamb = 24, 8, 3, 0.5
    K, V = unit(rng.standard_normal((n, r))), rng.standard_normal((n, d))
    q = np.vstack([np.zeros((n, r)), np.eye(r)])
    k = np.vstack([K, np.zeros((r, r))])
    v = np.vstack([V, np.zeros((r, d))])
    beta = np.concatenate([np.ones(n), np.zeros(r)])

    def t(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x))[None, :, None]

    o, *_ = mesa.mesa_net(
        t(q), t(k), t(v), None, t(beta), torch.full((1, r), lamb, dtype=torch.float64),
        max_cg_iterations=2 * r, cg_eps=0.0,
    )  # fmt: skip
    S = o[0, n:, 0].numpy()
    prior = np.sqrt(lamb) * np.eye(r)
    want = least_squares_memory(np.vstack([K, prior]), np.vstack([V, np.zeros((r, d))]))
    return [compare(f"MesaNet's memory is least squares with lambda = {lamb}", S, want)]


def deltaformer_checks() -> list[Check]:
    """Section 8 and DeltaFormer: with the bare kernel q.k in place of the softmax, the
    write stage's queries k (the paper's), values beta_t v_t and scale 1, DeltaFormer's
    pseudo-values are the delta rule's and its output is the delta rule's, o_t = S_t^T q_t."""
    import torch

    from linattn.ops import delta_rule, deltaformer

    rng = np.random.default_rng(8)
    T, D = 24, 4
    q, v = (torch.from_numpy(rng.standard_normal((1, T, 1, D))) for _ in range(2))
    k = torch.from_numpy(unit(rng.standard_normal((T, D)))).view(1, T, 1, D)
    beta = torch.from_numpy(rng.uniform(0, 1, (1, T, 1)))
    o = deltaformer.deltaformer(
        q, k, beta.unsqueeze(-1) * v, beta, kernel="linear", scale=1.0, u_queries=k
    )
    want, _ = delta_rule(q, k, v, beta, scale=1.0, mode="recurrent")
    return [compare("DeltaFormer with the linear kernel is the delta rule", o, want)]


def path_checks() -> list[Check]:
    """Section 2 and PaTH attention: with beta = 0 every transition is I and PaTH is
    softmax attention without positions; with beta = 2 and a unit w the transition
    H = I - 2 w w^T is a reflection, read back from PaTH's scores (key e_j at token 0, query e_i
    at token 1: the score is H_ij): orthogonal, determinant -1."""
    import torch

    from linattn.ops import path, softmax_attention

    rng = np.random.default_rng(11)
    T, D = 20, 4
    q, k, v = (torch.from_numpy(rng.standard_normal((1, T, 2, D))) for _ in range(3))
    w = torch.from_numpy(rng.standard_normal((1, T, 2, D)))
    o = path.path_attention(q, k, v, w, torch.zeros(1, T, 2, dtype=torch.float64))
    want = softmax_attention(q, k, v, fused=False)
    unit_w = unit(rng.standard_normal((1, D)))[0]
    eye = torch.eye(D, dtype=torch.float64)
    keys = eye.repeat(D, 1)  # row i * D + j: key e_j
    queries = eye.repeat_interleave(D, dim=0)  # query e_i
    qq = torch.stack([torch.zeros_like(queries), queries], 1)[:, :, None]
    kk = torch.stack([keys, torch.zeros_like(keys)], 1)[:, :, None]
    ww = torch.from_numpy(unit_w).expand(D * D, 2, 1, D)
    scores = path.path_scores(qq, kk, ww, torch.full((D * D, 2, 1), 2.0, dtype=torch.float64))
    H = scores[:, 0, 1, 0].reshape(D, D).numpy()
    return [
        compare("PaTH with beta = 0 is softmax attention", o, want),
        compare("PaTH with beta = 2: each transition is orthogonal", H.T @ H, np.eye(D)),
        compare("PaTH with beta = 2: each transition has determinant -1", np.linalg.det(H), -1.0),
    ]


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


def _dplr_draws() -> tuple[np.ndarray, ...]:
    """The generalized delta rule's inputs: Q, K (unit), V, b (unit), a = -beta b + noise, a gate
    per channel."""
    rng = np.random.default_rng(30)
    Q, K, b = (unit(rng.standard_normal((64, 8))) for _ in range(3))
    V = rng.standard_normal((64, 8))
    a = -rng.random((64, 1)) * b + 0.1 * rng.standard_normal((64, 8)) / np.sqrt(8)
    g = np.log(1 / (1 + np.exp(-rng.standard_normal((64, 8)) - 3.0)))  # decays near 0.95
    beta = 1 / (1 + np.exp(-rng.standard_normal(64)))
    return Q, K, V, a, b, g, beta


def dplr_checks() -> list[Check]:
    """The generalized delta rule, A_t = Diag(exp g_t) + a_t b_t^T. Its chunk form
    equals the recurrence; the WY form of C transitions is their product; with the delta rule's
    a, b it is the delta rule (and with the gate, Gated DeltaNet and KDA)."""
    Q, K, V, a, b, g, beta = _dplr_draws()
    recurrent, _ = dplr.recurrence(Q, K, V, a, b, g)
    checks = [
        compare(
            f"DPLR: chunks of C = {C} equal the recurrence",
            dplr.chunked(Q, K, V, a, b, g, C)[0],
            recurrent,
        )
        for C in (1, 5, 16, 64)
    ]
    checks.append(
        compare(
            "DPLR WY form: the product of 16 transitions",
            dplr.wy_transition(a[:16], b[:16], g[:16]),
            dplr.transition_product(a[:16], b[:16], g[:16]),
        )
    )
    return checks + _dplr_rows(Q, K, V, g, beta)


def _dplr_rows(Q, K, V, g, beta) -> list[Check]:
    """The table's rows: a = -beta k, b = exp(g) k, v' = beta v (b = k without a gate)."""
    rows = []
    for name, gate in (("the delta rule", None), ("Gated DeltaNet", g[:, 0]), ("KDA", g)):
        decay = 1.0 if gate is None else np.exp(gate if gate.ndim == 2 else gate[:, None])
        a, b, v = -beta[:, None] * K, decay * K, beta[:, None] * V
        want, _ = gated.recurrence(Q, K, V, beta, gate, rule="delta")
        rows.append(compare(f"DPLR with the delta rule's a, b is {name}",
                            dplr.recurrence(Q, K, v, a, b, gate)[0], want))  # fmt: skip
    return rows


def delta_product_checks() -> list[Check]:
    """Gated DeltaProduct, n_h delta-rule writes a token and one read. With n_h = 1 it
    is the delta rule (and Gated DeltaNet); with n_h = 3 its token loop equals the delta rule on
    the 3 T interleaved rows read at each token's last write (the chunk form, C = 5 and 16 rows;
    with a gate at each token's first write, the recurrence), and one token's transition is the
    product of its 3 Householder matrices."""
    rng = np.random.default_rng(31)
    n, T = 3, 32
    Q, K = unit(rng.standard_normal((T, 8))), unit(rng.standard_normal((n * T, 8)))
    V = rng.standard_normal((n * T, 8))
    beta = 2 / (1 + np.exp(-rng.standard_normal(n * T)))  # in (0, 2): eigenvalues below 0
    g = np.log(1 / (1 + np.exp(-rng.standard_normal(T) - 3.0)))  # decays near 0.95
    Q_rows = np.zeros((n * T, 8))
    Q_rows[n - 1 :: n] = Q  # the read at each token's last write
    g_rows = np.zeros(n * T)
    g_rows[::n] = g  # the decay at each token's first write
    checks = [
        compare("DeltaProduct n_h = 1 is the delta rule",
                gated.delta_product(Q, K[:T], V[:T], beta[:T] / 2, num_householder=1)[0],
                delta_rule(Q, K[:T], V[:T], beta[:T] / 2)[0]),
        compare("DeltaProduct n_h = 1 with a gate is Gated DeltaNet",
                gated.delta_product(Q, K[:T], V[:T], beta[:T], g, num_householder=1)[0],
                gated.recurrence(Q, K[:T], V[:T], beta[:T], g, rule="delta")[0]),
    ]  # fmt: skip
    loop = gated.delta_product(Q, K, V, beta, num_householder=n)[0]
    for C in (5, 16):
        rows = chunked_delta_rule(Q_rows, K, V, beta, C)[0][n - 1 :: n]
        checks.append(compare(f"DeltaProduct n_h = 3: the delta rule in chunks of {C} rows", rows,
                              loop))  # fmt: skip
    gated_rows = gated.recurrence(Q_rows, K, V, beta, g_rows, rule="delta")[0][n - 1 :: n]
    checks.append(
        compare(
            "DeltaProduct n_h = 3, gated: the interleaved recurrence",
            gated_rows,
            gated.delta_product(Q, K, V, beta, g, num_householder=n)[0],
        )
    )
    one_token = gated.delta_product(
        Q[:1], K[:n], np.zeros((n, 8)), beta[:n], num_householder=n, initial_state=np.eye(8)
    )[1]  # A_t I
    checks.append(compare("DeltaProduct n_h = 3: a token's A_t is 3 Householders",
                          one_token, transition_product(K[:n], beta[:n])))  # fmt: skip
    return checks


def rwkv6_checks() -> list[Check]:
    """RWKV-6, the additive rule read before the token's write plus a bonus u. Its chunk
    form (a strictly lower intra-chunk matrix, the bonus on the diagonal) equals the token loop;
    without decay and with u = 1 it reads S_t, and so is linear attention."""
    Q, K, V, _, _, g, _ = _dplr_draws()
    u = np.random.default_rng(31).standard_normal(8)
    recurrent, _ = rwkv6.recurrence(Q, K, V, g, u)
    checks = [
        compare(
            f"RWKV-6: chunks of C = {C} equal the recurrence",
            rwkv6.chunked(Q, K, V, g, u, C)[0],
            recurrent,
        )
        for C in (1, 5, 16, 64)
    ]
    checks.append(
        compare(
            "RWKV-6 with u = 1 and no decay is linear attention",
            rwkv6.recurrence(Q, K, V, None, np.ones(8))[0],
            gated.recurrence(Q, K, V)[0],
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


def hybrid_cache_checks() -> list[Check]:
    """Section 10: three linear layers to one full-attention layer (Kimi Linear) keep a KV cache
    75 percent smaller than full attention in every layer; with the linear layers' fixed states
    the memory approaches that as t grows ("up to")."""
    d, layers = 128, 48
    hybrid, full = "LLLA" * (layers // 4), "A" * layers
    ts = (1_024, 131_072, 1_048_576)
    saved = [
        1 - claims.hybrid_cache_numbers(hybrid, t, d) / claims.hybrid_cache_numbers(full, t, d)
        for t in ts
    ]
    states = hybrid.count("L") * delta_state_numbers(d, d)
    with_states = [
        1
        - (claims.hybrid_cache_numbers(hybrid, t, d) + states)
        / claims.hybrid_cache_numbers(full, t, d)
        for t in ts
    ]
    return [
        compare(
            "section 10: a 3:1 hybrid's KV cache is 75 percent smaller",
            saved,
            [0.75] * len(ts),
            detail=f"{layers} layers, d = {d}: with the linear layers' states the memory is "
            + ", ".join(f"{s:.1%}" for s in with_states)
            + " smaller at t = "
            + ", ".join(f"{t:,}" for t in ts),
        ),
        claim(
            "section 10: with the states counted, up to 75 percent",
            all(s < 0.75 for s in with_states)
            and with_states == sorted(with_states)
            and with_states[-1] > 0.74,
        ),
    ]


def variance_checks() -> list[Check]:
    """Section 2: q^T k has variance d, the factor 1/sqrt(d) gives unit variance; without it the
    rows sharpen as d grows, and a sharp row has a gradient close to zero."""
    rng = np.random.default_rng(12)
    checks = []
    for d in (16, 256):
        variance, se = claims.score_variance(rng, d, 50_000)
        checks.append(
            compare(
                f"section 2: q.k has variance d = {d}; / sqrt(d), variance 1",
                variance / d,
                1,
                4 * se / d,
                detail=f"d = {d}: variance of q.k {variance:.2f}, of q.k / sqrt(d) "
                f"{variance / d:.3f} (four standard errors {4 * se / d:.3f})",
            )
        )
    return checks + _sharpening_checks(rng)


def _sharpening_checks(rng: np.random.Generator) -> list[Check]:
    """Section 2: mean peak weights with and without 1/sqrt(d), and the Jacobian of sharp rows."""
    dims, plain, scaled = (4, 16, 64, 256, 1024), [], []
    for d in dims:
        Q, K = rng.standard_normal((64, d)), rng.standard_normal((64, d))
        plain.append(claims.softmax_rows(Q @ K.T))
        scaled.append(claims.softmax_rows(Q @ K.T / np.sqrt(d)))
    peaks = [mean_peak_weight(P) for P in plain]
    scaled_peaks = [mean_peak_weight(P) for P in scaled]
    sharp = [p for p in plain[-1] if p.max() >= 0.99]
    norms = [claims.softmax_jacobian_norm(p) for p in sharp]
    bounded = all(n <= 2 * (1 - p.max()) + 1e-15 for n, p in zip(norms, sharp, strict=True))
    return [
        claim(
            "section 2: without 1/sqrt(d) the rows sharpen as d grows",
            bool(np.all(np.diff(peaks) > 0)) and peaks[-1] > 0.9 and max(scaled_peaks) < 0.2,
            detail="mean largest weight, d = 4 to 1,024 (64 keys): without the factor "
            + ", ".join(f"{p:.2f}" for p in peaks)
            + "; with it "
            + ", ".join(f"{p:.2f}" for p in scaled_peaks),
        ),
        claim(
            "section 2: a row on one key has a gradient close to zero",
            len(sharp) > 0 and bounded,
            detail=f"d = 1,024 without the factor: {len(sharp)} of 64 rows put >= 0.99 on one "
            f"key; the softmax Jacobian's norm there is at most {max(norms, default=0):.1e} "
            "(bound 2 (1 - max_j P_ij))",
        ),
    ]


def softmax_shift_checks() -> list[Check]:
    """Section 2: the softmax is unchanged by a constant added to a whole row, so the code may
    subtract each row's largest score first; without that subtraction it overflows."""
    _, Q, K, _ = _section2_draws()
    G = Q @ K.T / np.sqrt(Q.shape[1])  # the scores, (64, 64)
    shifts = np.random.default_rng(13).uniform(-5, 5, (len(G), 1))  # one constant a row
    steep = G + 1000.0  # scores beyond exp's range (about 709)
    with np.errstate(over="ignore", invalid="ignore"):
        plain = claims.softmax_unshifted(steep)
    return [
        compare(
            "section 2: a constant added to a row leaves the softmax",
            claims.softmax_unshifted(G + shifts),
            claims.softmax_unshifted(G),
            1e-15,
        ),
        claim(
            "section 2: subtracting the largest score prevents overflow",
            not np.all(np.isfinite(plain))
            and np.abs(claims.softmax_rows(steep) - claims.softmax_rows(G)).max() < 1e-12,
            detail="scores + 1,000: exp overflows without the subtraction "
            f"({np.count_nonzero(~np.isfinite(plain)):,} of {plain.size:,} weights not finite); "
            "with it the softmax equals that of the scores",
        ),
    ]


def kernel_smoother_checks() -> list[Check]:
    """Section 3: softmax attention is the Nadaraya-Watson estimator with the kernel
    exp(q^T k / sqrt(d)), linear attention the same with phi(q)^T phi(k); the exponential kernel
    is the tensor-power series sum_m <q^(x)m, k^(x)m> / m!."""
    _, Q, K, V = _section2_draws()
    smoother = claims.nadaraya_watson(Q, K, V, claims.exponential_kernel)
    linear = claims.nadaraya_watson(
        Q, K, V, lambda q, k: float(elu_plus_one(q[None])[0] @ elu_plus_one(k[None])[0])
    )
    rng = np.random.default_rng(14)
    q, k = 0.5 * rng.standard_normal(4), 0.5 * rng.standard_normal(4)
    x = float(q @ k)
    powers = [claims.tensor_power(q, m) @ claims.tensor_power(k, m) for m in range(6)]
    terms = 10
    series = claims.exponential_series_features(q, terms) @ claims.exponential_series_features(
        k, terms
    )
    tail = abs(x) ** terms / math.factorial(terms) * math.exp(abs(x))  # Lagrange's remainder
    return [
        compare(
            "section 3: softmax is the Nadaraya-Watson estimator",
            smoother,
            softmax_attention(Q, K, V)[0],
        ),
        compare(
            "section 3: linear attention: same, kernel phi(q).phi(k)",
            linear,
            linear_attention(Q, K, V),
        ),
        compare(
            "section 3: (q.k)^m = <q^(x)m, k^(x)m>, m = 0 to 5",
            powers,
            [x**m for m in range(6)],
        ),
        compare(
            f"section 3: {terms} tensor-power blocks give exp(q.k)",
            series,
            math.exp(x),
            max(tail, 1e-15),
            detail=f"d = 4, q.k = {x:.3f}: the features x^(x)m / sqrt(m!), m < {terms}, "
            f"have {len(claims.exponential_series_features(q, terms)):,} coordinates; "
            f"the series' remainder is at most {tail:.1e}",
        ),
    ]


def cost_table_checks() -> list[Check]:
    """Section 4's table: 4 n^2 d against 4 n r d operations, n x n against r x d, counted
    product by product; linear attention needs fewer operations exactly when n > r."""
    _, Q, K, V = _section2_draws()
    n, d = Q.shape
    FQ, FK = elu_plus_one(Q), elu_plus_one(K)
    r = FK.shape[1]
    soft_ops, soft_shape = claims.softmax_order(Q, K, V)
    lin_ops, lin_shape = claims.linear_right_order(FQ, FK, V)
    sizes = range(1, 4097)
    pays = [linear_attention_ops(m, 128, 128) < softmax_training_ops(m, 128) for m in sizes]
    first = next((m for m, cheaper in zip(sizes, pays, strict=True) if cheaper), None)
    return [
        compare(
            "section 4: softmax attention costs 4 n^2 d, through n x n",
            [soft_ops, *soft_shape],
            [4 * n * n * d, n, n],
            0.5,
            detail=f"n = {n}, d = r = {d}: softmax {soft_ops:,} operations, largest "
            f"{soft_shape[0]} x {soft_shape[1]}; linear {lin_ops:,}, largest "
            f"{lin_shape[0]} x {lin_shape[1]}",
        ),
        compare(
            "section 4: linear attention costs 4 n r d, through r x d",
            [lin_ops, *lin_shape],
            [4 * n * r * d, r, d],
            0.5,
        ),
        claim(
            "section 4: linear attention is cheaper exactly when n > r",
            pays == [m > 128 for m in sizes],
            detail=f"r = d = 128, n = 1 to 4,096: fewer operations from n = {first}",
        ),
    ]


def reordering_checks() -> list[Check]:
    """Section 5.1: the masked product (A o L) V is not phi(Q) (phi(K)^T V); its row t is
    phi(q_t)^T S_t with the state S_t of the first t pairs."""
    _, Q, K, V = _section2_draws()
    FQ, FK = elu_plus_one(Q), elu_plus_one(K)
    masked = np.tril(FQ @ FK.T) @ V  # (A o L) V, (n, d)
    reordered = FQ @ (FK.T @ V)
    states = np.cumsum(FK[:, :, None] * V[:, None, :], axis=0)  # S_t, (n, r, d)
    rows = np.einsum("tr,trd->td", FQ, states)
    gap = np.abs(masked - reordered).max(axis=1) / np.abs(reordered).max()
    return [
        compare("section 5.1: row t of (A o L) V is phi(q_t)^T S_t", rows, masked, 1e-11),
        claim(
            "section 5.1: (A o L) V differs from phi(Q) (phi(K)^T V)",
            bool(np.all(gap[:-1] > 1e-3)) and gap[-1] < 1e-14,
            detail=f"relative difference row by row: from {gap[:-1].min():.2f} to "
            f"{gap[:-1].max():.2f} for t < n, {gap[-1]:.0e} at t = n (S_n holds every pair)",
        ),
    ]


def counted_cost_checks() -> list[Check]:
    """Sections 2, 5, 5.1 and 9: the operations counted product by product in a generation step
    (4 t d softmax, 4 r d linear, 6 r d delta rule) and in the chunked form (2 n C (r + d) +
    4 n r d) equal the cost model's formulas, and the counted computations give the outputs."""
    _, Q, K, V = _section2_draws()
    n, d = V.shape
    FQ, FK = elu_plus_one(Q), elu_plus_one(K)
    r, t = FK.shape[1], 40
    o_soft, soft_ops = claims.counted_softmax_step(Q[t - 1], K[:t], V[:t])
    S = FK[: t - 1].T @ V[: t - 1]  # the state before step t, (r, d)
    o_lin, _, lin_ops = claims.counted_linear_step(S, FQ[t - 1], FK[t - 1], V[t - 1])
    beta = 0.5
    o_delta, _, delta_ops = claims.counted_delta_step(S, Q[t - 1], K[t - 1], V[t - 1], beta)
    o_want, _ = delta_rule(Q[t - 1 : t], K[t - 1 : t], V[t - 1 : t], [beta], initial_state=S)
    chunked = {C: claims.counted_chunked_linear(FQ, FK, V, C) for C in (1, 8, 16, 64)}
    masked = np.tril(FQ @ FK.T) @ V
    return [
        compare(
            "section 9: a step costs 4td, 4rd, 6rd operations, counted",
            [soft_ops, lin_ops, delta_ops],
            [softmax_step_ops(t, d), linear_step_ops(r, d), delta_step_ops(r, d)],
            0.5,
            detail=f"t = {t}, d = r = {d}: counted {soft_ops:,}, {lin_ops:,}, {delta_ops:,} "
            "operations (softmax, linear attention, delta rule)",
        ),
        compare(
            "section 9: the counted steps compute the three reads",
            np.stack([o_soft, o_lin, o_delta]),
            np.stack(
                [
                    softmax_attention(Q[:t], K[:t], V[:t], causal=True)[0][-1],
                    masked[t - 1],
                    o_want[0],
                ]
            ),  # fmt: skip
        ),
        compare(
            "section 5.1: blocks of C cost 2nC(r + d) + 4nrd, counted",
            [chunked[C][1] for C in chunked],
            [linear_training_ops(n, r, d, C) for C in chunked],
            0.5,
            detail=f"n = {n}, r = d = {d}, C = "
            + ", ".join(str(C) for C in chunked)
            + ": counted "
            + ", ".join(f"{chunked[C][1]:,}" for C in chunked)
            + " operations",
        ),
        compare(
            "section 5.1: the counted blocks compute the masked product",
            np.stack([chunked[C][0] for C in chunked]),
            np.stack([masked] * len(chunked)),
        ),
    ]


def _figure4_draws() -> tuple[np.ndarray, np.ndarray]:
    """Figure 4's queries and keys, as ``attention_maps(np.random.default_rng(1))`` draws them."""
    rng = np.random.default_rng(1)
    return 1.5 * rng.standard_normal((16, 4)), 1.5 * rng.standard_normal((16, 4))


def eckart_young_checks() -> list[Check]:
    """Section 6.1: the best rank-r error in the spectral norm is sigma_{r+1} (Eckart-Young),
    and the causal mask can raise the rank of the linear attention matrix to n."""
    checks = []
    for name, M in (("d = 1 softmax", softmax_d1_example()), ("Figure 4", _p4())):
        sigma = np.linalg.svd(M, compute_uv=False)
        errors = [claims.rank_r_error(M, r) for r in range(1, len(M))]
        checks.append(
            compare(
                f"Eckart-Young, {name}: best rank-r error sigma_(r+1)",
                errors,
                sigma[1:],
                1e-12,
                detail=f"{name} singular values: " + " ".join(f"{s:.1e}" for s in sigma),
            )
        )
    return checks + [_no_better_rank_four(), _causal_rank()]


def _p4() -> np.ndarray:
    return attention_maps(np.random.default_rng(1))[0]


def _no_better_rank_four() -> Check:
    """No rank-4 matrix tried beats sigma_5: the linear matrix, 2,000 random projections of P."""
    P4, A4 = attention_maps(np.random.default_rng(1))
    sigma5 = np.linalg.svd(P4, compute_uv=False)[4]
    rng = np.random.default_rng(5)
    bases = [np.linalg.qr(rng.standard_normal((16, 4)))[0] for _ in range(2000)]  # (16, 4)
    best = min(np.linalg.norm(P4 - P4 @ B @ B.T, 2) for B in bases)
    linear = np.linalg.norm(P4 - A4, 2)
    return claim(
        "Eckart-Young: no rank-4 matrix tried beats sigma_5",
        bool(best >= sigma5 and linear >= sigma5),
        detail=f"Figure 4: sigma_5 = {sigma5:.3f}; the linear matrix misses P by {linear:.3f}, "
        f"the best of 2,000 random rank-4 projections by {best:.3f}",
    )


def _causal_rank() -> Check:
    Q4, K4 = _figure4_draws()
    _, A4 = attention_maps(np.random.default_rng(1))
    masked = matrix_rank(claims.causal_linear_matrix(Q4, K4))
    return claim(
        "section 6.1: the causal mask raises the linear rank to n",
        matrix_rank(A4) == 4 and masked == 16,
        detail=f"Figure 4's queries and keys, r = 4: unmasked rank {matrix_rank(A4)}, "
        f"masked rank {masked}",
    )


def sharpness_checks() -> list[Check]:
    """Section 6.2: A_ij / A_il <= max_m phi(k_j)_m / phi(k_l)_m for any query scale; the softmax
    matrix's rows become one-hot as the queries grow."""
    Q4, K4 = _figure4_draws()
    bound = claims.sharpness_bound(elu_plus_one(K4))
    worst, peaks, soft = [], [], []
    for scale in (1.0, 10.0, 100.0):
        _, A = linear_attention_quadratic(scale * Q4, K4, np.eye(16))
        worst.append(float((claims.weight_ratios(A) / bound[None]).max()))
        peaks.append(mean_peak_weight(A))
        soft.append(mean_peak_weight(softmax_attention(scale * Q4, K4, np.eye(16))[1]))
    return [
        claim(
            "section 6.2: no query beats the keys' bound on A_ij / A_il",
            max(worst) <= 1 + 1e-12,
            detail="Figure 4, queries scaled by 1, 10, 100: largest A_ij / A_il over its bound "
            + ", ".join(f"{w:.3f}" for w in worst)
            + "; mean largest weight, linear "
            + ", ".join(f"{p:.2f}" for p in peaks)
            + ", softmax "
            + ", ".join(f"{p:.2f}" for p in soft),
        ),
        claim(
            "section 6.2: scaled-up queries make softmax rows one-hot",
            soft[-1] > 0.99 and soft[-1] > max(peaks),
        ),
    ]


def positive_feature_checks() -> list[Check]:
    """Section 6.3: strictly positive features leave no two keys orthogonal, so two stored pairs
    already have crosstalk, even from keys that were orthogonal before the map."""
    _, _, K, _ = _section2_draws()
    W = np.random.default_rng(6).standard_normal((256, 8))
    smallest = []
    for keys in (np.eye(8), K):
        for phi in (elu_plus_one, lambda X: positive_random_features(X, W)):
            G = claims.feature_gram(phi(keys))
            smallest.append(float(G[~np.eye(len(G), dtype=bool)].min()))
    values = np.array([[3.0, 1.0], [-1.0, 2.0]])
    raw = claims.crosstalk(np.eye(2), values)
    mapped = claims.crosstalk(elu_plus_one(np.eye(2)), values)
    return [
        claim(
            "section 6.3: positive features: no two keys orthogonal",
            min(smallest) > 0,
            detail="smallest phi(k_i)^T phi(k_j), i != j (I_8 keys, section-2 keys; elu + 1, "
            "256 random features): " + ", ".join(f"{g:.2g}" for g in smallest),
        ),
        compare("section 6.3: orthogonal keys e_1, e_2: no crosstalk", raw, 0),
        claim(
            "section 6.3: the same keys through elu + 1: crosstalk",
            float(np.abs(mapped).max()) > 0.1,
            detail=f"keys e_1, e_2, values (3, 1), (-1, 2): crosstalk {np.abs(raw).max():.1f} "
            f"raw, {np.abs(mapped).max():.2f} through elu + 1",
        ),
    ]


def linear_loss_checks() -> list[Check]:
    """Section 7.1: the additive rule is a gradient step on -<S^T k, v>, whose gradient is
    -k v^T whatever S holds, so it corrects nothing."""
    S, _, k, v = _section71_draws()
    stored = np.outer(k, v)  # a memory that already returns v for k (|k| = 1)
    gradients = [claims.linear_loss_gradient(M, k, v) for M in (S, stored)]
    squared = np.outer(k, stored.T @ k - v)  # the delta rule's gradient at the same memory
    return [
        compare(
            "section 7.1: the linear loss has gradient -k v^T at any S",
            np.stack(gradients),
            np.stack([-np.outer(k, v)] * 2),
        ),
        compare(
            "section 7.1: a step on it at a stored v reads 2 v back",
            (stored - gradients[1]).T @ k,
            2 * v,
            detail="at S = k v^T the squared loss's gradient is "
            f"{np.abs(squared).max():.0e}; the linear loss's is still -k v^T",
        ),
    ]


def overwrite_checks() -> list[Check]:
    """Section 9, "a new value under an old key" (Figure 6's keys and values): the softmax cache
    keeps both, the additive rule adds them, the delta rule (beta = 1) keeps the new one."""
    keys, values = np.array([[1.0, 0], [0, 1], [1, 0]]), np.array([[3.0, 1], [-1, 2], [0, 4]])
    k, old, new = keys[0], values[0], values[2]
    _, S_delta = delta_rule(keys, keys, values, np.ones(3))
    return [
        compare(
            "section 9: softmax keeps both values of a key in its cache",
            claims.softmax_read(keys, values, 60 * k),
            (old + new) / 2,
        ),
        compare(
            "section 9: the additive rule adds old and new", (keys.T @ values).T @ k, old + new
        ),
        compare("section 9: the delta rule replaces the old value", S_delta.T @ k, new),
    ]


def stored_pair_checks() -> list[Check]:
    """Section 9, "reading one stored pair": softmax on a vertex of the keys' hull, never more than
    1/2 on an interior key; r orthogonal keys free of crosstalk, r + 1 keys not; the delta rule
    returns the newest pair; no r x d memory holds r + 1 arbitrary pairs exactly."""
    rng = np.random.default_rng(9)
    keys = unit(rng.standard_normal((8, 4)))  # unit keys: every one is a vertex of their hull
    keys = np.vstack([keys, (keys[0] + keys[1]) / 2])  # an interior key, index 8
    hull = claims.softmax_read(keys, np.eye(9), 40 * keys[3])[3]
    queries = rng.standard_normal((10_000, 4)) * rng.uniform(0, 30, (10_000, 1))
    interior = max(claims.softmax_read(keys, np.eye(9), q)[8] for q in queries)
    r = 4
    orthogonal = claims.crosstalk(np.eye(r), rng.standard_normal((r, 3)))
    extra = claims.crosstalk(rng.standard_normal((r + 1, r)), rng.standard_normal((r + 1, 3)))
    K, V = unit(rng.standard_normal((3 * r, r))), rng.standard_normal((3 * r, 3))
    _, S = delta_rule(K, K, V, np.ones(3 * r))
    residual = np.abs(K[: r + 1] @ least_squares_memory(K[: r + 1], V[: r + 1]) - V[: r + 1])
    return [
        claim(
            "section 9: softmax puts nearly all weight on a hull vertex",
            hull > 0.99 and interior <= 0.5,
            detail=f"query 40 k_j: weight {hull:.4f} on k_j; an interior key (k_1 + k_2) / 2 "
            f"gets at most {interior:.3f} from 10,000 queries",
        ),
        compare(f"section 9: r = {r} orthogonal keys read free of crosstalk", orthogonal, 0),
        claim(
            f"section 9: r + 1 = {r + 1} keys in R^{r} have crosstalk",
            float(np.abs(extra).max()) > 1e-3,
            detail=f"largest crosstalk of {r + 1} random keys in R^{r}: {np.abs(extra).max():.2f}; "
            f"least squares misses {r + 1} pairs by up to {residual.max():.2f}",
        ),
        compare("section 9: the delta rule returns the newest pair", K[-1] @ S, V[-1]),
        claim(
            f"section 9: no {r} x 3 memory holds {r + 1} arbitrary pairs",
            float(residual.max()) > 1e-3,
        ),
    ]


# Fixed-key states with transitions in [0, 1] (s_t = a[x_t] s_{t-1} + b[x_t]) tried against parity:
# additive (a = 1), decaying and reset-like (a < 1), either bit writing or not.
_DECAY_GRID = [
    ((a0, a1), (b0, b1))
    for a0 in (0.0, 0.5, 0.9, 1.0)
    for a1 in (0.0, 0.5, 0.9, 1.0)
    for b0 in (0.0, 1.0)
    for b1 in (-1.0, 1.0)
]


def _reflection_checks(k: np.ndarray) -> list[Check]:
    """I - beta k k^T has eigenvalues 1 (K - 1 times) and 1 - beta; at beta = 2 it is
    a reflection (orthogonal, determinant -1)."""
    checks = []
    for beta in (0.5, 2.0):
        A = np.eye(len(k)) - beta * np.outer(k, k)
        want = np.sort([1 - beta] + [1.0] * (len(k) - 1))
        name = f"beta = {beta}: eigenvalues 1 ({len(k) - 1} times) and 1 - beta"
        checks.append(compare(name, np.linalg.eigvalsh(A), want))
    H = np.eye(len(k)) - 2 * np.outer(k, k)
    checks.append(
        compare(
            "beta = 2: I - 2 k k^T is orthogonal, determinant -1",
            [np.abs(H.T @ H - np.eye(len(k))).max(), np.linalg.det(H)],
            [0.0, -1.0],
        )
    )
    return checks


def _parity_checks(rng: np.random.Generator, n: int) -> list[Check]:
    """beta_t = 2 x_t tracks parity exactly; no transition in [0, 1] separates it."""
    x = rng.integers(0, 2, n)
    parity = np.cumsum(x) % 2
    reads = state_tracking.parity_by_reflection(x, rng.standard_normal(4))
    accuracy = state_tracking.threshold_accuracy(reads, parity)
    ones = np.ones(n, dtype=int)
    best = max(
        state_tracking.threshold_accuracy(state_tracking.decaying_state(x, a, b), parity)
        for a, b in _DECAY_GRID
    )
    best_ones = max(
        state_tracking.threshold_accuracy(
            state_tracking.decaying_state(ones, a, b), np.arange(n) % 2
        )
        for a, b in _DECAY_GRID
    )
    bound = (n // 2 + 1) / n  # a monotone state crosses any threshold once
    return [
        compare(
            f"parity, {n:,} tokens: beta_t = 2 x_t reads (-1)^parity",
            reads,
            (-1.0) ** parity,
            detail=f"parity from the state's sign at every t <= {n:,}: accuracy {accuracy:.3f}",
        ),
        claim(
            "transitions in [0, 1]: no fixed-key state tracks parity",
            best < 0.6 and best_ones <= bound,
            detail=f"best threshold accuracy of {len(_DECAY_GRID)} additive / decaying states: "
            f"{best:.3f} on {n:,} random bits, {best_ones:.4f} on 1^n (monotone: <= {bound:.4f})",
        ),
    ]


def _permutation_check(rng: np.random.Generator, n: int, length: int) -> Check:
    """DeltaProduct with n_h = n - 1 transposition writes tracks a word of S_n."""
    perms = state_tracking.random_permutations(rng, length, n)
    reads = rng.integers(0, n, length)
    out, S = state_tracking.permutation_by_reflections(perms, reads)
    P = [state_tracking.permutation_matrix(c) for c in state_tracking.running_compositions(perms)]
    want = np.stack([P[t][reads[t]] for t in range(length)])  # row reads[t] of S_t
    return compare(
        f"S_{n}, {length:,} tokens: n_h = {n - 1} reflections, S_t = P(g_t..g_1)",
        np.concatenate([out.ravel(), S.ravel()]),
        np.concatenate([want.ravel(), P[-1].ravel()]),
        detail=f"S_{n}: DeltaProduct, {n - 1} hand-set writes per token; the state is the "
        "permutation matrix of the running composition",
    )


def state_tracking_checks() -> list[Check]:
    """What a fixed memory computes, by construction (Grazzi et al. 2025; Siems et al.
    2025): reflections track parity and permutations; transitions in [0, 1] cannot."""
    rng = np.random.default_rng(32)
    _, _, k, _ = _section71_draws()
    return [
        *_reflection_checks(k),
        *_parity_checks(rng, 10_000),
        _permutation_check(rng, 3, 1_000),
        _permutation_check(rng, 5, 1_000),
    ]


def _log_linear_draws(T: int = 100, H: int = 2, K: int = 8, V: int = 8):
    """q, k, v [1, T, H, K/V], g [1, T, H] (alpha in about 0.6 to 0.99), float64 tensors."""
    import torch

    rng = np.random.default_rng(52)
    q, k = (torch.from_numpy(rng.standard_normal((1, T, H, K))) for _ in range(2))
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.from_numpy(rng.standard_normal((1, T, H, V)))
    g = torch.nn.functional.logsigmoid(torch.from_numpy(rng.standard_normal((1, T, H)) + 2.0))
    return rng, q, k, v, g


def log_linear_checks() -> list[Check]:
    """Log-linear attention (Guo, Yang et al. 2025), on ``linattn.ops``: with every
    level weighted 1 the hierarchy is one level, and log-linear Mamba-2 is Mamba-2 (the scalar
    decay's ``linear_attention``); with every level weighted on its own, each form is the
    masked hierarchical product O = (Q K^T (.) M^S (.) M^H) V of the float64 reference. The same
    two over Gated DeltaNet's memory (``beta``): one level is ``delta_rule`` with the gate, and
    every level the masked product of Gated DeltaNet's pseudo-values U (section 3.4)."""
    import torch

    from linattn.ops import delta_rule, linear_attention
    from linattn.ops import log_linear as log_linear_ops
    from linattn.reference import log_linear as log_linear_reference

    rng, q, k, v, g = _log_linear_draws()
    T, H = q.shape[1], q.shape[2]
    levels = (T - 1).bit_length() + 1  # every level a token of T reads: 0 .. bit_length(T - 1)
    base, _ = linear_attention(q, k, v, g, scale=0.5, mode="recurrent")
    ones = torch.ones(1, T, H, levels, dtype=torch.float64)
    lam = torch.from_numpy(rng.uniform(0.0, 1.0, (1, T, H, levels)))
    product = np.stack(
        [
            log_linear_reference.masked_product(
                q[0, :, h].numpy(), k[0, :, h].numpy(), v[0, :, h].numpy(), g[0, :, h].numpy(),
                lam[0, :, h].numpy(), scale=0.5,
            )
            for h in range(H)
        ], axis=1,
    )  # fmt: skip
    checks = []
    for mode in ("parallel", "recurrent", "chunk"):
        run = log_linear_ops.log_linear_attention
        one, _ = run(q, k, v, g, ones, scale=0.5, mode=mode, chunk_size=16)
        checks.append(compare(f"log-linear Mamba-2, one level = Mamba-2 ({mode})",
                              one[0].numpy(), base[0].numpy()))  # fmt: skip
    for mode in ("parallel", "recurrent", "chunk"):
        run = log_linear_ops.log_linear_attention
        every, _ = run(q, k, v, g, lam, scale=0.5, mode=mode, chunk_size=16)
        checks.append(compare(f"log-linear, every level = masked product ({mode})",
                              every[0].numpy(), product))  # fmt: skip
    beta = torch.from_numpy(rng.uniform(0.0, 2.0, (1, T, H)))
    gdn, _ = delta_rule(q, k, v, beta, g, scale=0.5, mode="recurrent")
    product = np.stack(
        [
            log_linear_reference.masked_product(
                q[0, :, h].numpy(), k[0, :, h].numpy(), v[0, :, h].numpy(), g[0, :, h].numpy(),
                lam[0, :, h].numpy(), scale=0.5, beta=beta[0, :, h].numpy(),
            )
            for h in range(H)
        ], axis=1,
    )  # fmt: skip
    for mode in ("parallel", "recurrent", "chunk"):
        run = log_linear_ops.log_linear_attention
        one, _ = run(q, k, v, g, ones, scale=0.5, mode=mode, chunk_size=16, beta=beta)
        checks.append(compare(f"log-linear GDN, one level = Gated DeltaNet ({mode})",
                              one[0].numpy(), gdn[0].numpy()))  # fmt: skip
    for mode in ("parallel", "recurrent", "chunk"):
        run = log_linear_ops.log_linear_attention
        every, _ = run(q, k, v, g, lam, scale=0.5, mode=mode, chunk_size=16, beta=beta)
        checks.append(compare(f"log-linear GDN, every level = masked product ({mode})",
                              every[0].numpy(), product))  # fmt: skip
    return checks


def forgetting_checks() -> list[Check]:
    """The Forgetting Transformer (Lin et al. 2025) is softmax attention with the log forget
    gates between query and key added to its logits, so zero log gates give softmax attention
    (section 2): in float64, both of linattn's forms against ``linattn.ops.softmax_attention``,
    and against the query-by-query loop of ``linattn.reference.forgetting`` with gates."""
    import torch

    from linattn.ops import softmax_attention as softmax_op
    from linattn.ops.softmax_variants import forgetting_attention as fox_op
    from linattn.reference.forgetting import forgetting_attention as fox_loop

    _, Q, K, V = _section2_draws()
    log_f = np.log(1.0 / (1.0 + np.exp(-np.random.default_rng(33).normal(2.0, 1.0, 64))))
    q, k, v = (torch.from_numpy(x)[None, :, None] for x in (Q, K, V))  # [1, 64, 1, 8]
    softmax = softmax_op(q, k, v, fused=False)[0, :, 0].numpy()
    zeros = torch.zeros(1, 64, 1, dtype=torch.float64)
    gates = torch.from_numpy(log_f)[None, :, None]
    forms = (("parallel", 64), ("chunk", 16))
    checks = [compare("FoX with log f = 0 (loop) is softmax attention", fox_loop(Q, K, V), softmax)]
    for mode, C in forms:
        o = fox_op(q, k, v, zeros, mode=mode, chunk_size=C)[0, :, 0].numpy()
        checks.append(compare(f"FoX with log f = 0 ({mode} form) is softmax attention", o, softmax))
    with_gates = fox_loop(Q, K, V, log_f)
    for mode, C in forms:
        o = fox_op(q, k, v, gates, mode=mode, chunk_size=C)[0, :, 0].numpy()
        checks.append(compare(f"FoX: the {mode} form equals the loop", o, with_gates))
    return checks


# The checks in the order the spec prints them.
SECTIONS: tuple[Callable[[], list[Check]], ...] = (
    softmax_checks,
    variance_checks,
    softmax_shift_checks,
    kernel_smoother_checks,
    linear_order_checks,
    random_feature_checks,
    random_feature_bias_checks,
    cost_table_checks,
    recurrence_checks,
    reordering_checks,
    counted_cost_checks,
    rank_checks,
    eckart_young_checks,
    sharpness_checks,
    positive_feature_checks,
    figure5_checks,
    figure6_checks,
    regression_checks,
    linear_loss_checks,
    spectrum_checks,
    read_change_checks,
    kaczmarz_checks,
    mesa_checks,  # MesaNet, DeltaFormer, PaTH
    deltaformer_checks,
    path_checks,
    chunked_delta_checks,
    dplr_checks,
    delta_product_checks,
    rwkv6_checks,
    cost_checks,
    overwrite_checks,
    stored_pair_checks,
    hybrid_cache_checks,
    state_tracking_checks,  # not the spec's: the state-tracking papers' claims
    log_linear_checks,  # not the spec's: log-linear attention's identities
    forgetting_checks,  # not the spec's: the Forgetting Transformer
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
