"""State tracking by construction: what a fixed memory can compute while it reads.

A product of transitions whose eigenvalues lie in [0, 1] cannot flip a sign; the delta rule with
beta in [0, 2] has the eigenvalue 1 - beta in [-1, 1] (section 7.2), and at beta = 2 its transition
I - 2 k k^T is a Householder reflection (Grazzi et al., ICLR 2025). A transposition of n items is
such a reflection, with key (e_i - e_j) / sqrt(2), so n - 1 writes per token (DeltaProduct, Siems
et al., 2025) compose any permutation of S_n. The constructions here set the keys, values and
write strengths by hand and run the literal delta rule (``linattn.reference.delta_rule``).
"""

from __future__ import annotations

import numpy as np

from linattn.reference.checks import as_matrix, as_positive_int, as_vector
from linattn.reference.delta import delta_rule


def _bits(name: str, x: object) -> np.ndarray:
    """A 1-D array of 0/1 entries, as int."""
    array = as_vector(name, x)
    if not np.all((array == 0) | (array == 1)):
        raise ValueError(f"{name} must hold only 0 and 1")
    return array.astype(int)


def parity_by_reflection(x: object, k: object) -> np.ndarray:
    """The parity of x_1..x_t read from a one-head delta rule with the fixed unit key ``k``.

    Token 0 writes S_0 = k v^T (beta_0 = 1, v = 1, from S = 0); token t >= 1 writes nothing
    (v_t = 0) with beta_t = 2 x_t, so S_t = (I - 2 x_t k k^T) S_{t-1}: a reflection that maps k to
    -k when x_t = 1, the identity when x_t = 0. Hence S_t = (-1)^(x_1 + ... + x_t) k and the read
    q = k gives o_t = +-1. Shapes: x (n,) of 0/1, k (r,) -> o (n,), the reads at tokens 1..n.
    """
    x = _bits("x", x)
    k = as_vector("k", k)
    k = k / np.linalg.norm(k)
    n = len(x)
    K = np.tile(k, (n + 1, 1))  # (n + 1, r): the same key at every token
    V = np.zeros((n + 1, 1))
    V[0] = 1.0
    beta = np.concatenate([[1.0], 2.0 * x])
    out, _ = delta_rule(K, K, V, beta)
    return out[1:, 0]


def threshold_accuracy(y: object, labels: object) -> float:
    """The best accuracy of a threshold read ``label = [y > theta]`` (or ``[y < theta]``) over
    every theta: how well any one-number read-out of the state ``y`` separates the two classes.

    Shapes: y (n,), labels (n,) of 0/1.
    """
    y = as_vector("y", y)
    labels = _bits("labels", labels)
    if len(labels) != len(y):
        raise ValueError(f"labels must have {len(y)} entries, got {len(labels)}")
    order = np.argsort(y, kind="stable")
    ys, ls = y[order], labels[order]
    # Cuts between distinct values only: predict 1 above the cut (ones right of it), or 0 above.
    ones_left = np.concatenate([[0], np.cumsum(ls)])  # ones among the i smallest
    i = np.arange(len(y) + 1)
    cut = np.concatenate([[True], ys[1:] != ys[:-1], [True]])
    above_is_one = (i - ones_left) + (ls.sum() - ones_left)  # zeros left + ones right
    best = max(above_is_one[cut].max(), (len(y) - above_is_one)[cut].max())
    return float(best) / len(y)


def decaying_state(x: object, a: tuple[float, float], b: tuple[float, float]) -> np.ndarray:
    """The fixed-key state with transitions in [0, 1]: s_t = a[x_t] s_{t-1} + b[x_t], s_0 = 0.

    The coordinate of any additive (a = 1), decaying (Mamba-2, GLA along one key: a in [0, 1]) or
    delta-rule state with beta in [0, 1] (a = 1 - beta, b = beta v) along a fixed key. Shapes:
    x (n,) of 0/1 -> s (n,).
    """
    x = _bits("x", x)
    for name, pair in (("a", a), ("b", b)):
        if len(pair) != 2:
            raise ValueError(f"{name} must have 2 entries (one per input bit), got {len(pair)}")
    if not all(0.0 <= value <= 1.0 for value in a):
        raise ValueError(f"a must lie in [0, 1] (the transitions' eigenvalues), got {a}")
    s, out = 0.0, np.empty(len(x))
    for t, bit in enumerate(x):
        s = a[bit] * s + b[bit]
        out[t] = s
    return out


