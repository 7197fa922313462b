"""The additive rule: linear attention and its gated forms, Mamba-2 / RetNet and GLA (spec 4, 5).

    S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T            (alpha_t = exp g_t; no gate: I)

The write does not read the state: one token writes u_t = v_t, and a chunk's pseudo-values are its
values, U = V, whatever state enters the chunk (section 5.1). So the chunk loop can form every
chunk's write Ke^T V in one batched product (``READS_STATE`` False), and U has no terms W, U0 of
its own beyond U0 = V.
"""

from __future__ import annotations

from torch import Tensor

from linattn.ops.rules.base import PseudoValueTerms, Rule


class AdditiveRule(Rule):
    """u_t = v_t: no input of its own, U = V."""

    NAME = "additive"
    READS_STATE = False  # U = V: the chunk's write does not depend on the state entering it
    FUSED = True

    def write(self, S: Tensor, k_t: Tensor, v_t: Tensor, x_t: Tensor | None) -> Tensor:
        """u_t = v_t (the step's write; S, k_t and x_t are not read)."""
        return v_t

    def pseudo_value_terms(self, terms) -> PseudoValueTerms:
        """U0 = V, W = 0 (None)."""
        return PseudoValueTerms(W=None, U0=terms.v)

    def pseudo_value_backward(self, terms, dU: Tensor, S: Tensor) -> tuple:
        """dv = dU; no input, no Kd, no product of the rule's own."""
        return dU, None, None, []


RULE = AdditiveRule()
