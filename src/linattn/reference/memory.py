"""The memory as an associative store (sections 6.3, 7 and 7.3): worked examples and read errors."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, same_rows
from linattn.reference.delta import delta_rule
from linattn.reference.mesa import mesa_memory

MESA_LAMBDA = 1.0  # Table 1's MesaNet column: fla's MesaNet layer starts lambda at 1


def unit(X: np.ndarray) -> np.ndarray:
    """Each row of X scaled to unit length."""
    X = as_matrix("X", X)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError("X has a zero row, which has no direction")
    return X / norms


def figure5_example() -> dict[str, np.ndarray]:
    """Figure 5 (section 6.3): three additive writes into a 2 x 2 memory.

    keys (1, 0), (0, 1), (1, 1); values (3, 1), (-1, 2), (2, 0); S_t = sum_{j <= t} k_j v_j^T.
    Returns keys, values, S2, S3, the reads k_i^T S_3 / |k_i|^2 and the crosstalk reads - values.
    """
    keys = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    values = np.array([[3.0, 1.0], [-1.0, 2.0], [2.0, 0.0]])
    S2, S3 = keys[:2].T @ values[:2], keys.T @ values
    reads = keys @ S3 / (keys**2).sum(axis=1, keepdims=True)  # k_i^T S_3 / |k_i|^2, (3, 2)
    return {
        "keys": keys,
        "values": values,
        "S2": S2,
        "S3": S3,
        "reads": reads,
        "crosstalk": reads - values,
    }


def figure6_example() -> dict[str, np.ndarray]:
    """Figure 6 (section 7): a new value under an old key, additive rule against the delta rule.

    keys (1, 0), (0, 1), (1, 0); values (3, 1), (-1, 2), (0, 4); beta = 1.
    Returns keys, values, additive_S3 = K^T V, delta_S3 from the recurrence, and the pseudo-value
    u_3 = v_3 - S_2^T k_3 (the new value minus the old read).
    """
    keys = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    values = np.array([[3.0, 1.0], [-1.0, 2.0], [0.0, 4.0]])
    _, delta_S3 = delta_rule(keys, keys, values, np.ones(3))
    return {
        "keys": keys,
        "values": values,
        "additive_S3": keys.T @ values,
        "delta_S3": delta_S3,
        "u3": values[2] - keys[2] @ (keys[:2].T @ values[:2]),
    }


def least_squares_memory(K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """The least-squares memory of section 7.3: argmin_S |K S - V|_F^2 (minimum norm if not unique).

    No r x d memory has a lower total squared read error; exact when n <= r and the keys are
    linearly independent. Shapes: K (n, r), V (n, d) -> S (r, d).
    """
    K, V = as_matrix("K", K), as_matrix("V", V)
    same_rows(("K", "V"), K, V)
    return np.linalg.lstsq(K, V, rcond=None)[0]


def kaczmarz_sweeps(K: np.ndarray, V: np.ndarray, sweeps: int) -> np.ndarray:
    """The same pairs written again and again by the delta rule with beta = 1, section 7.3.

    Each write S <- S + k_t (v_t - S^T k_t)^T / |k_t|^2 projects every column of S onto the
    hyperplane of one equation k_t^T s = v_tc: a sweep of the Kaczmarz method (Strohmer and
    Vershynin, 2009). For the spec's unit keys the division by |k_t|^2 = 1 is the plain delta rule.
    It converges for a consistent system (Tanabe, 1971). Shapes: K (n, r), V (n, d) -> S (r, d).
    """
    K, V = as_matrix("K", K), as_matrix("V", V)
    same_rows(("K", "V"), K, V)
    sweeps = as_positive_int("sweeps", sweeps)
    squared_norms = (K**2).sum(axis=1)
    if np.any(squared_norms == 0):
        raise ValueError("K has a zero row; a zero key defines no hyperplane")
    S = np.zeros((K.shape[1], V.shape[1]))
    for _ in range(sweeps):
        for t in range(len(K)):
            S += np.outer(K[t], V[t] - K[t] @ S) / squared_norms[t]
    return S


def recall_errors(
    n: int,
    r: int = 32,
    repetitions: int = 200,
    seed: int = 2,
    on_repetition: Callable[[], object] | None = None,
) -> dict[str, float]:
    """One row of Table 1, section 7.3: root-mean-square read errors of three memories.

    Each repetition draws n keys, then n values, uniformly on the unit sphere of R^r (d = r), from
    ``np.random.default_rng(seed)``; stores them with the additive rule (S = K^T V), the delta rule
    (beta = 1) and least squares; and reads every stored key back. The squared read error of a
    pair is |S^T k_i - v_i|^2. Returns the root of the mean over repetitions of the mean squared
    error: "additive", "delta, all pairs", "delta, 8 newest" (the last 8 pairs), "least squares",
    and "mesanet": MesaNet's memory (``linattn.reference.mesa``: beta = 1, no decay) with its
    ridge lambda = ``MESA_LAMBDA`` (fla's initial value), the least-squares memory regularised.
    ``on_repetition`` is called after each repetition (a progress bar).
    """
    n, r = as_positive_int("n", n), as_positive_int("r", r)
    repetitions = as_positive_int("repetitions", repetitions)
    seed = _as_seed(seed)
    rng = np.random.default_rng(seed)
    squared: dict[str, list[float]] = {
        "additive": [],
        "delta, all pairs": [],
        "delta, 8 newest": [],
        "least squares": [],
        "mesanet": [],
    }
    for _ in range(repetitions):
        K = unit(rng.standard_normal((n, r)))  # keys first, then values: the spec's draw order
        V = unit(rng.standard_normal((n, r)))
        memories = {
            "additive": K.T @ V,
            "delta": delta_rule(K, K, V, np.ones(n))[1],
            "least squares": least_squares_memory(K, V),
            "mesanet": mesa_memory(K, V, MESA_LAMBDA),
        }
        errors = {name: ((K @ S - V) ** 2).sum(axis=1) for name, S in memories.items()}
        squared["additive"].append(errors["additive"].mean())
        squared["delta, all pairs"].append(errors["delta"].mean())
        squared["delta, 8 newest"].append(errors["delta"][-8:].mean())
        squared["least squares"].append(errors["least squares"].mean())
        squared["mesanet"].append(errors["mesanet"].mean())
        if on_repetition is not None:
            on_repetition()
    return {name: float(np.sqrt(np.mean(x))) for name, x in squared.items()}


def recall_theory(n: int, r: int) -> tuple[float, float]:
    """The two theory columns of Table 1, section 7.3, for n random unit pairs in R^r.

    additive:       sqrt((n - 1) / r)          (crosstalk, E[(k_i^T k_j)^2] = 1/r)
    least squares:  sqrt(max(0, 1 - r / n))    (the fit is a projection of rank r)
    """
    n, r = as_positive_int("n", n), as_positive_int("r", r)
    return float(np.sqrt((n - 1) / r)), float(np.sqrt(max(0.0, 1.0 - r / n)))


def _as_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be a nonnegative integer, got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be a nonnegative integer, got {seed}")
    return int(seed)