def transpositions(p: object) -> list[tuple[int, int]]:
    """Transpositions tau_1, .., tau_m (m <= n - 1) whose product tau_1 tau_2 .. tau_m is the
    permutation ``p`` (p[j] = the image of j), found by fixing one position at a time."""
    arr = [int(v) for v in as_vector("p", p)]
    n = len(arr)
    if sorted(arr) != list(range(n)):
        raise ValueError(f"p must be a permutation of 0..{n - 1}, got {arr}")
    swaps = []
    for i in range(n - 1):
        if arr[i] != i:
            a = arr[i]
            swaps.append((a, i))
            arr = [i if v == a else a if v == i else v for v in arr]  # tau o arr: swap values
    return swaps


def permutation_matrix(p: object) -> np.ndarray:
    """P with P e_j = e_{p[j]}, (n, n)."""
    arr = as_vector("p", p).astype(int)
    P = np.zeros((len(arr), len(arr)))
    P[arr, np.arange(len(arr))] = 1.0
    return P


def permutation_writes(perms: object) -> tuple[np.ndarray, np.ndarray]:
    """The hand-set keys and write strengths of DeltaProduct with n_h = n - 1 for a word of S_n.

    Token t's permutation g_t = tau_1 .. tau_m becomes n - 1 writes, rows t (n - 1) .. t (n - 1) +
    n - 2 of the interleaved sequence: the reflections I - 2 k k^T with k = (e_a - e_b) / sqrt(2),
    tau_m first, then beta = 0 (the identity) for the unused writes. Shapes: perms (T, n) ->
    K (T (n - 1), n), beta (T (n - 1),).
    """
    perms = as_matrix("perms", perms).astype(int)
    T, n = perms.shape
    if n < 2:
        raise ValueError(f"perms must permute n >= 2 items, got n = {n}")
    n_h = n - 1
    K = np.zeros((T * n_h, n))
    K[:, 0] = 1.0  # the key of an unused write (beta = 0): any unit vector
    beta = np.zeros(T * n_h)
    for t, p in enumerate(perms):
        for j, (a, b) in enumerate(reversed(transpositions(p))):
            row = t * n_h + j
            K[row] = 0.0
            K[row, a], K[row, b] = 2.0**-0.5, -(2.0**-0.5)
            beta[row] = 2.0
    return K, beta


def permutation_by_reflections(perms: object, reads: object) -> tuple[np.ndarray, np.ndarray]:
    """DeltaProduct with n_h = n - 1 hand-set writes per token tracks a word of S_n.

    From S_0 = I (n x n) and values 0, each token's writes multiply the state by the permutation
    matrix of its element, so S_t = P(g_t) .. P(g_1) = P(g_t o .. o g_1), the running
    composition. The read of token t, at its last write, is q = e_{reads[t]}: o_t = S_t^T q, row
    ``reads[t]`` of that matrix. Shapes: perms (T, n), reads (T,) -> O (T, n), final S (n, n).
    """
    K, beta = permutation_writes(perms)
    T, n = np.shape(perms)
    n_h = n - 1
    reads = as_vector("reads", reads, T).astype(int)
    if np.any((reads < 0) | (reads >= n)):
        raise ValueError(f"reads must lie in 0..{n - 1}")
    Q = np.zeros_like(K)
    Q[np.arange(T) * n_h + n_h - 1, reads] = 1.0  # one read per token, at its last write
    out, S = delta_rule(Q, K, np.zeros_like(K), beta, initial_state=np.eye(n))
    return out[n_h - 1 :: n_h], S


def running_compositions(perms: object) -> np.ndarray:
    """The word problem's labels: c_t = g_t o .. o g_1 for each t, as permutations. (T, n)."""
    perms = as_matrix("perms", perms).astype(int)
    out, current = np.empty_like(perms), np.arange(perms.shape[1])
    for t, p in enumerate(perms):
        current = p[current]
        out[t] = current
    return out


def random_permutations(rng: np.random.Generator, length: object, n: object) -> np.ndarray:
    """``length`` uniform random permutations of n items, (length, n)."""
    length, n = as_positive_int("length", length), as_positive_int("n", n)
    return np.stack([rng.permutation(n) for _ in range(length)])
