"""The additive rule: linear attention and its gated forms, Mamba-2 / RetNet and GLA (spec 4, 5).

    S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T            (alpha_t = exp g_t; no gate: I)

The write does not read the state: one token writes u_t = v_t, and a chunk's pseudo-values are its
values, U = V, whatever state enters the chunk (section 5.1). So the chunk loop can form every
chunk's write Ke^T V in one batched product (``READS_STATE`` False), and U has no terms W, U0 of
its own beyond U0 = V.
"""

from __future__ import annotations

from torch import Tensor

NAME = "additive"
READS_STATE = False  # U = V: the chunk's write does not depend on the state entering it
PRODUCTS: tuple[tuple[str, bool], ...] = ()  # no decayed product beyond A_qk
DECAYED_KEYS = False  # no Kd = K exp(G)
STACKED = False  # writes along its keys alone (``_chunk_terms.Terms.gradients``)


def entering_write(S: Tensor, beta_t: Tensor | None) -> None:
    """No write reads the state entering the token."""


def write(S: Tensor, k_t: Tensor, v_t: Tensor, beta_t: Tensor | None) -> Tensor:
    """u_t = v_t (the step's write; S, k_t and beta_t are not read)."""
    return v_t


def pseudo_value_terms(terms) -> None:
    """U0 = V, W = 0 (stored as None)."""
    terms.W, terms.U0 = None, terms.v


def pseudo_values(terms, S: Tensor, j: int | None = None, out: Tensor | None = None) -> Tensor:
    """U = V of chunk j (or of every chunk), whatever S."""
    return terms.v if j is None else terms.v[j]


def state_gradient_(terms, j: int, dU_j: Tensor, dS_j: Tensor) -> None:
    """U does not depend on S: nothing to add."""


def pseudo_value_backward(terms, dU: Tensor, S: Tensor) -> tuple:
    """dv = dU; no beta, no Kd, no product of the rule's own."""
    return dU, None, None, []
