"""State tracking by construction: reflections track parity and permutations."""

import numpy as np
import pytest
import torch

from linattn import ops
from linattn.reference import delta_rule
from linattn.reference import state_tracking as st


def test_parity_by_reflection_is_exact_and_a_decaying_state_is_not():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, 2000)
    parity = np.cumsum(x) % 2
    reads = st.parity_by_reflection(x, rng.standard_normal(3))
    assert np.abs(reads - (-1.0) ** parity).max() < 1e-12
    assert st.threshold_accuracy(reads, parity) == 1.0
    # the same construction with beta_t = x_t (eigenvalue 0, not -1) forgets instead of flipping
    k = np.ones(3) / np.sqrt(3)
    K = np.tile(k, (len(x) + 1, 1))
    V = np.zeros((len(x) + 1, 1))
    V[0] = 1
    out, _ = delta_rule(K, K, V, np.concatenate([[1.0], x]))
    assert st.threshold_accuracy(out[1:, 0], parity) < 0.6
    assert st.threshold_accuracy(st.decaying_state(x, (1.0, 0.9), (0.0, 1.0)), parity) < 0.6


def test_threshold_accuracy_is_the_best_cut():
    assert st.threshold_accuracy([0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]) == 1.0
    assert st.threshold_accuracy([0.1, 0.2, 0.3, 0.4], [1, 1, 0, 0]) == 1.0  # either direction
    assert st.threshold_accuracy([0.1, 0.2, 0.3, 0.4], [0, 1, 0, 1]) == 0.75
    assert st.threshold_accuracy([1.0, 1.0, 1.0, 1.0], [0, 1, 0, 1]) == 0.5  # ties cannot be cut
    # brute force over every cut on random data
    rng = np.random.default_rng(1)
    y, labels = rng.integers(0, 6, 40).astype(float), rng.integers(0, 2, 40)
    brute = max(
        max(np.mean((y > theta) == labels), np.mean((y <= theta) == labels))
        for theta in np.concatenate([[-1.0], y])
    )
    assert st.threshold_accuracy(y, labels) == pytest.approx(brute)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_transpositions_compose_to_the_permutation(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        p = rng.permutation(n)
        swaps = st.transpositions(p)
        assert len(swaps) <= n - 1
        product = np.eye(n)
        for a, b in swaps:  # tau_1 tau_2 .. tau_m
            product = product @ st.permutation_matrix(_swap(n, a, b))
        assert np.array_equal(product, st.permutation_matrix(p))


def _swap(n, a, b):
    p = np.arange(n)
    p[a], p[b] = b, a
    return p


@pytest.mark.parametrize("n", [3, 5])
def test_permutation_by_reflections_is_the_running_composition(n):
    rng = np.random.default_rng(10 + n)
    perms, reads = st.random_permutations(rng, 200, n), rng.integers(0, n, 200)
    out, S = st.permutation_by_reflections(perms, reads)
    P = [st.permutation_matrix(c) for c in st.running_compositions(perms)]
    assert np.abs(S - P[-1]).max() < 1e-12
    assert np.abs(out - np.stack([P[t][reads[t]] for t in range(200)])).max() < 1e-12
    # one write fewer per token (n_h = n - 2 of the n - 1 reflections) loses the permutation
    K, beta = st.permutation_writes(perms)
    beta[n - 2 :: n - 1] = 0.0
    _, S_short = delta_rule(K, K, np.zeros_like(K), beta, initial_state=np.eye(n))
    assert np.abs(S_short - P[-1]).max() > 0.5


def test_the_torch_delta_rule_on_the_interleaved_rows_is_the_construction():
    """DeltaProduct's definition: the delta rule on rows t n_h .. t n_h + n_h - 1 (float64)."""
    rng = np.random.default_rng(3)
    perms, n = st.random_permutations(rng, 64, 5), 5
    K, beta = st.permutation_writes(perms)
    reads = rng.integers(0, n, 64)
    Q = np.zeros_like(K)
    Q[np.arange(64) * (n - 1) + n - 2, reads] = 1.0
    t = lambda a: torch.from_numpy(a)[None, :, None]  # noqa: E731  [1, rows, 1, ...]
    o, S = ops.delta_rule(t(Q), t(K), t(np.zeros_like(K)), t(beta), scale=1.0, chunk_size=16,
                          initial_state=torch.eye(n, dtype=torch.float64)[None, None],
                          output_final_state=True)  # fmt: skip
    want, S_want = st.permutation_by_reflections(perms, reads)
    assert np.abs(o[0, n - 2 :: n - 1, 0].numpy() - want).max() < 1e-12
    assert np.abs(S[0, 0].numpy() - S_want).max() < 1e-12


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="x must hold only 0 and 1"):
        st.parity_by_reflection([0, 2], [1.0, 0.0])
    with pytest.raises(ValueError, match="a must lie in"):
        st.decaying_state([0, 1], (0.5, 1.5), (0.0, 1.0))
    with pytest.raises(ValueError, match="p must be a permutation"):
        st.transpositions([0, 0, 1])
    with pytest.raises(ValueError, match="reads must lie"):
        st.permutation_by_reflections([[1, 0, 2]], [3])
    with pytest.raises(ValueError, match="labels must have"):
        st.threshold_accuracy([0.0, 1.0], [1])
