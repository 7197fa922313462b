"""Figure 8's matrices come from the library's chunk terms: they must be the spec's formulas."""

import numpy as np

from linattn import reference
from linattn.figures import chunked


def test_chunk_matrices_are_the_spec_formulas():
    # Section 8: I + L with L_ti = beta_t k_t^T k_i (i < t), and Q K^T * L_C (the causal mask);
    # the reference's pseudo-values then solve (I + L) U = diag(beta) (V - K S).
    Q, K, V, beta = chunked._example(8, 5, seed=4)
    S = np.random.default_rng(5).standard_normal((5, 5))
    unit_lower, masked = chunked._chunk_matrices(Q, K, V, beta)
    np.testing.assert_allclose(unit_lower, np.eye(8) + np.tril(beta[:, None] * (K @ K.T), -1),
                               rtol=0, atol=1e-14)  # fmt: skip
    np.testing.assert_allclose(masked, np.tril(Q @ K.T), rtol=0, atol=1e-14)
    U = reference.pseudo_values(K, V, beta, S)
    np.testing.assert_allclose(unit_lower @ U, beta[:, None] * (V - K @ S), rtol=0, atol=1e-12)
