"""The spec's claims that are not definitions: statements it proves or states, as computations.

Each function computes the quantity a claim is about, so that ``linattn verify`` can check it
against the spec's statement: the variance of the scores and the softmax without its shift
(section 2), the Nadaraya-Watson form and the tensor-power series of the exponential kernel (3),
the operation counts of the two orders and the random-feature ratio at finite r (4), the
operations of a generation step and of the chunked form, counted product by product (5, 5.1, 9),
the rank-r approximation error (Eckart-Young, 6.1), the sharpness bound (6.2), the Gram matrix of
positive features (6.3), the gradient of the linear loss (7.1), the read change of one delta-rule
write and the total squared read error (7.3), the reads of section 9's qualitative rows and the KV
cache of a hybrid stack (10).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_vector, same_columns
from linattn.reference.costs import kv_cache_numbers
from linattn.reference.delta import delta_rule
from linattn.reference.features import elu_plus_one


def score_variance(rng: np.random.Generator, d: int, samples: int) -> tuple[float, float]:
    """Section 2: the sample variance of q^T k and its standard error, for entries of q and k
    independent N(0, 1).

        Var(q^T k) = sum_m Var(q_m k_m) = d,   Var((q^T k)^2) = 2 d^2 + 6 d,

    so the standard error of the sample variance (the mean of (q^T k)^2, the mean being 0) is
    sqrt((2 d^2 + 6 d) / samples). Returns (variance, standard error).
    """
    _generator(rng)
    d, samples = as_positive_int("d", d), as_positive_int("samples", samples)
    scores = (rng.standard_normal((samples, d)) * rng.standard_normal((samples, d))).sum(axis=1)
    return float(np.mean(scores**2)), float(np.sqrt((2 * d * d + 6 * d) / samples))


def softmax_rows(G: np.ndarray) -> np.ndarray:
    """Section 2: the row-wise softmax P_ij = exp(G_ij) / sum_l exp(G_il) of scores G (n, m)."""
    G = as_matrix("G", G)
    P = np.exp(G - G.max(axis=1, keepdims=True))
    return P / P.sum(axis=1, keepdims=True)


def softmax_jacobian_norm(p: np.ndarray) -> float:
    """Section 2: the spectral norm of the softmax's Jacobian diag(p) - p p^T at a row p.

    At most 2 (1 - max_j p_j) (Gershgorin: row j sums to 2 p_j (1 - p_j)), so a row that puts
    almost all its weight on one key has a gradient close to zero.
    """
    p = as_vector("p", p)
    return float(np.linalg.norm(np.diag(p) - np.outer(p, p), 2))


def product_ops(A: np.ndarray, B: np.ndarray) -> int:
    """Section 1: a product of an a x b and a b x c matrix costs 2 a b c operations."""
    A, B = as_matrix("A", A), as_matrix("B", B)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"A and B do not multiply: A is {A.shape}, B is {B.shape}")
    return 2 * A.shape[0] * A.shape[1] * B.shape[1]


def softmax_order(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """Section 4's table, softmax column: the products G = Q K^T / sqrt(d) and O = P V.

    Returns (operations counted product by product, the shape of the largest intermediate).
    4 n^2 d and (n, n) for Q, K, V of shape (n, d).
    """
    Q, K, V = as_matrix("Q", Q), as_matrix("K", K), as_matrix("V", V)
    G = Q @ K.T / np.sqrt(Q.shape[1])  # (n, n)
    P = softmax_rows(G)
    return product_ops(Q, K.T) + product_ops(P, V), G.shape


def linear_right_order(
    FQ: np.ndarray, FK: np.ndarray, V: np.ndarray
) -> tuple[int, tuple[int, ...]]:
    """Section 4's table, linear column: M = phi(K)^T V first, then phi(Q) M.

    Returns (operations counted product by product, the shape of the largest intermediate).
    4 n r d and (r, d) for features FQ, FK of shape (n, r) and V of shape (n, d).
    """
    FQ, FK, V = as_matrix("FQ", FQ), as_matrix("FK", FK), as_matrix("V", V)
    M = FK.T @ V  # (r, d)
    return product_ops(FK.T, V) + product_ops(FQ, M), M.shape


def rank_r_error(M: np.ndarray, r: int) -> float:
    """Section 6.1: the spectral-norm error of the truncated SVD of rank r, ||M - M_r||_2.

    By the Eckart-Young theorem it is sigma_{r+1}, the smallest error of any matrix of rank r.
    """
    M, r = as_matrix("M", M), as_positive_int("r", r)
    U, s, Vt = np.linalg.svd(M)
    M_r = (U[:, :r] * s[:r]) @ Vt[:r]
    return float(np.linalg.norm(M - M_r, 2))


def causal_linear_matrix(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Section 6.1: the masked linear attention matrix D^{-1} (phi(Q) phi(K)^T o L), elu + 1.

    Its diagonal is positive, so it is lower triangular and nonsingular: full rank n, although
    the unmasked matrix has rank at most r.
    """
    Q, K = as_matrix("Q", Q), as_matrix("K", K)
    A = np.tril(elu_plus_one(Q) @ elu_plus_one(K).T)
    return A / A.sum(axis=1, keepdims=True)


