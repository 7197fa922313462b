"""The parallel form: the whole sequence as one chunk (spec sections 4, 5.1 and 8).

With a single chunk of C = T tokens, the chunk form *is* the masked n x n product: for linear
attention ``O = (Q K^T * D) V`` with the causal decay mask ``D_ij = exp(G_i - G_j)`` (i >= j, 0
above the diagonal), and for the delta rule the same product with the pseudo-values U from one
T x T unit-lower-triangular solve in place of V. Quadratic in T: for tests and short sequences.
Internal layout as in ``chunk``.
"""

from __future__ import annotations

from torch import Tensor

from linattn.ops.chunk import chunk_forward
from linattn.ops.mechanism import Mechanism


def parallel_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
    mech: Mechanism,
) -> tuple[Tensor, Tensor]:
    """The masked n x n product; returns o [B, H, T, V] and the final state [B, H, K, V]."""
    return chunk_forward(q, k, v, beta, g, initial_state, k.shape[2], mech)