def sharpness_bound(FK: np.ndarray) -> np.ndarray:
    """Section 6.2: the bound max_m phi(k_j)_m / phi(k_l)_m on A_ij / A_il, for every (j, l).

    FK (n, r) positive features of the keys -> (n, n). No query makes a row of the linear
    attention matrix more peaked: A_ij / A_il is a weighted average of the ratios b_m / c_m.
    """
    FK = as_matrix("FK", FK)
    if not np.all(FK > 0):
        raise ValueError("FK must be strictly positive (the bound divides by phi(k_l))")
    return (FK[:, None, :] / FK[None, :, :]).max(axis=2)


def weight_ratios(A: np.ndarray) -> np.ndarray:
    """Section 6.2: A_ij / A_il for every row i and pair (j, l): (n, m) -> (n, m, m)."""
    A = as_matrix("A", A)
    return A[:, :, None] / A[:, None, :]


def feature_gram(FK: np.ndarray) -> np.ndarray:
    """Section 6.3: the inner products phi(k_i)^T phi(k_j) of the keys' features, (n, n)."""
    FK = as_matrix("FK", FK)
    return FK @ FK.T


def crosstalk(K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Section 6.3: the reads k_i^T S / |k_i|^2 of the additive memory S = K^T V, minus V.

        k_i^T S = |k_i|^2 v_i^T + sum_{j != i} (k_i^T k_j) v_j^T.

    Zero for every choice of values exactly when the keys are mutually orthogonal.
    """
    K, V = as_matrix("K", K), as_matrix("V", V)
    reads = K @ (K.T @ V) / (K**2).sum(axis=1, keepdims=True)
    return reads - V


def linear_loss(S: np.ndarray, k: np.ndarray, v: np.ndarray) -> float:
    """Section 7.1: the linear loss -<S^T k, v> of the additive rule (Yang et al., 2024b)."""
    S, k, v = as_matrix("S", S), as_vector("k", k), as_vector("v", v)
    return -float((S.T @ k) @ v)


def linear_loss_gradient(S: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Section 7.1: the gradient of -<S^T k, v> by central differences, entry by entry.

    The spec's claim is that it is -k v^T whatever S holds, so a step of size 1 against it is
    the additive write S + k v^T. The difference quotient is exact for a linear function up to
    rounding, so the step h = 1 is taken.
    """
    S, k, v = as_matrix("S", S), as_vector("k", k), as_vector("v", v)
    gradient = np.empty_like(S)
    for index in np.ndindex(S.shape):
        E = np.zeros_like(S)
        E[index] = 1.0
        gradient[index] = (linear_loss(S + E, k, v) - linear_loss(S - E, k, v)) / 2
    return gradient


def softmax_read(K: np.ndarray, V: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Section 9: what softmax attention returns for query q from a cache of keys K and values V,
    sum_j P_j v_j with P = softmax(K q / sqrt(d))."""
    K, V, q = as_matrix("K", K), as_matrix("V", V), as_vector("q", q)
    same_columns(("K", "q"), K, q[None])
    return softmax_rows((K @ q)[None] / np.sqrt(len(q)))[0] @ V


def softmax_unshifted(G: np.ndarray) -> np.ndarray:
    """Section 2: the row-wise softmax exp(G_ij) / sum_l exp(G_il) taken literally, without
    subtracting the row's largest score first (it overflows for scores beyond about 709)."""
    G = as_matrix("G", G)
    with np.errstate(over="ignore", invalid="ignore"):
        E = np.exp(G)
        return E / E.sum(axis=1, keepdims=True)


def nadaraya_watson(
    Q: np.ndarray, K: np.ndarray, V: np.ndarray, kernel: Callable[[np.ndarray, np.ndarray], float]
) -> np.ndarray:
    """Section 3: the Nadaraya-Watson estimate at each query, one token at a time,

        o_i = sum_j kappa(q_i, k_j) v_j / sum_j kappa(q_i, k_j),

    for a kernel ``kernel(q, k)`` (a number). Shapes: Q (n, d), K (m, d), V (m, d_v) -> (n, d_v).
    """
    Q, K, V = as_matrix("Q", Q), as_matrix("K", K), as_matrix("V", V)
    same_columns(("Q", "K"), Q, K)
    out = np.empty((len(Q), V.shape[1]))
    for i, q in enumerate(Q):
        weights = np.array([kernel(q, k) for k in K])  # kappa(q_i, k_j), (m,)
        out[i] = weights @ V / weights.sum()
    return out


def exponential_kernel(q: np.ndarray, k: np.ndarray) -> float:
    """Section 3: kappa(q, k) = exp(q^T k / sqrt(d)), the kernel of softmax attention."""
    return float(np.exp(q @ k / np.sqrt(len(q))))


def tensor_power(x: np.ndarray, m: int) -> np.ndarray:
    """Section 3: the m-fold tensor power x^(x)m, flattened to d^m coordinates (1 for m = 0)."""
    x = as_vector("x", x)
    power = np.ones(1)
    for _ in range(m):
        power = np.outer(power, x).ravel()  # (d^j,) -> (d^(j+1),)
    return power


def exponential_series_features(x: np.ndarray, terms: int) -> np.ndarray:
    """Section 3: the first ``terms`` blocks of the exponential kernel's feature vector, which
    stacks x^(x)m / sqrt(m!) for m = 0, 1, ..., terms - 1, so that

        phi(q)^T phi(k) = sum_{m < terms} (q^T k)^m / m!  ->  exp(q^T k).
    """
    terms = as_positive_int("terms", terms)
    return np.concatenate(
        [tensor_power(x, m) / np.sqrt(float(math.factorial(m))) for m in range(terms)]
    )


def random_feature_ratio(
    q: np.ndarray, K: np.ndarray, V: np.ndarray, r: int, draws: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Section 4: ``draws`` independent estimates, each from its own r positive random features,
    of the kernel values exp(q^T k_j) and of the output o = sum_j exp(q^T k_j) v_j / sum_j
    exp(q^T k_j) (a ratio of two unbiased estimates).

    Shapes: q (d,), K (m, d), V (m, d_v) -> the kernel estimates (draws, m), the outputs
    (draws, d_v) and the exact output (d_v,).
    """
    _generator(rng)
    q, K, V = as_vector("q", q), as_matrix("K", K), as_matrix("V", V)
    r, draws = as_positive_int("r", r), as_positive_int("draws", draws)
    W = rng.standard_normal((draws, r, len(q)))  # one set of r features per draw

    def phi(X):  # (m, d) -> (draws, m, r), the features of section 4
        return np.exp(np.einsum("brd,md->bmr", W, X) - 0.5 * (X**2).sum(1)[None, :, None])

    kernels = np.einsum("br,bmr->bm", phi(q[None])[:, 0], phi(K)) / r  # (draws, m)
    outputs = kernels @ V / kernels.sum(axis=1, keepdims=True)  # (draws, d_v)
    exact = np.exp(K @ q)
    return kernels, outputs, exact @ V / exact.sum()


def counted_softmax_step(q: np.ndarray, K: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, int]:
    """Section 2 / 9: generation step t of softmax attention, reading a cache of t keys K and
    values V (t, d): the scores K q, the softmax, the read P V. Returns (o_t, operations
    counted product by product), 4 t d."""
    K, V, q = as_matrix("K", K), as_matrix("V", V), as_vector("q", q)
    scores = K @ q[:, None] / np.sqrt(len(q))  # (t, 1)
    p = softmax_rows(scores.T)  # (1, t)
    return (p @ V)[0], product_ops(K, q[:, None]) + product_ops(p, V)


def counted_linear_step(
    S: np.ndarray, fq: np.ndarray, fk: np.ndarray, v: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int]:
    """Section 5: one step of causal linear attention on the state S (r, d): the write
    S + phi(k) v^T, then the read S^T phi(q). Returns (the read, the new state, operations
    counted product by product), 4 r d (the normaliser z is r more: "about")."""
    S, fq, fk, v = as_matrix("S", S), as_vector("fq", fq), as_vector("fk", fk), as_vector("v", v)
    S = S + fk[:, None] @ v[None]
    read = S.T @ fq[:, None]  # (d, 1)
    return read[:, 0], S, product_ops(fk[:, None], v[None]) + product_ops(S.T, fq[:, None])


def counted_delta_step(
    S: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """Section 7 / 9: one step of the delta rule on S (r, d): the read S^T k, the pseudo-value
    u = beta (v - S^T k), the write S + k u^T and the read S^T q. Returns (the read, the new
    state, operations counted product by product), 6 r d."""
    S, q, k, v = as_matrix("S", S), as_vector("q", q), as_vector("k", k), as_vector("v", v)
    old = S.T @ k[:, None]  # (d, 1)
    u = beta * (v - old[:, 0])
    S = S + k[:, None] @ u[None]
    read = S.T @ q[:, None]
    ops = product_ops(S.T, k[:, None]) + product_ops(k[:, None], u[None])
    return read[:, 0], S, ops + product_ops(S.T, q[:, None])


def counted_chunked_linear(
    FQ: np.ndarray, FK: np.ndarray, V: np.ndarray, C: int
) -> tuple[np.ndarray, int]:
    """Section 5.1: causal linear attention (numerator only) in blocks of C tokens, with the
    operations counted product by product: inside each block (phi(Q_b) phi(K_b)^T o L_C) V_b,
    2 C^2 (r + d); across blocks phi(Q_b) S and S + phi(K_b)^T V_b, 4 C r d. For C dividing n
    that is 2 n C (r + d) + 4 n r d. Shapes: FQ, FK (n, r), V (n, d) -> (n, d), operations."""
    FQ, FK, V = as_matrix("FQ", FQ), as_matrix("FK", FK), as_matrix("V", V)
    C = as_positive_int("C", C)
    S, out, ops = np.zeros((FK.shape[1], V.shape[1])), np.empty((len(V), V.shape[1])), 0
    for start in range(0, len(V), C):
        fq, fk, v = FQ[start : start + C], FK[start : start + C], V[start : start + C]
        A = np.tril(fq @ fk.T)  # the masked block, (C, C)
        out[start : start + C] = A @ v + fq @ S
        ops += product_ops(fq, fk.T) + product_ops(A, v) + product_ops(fq, S)
        S = S + fk.T @ v  # the state after the block, (r, d)
        ops += product_ops(fk.T, v)
    return out, ops


def delta_read_change(
    S: np.ndarray, K: np.ndarray, k: np.ndarray, v: np.ndarray, beta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Section 7.3: how one delta-rule write with key k changes the reads k_i^T S of the keys K
    (n, r). Returns (the reads after minus the reads before, (n, d); the pseudo-value u (d,)),
    the write computed by the reference's recurrence; the spec says the change is
    (k_i^T k) u^T."""
    S, K = as_matrix("S", S), as_matrix("K", K)
    k, v = as_vector("k", k), as_vector("v", v)
    _, after = delta_rule(k[None], k[None], v[None], [beta], initial_state=S)
    return K @ after - K @ S, beta * (v - S.T @ k)


def total_read_error(K: np.ndarray, V: np.ndarray, S: np.ndarray) -> float:
    """Section 7.3: the total squared read error |K S - V|_F^2 of a memory S for pairs (K, V)."""
    K, V, S = as_matrix("K", K), as_matrix("V", V), as_matrix("S", S)
    return float(((K @ S - V) ** 2).sum())


def hybrid_cache_numbers(pattern: str, t: int, d: int) -> int:
    """Section 10: the KV cache after t tokens of a stack of layers, one letter a layer: "A" a
    full-attention layer (2 t d numbers a head), "L" a linear-attention layer (no cache: its state
    is fixed). Kimi Linear's 3:1 stack repeats "LLLA"."""
    if not isinstance(pattern, str) or not pattern or set(pattern) - {"A", "L"}:
        raise ValueError(f"pattern must be a non-empty string of 'A' and 'L', got {pattern!r}")
    return sum(kv_cache_numbers(t, d) for layer in pattern if layer == "A")


def _generator(rng: object) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
