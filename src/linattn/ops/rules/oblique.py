"""The oblique delta rule: the delta rule whose read key differs from the key it writes along.

    S_t = (I - k_t r_t^T) D_t S_{t-1} + k_t v_t^T,   u_t = v_t - (D_t S_{t-1})^T r_t

(spec sections 7, 8; D_t the gate, applied first, as for the delta rule). The transition
I - k r^T is not symmetric: the state is read along r_t and corrected along k_t. With r = k and
k, v scaled by beta it is the delta rule; Preconditioned DeltaNet (arXiv:2604.21100) writes
along its preconditioned key kp = M * k and reads along k (k -> beta kp, r -> k,
``linattn.ops.precond_delta_rule``). Its one input, the read key r [K] per token and value head,
travels in the rule's slot (the ops' ``beta`` argument).

The chunk form is the delta rule's UT transform (section 8) with the read keys on the rows of
the products and the write keys on their columns: with G the cumulative log-gates of a chunk,
Rd = r * exp(G) (the read keys decayed from the chunk's start) and the strictly lower product

    L[t, s] = sum_c r_tc k_sc exp(G_tc - G_sc)   (s < t),

the pseudo-values (the errors u_t) of a chunk entering with S solve

    (I + L) U = V - Rd S,     U = U0 - W S,   [W | U0] = (I + L)^{-1} [Rd | V],

and the chunk loop's steps are the delta rule's: S <- D S + Ke^T U, O = Qd S + A_qk U, with Ke
and A_qk formed from the write keys k. Every exponent is a difference G_x - G_y with x >= y.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops.rules.base import Input, PseudoValueTerms, Rule, read


class ObliqueRule(Rule):
    """u_t = v_t - S^T r_t: the read key r [K] a token and value head, written along k."""

    NAME = "oblique"
    INPUTS = (Input("r", "K"),)
    READS_STATE = True  # U = U0 - W S
    PRODUCTS = ()  # its product has r on the left: ``pseudo_value_terms``
    DECAYED_KEYS = False  # reads Rd = r exp(G), not Kd
    FUSED = True

    def write(self, S: Tensor, k_t: Tensor, v_t: Tensor, x_t: Tensor | None) -> Tensor:
        """u_t = v_t - S^T r_t, S the decayed state, x_t = r_t [..., K]."""
        return v_t - read(S, x_t)

    def pseudo_value_terms(self, terms) -> PseudoValueTerms:
        """W = (I + L)^{-1} Rd and U0 = (I + L)^{-1} V (the module docstring)."""
        r = terms.beta  # [n, P, C, K]
        K, C = r.shape[-1], r.shape[-2]
        Rd = r if terms.eG is None else r * terms.eG
        # The inclusive product of r by k with this group's gates; its diagonal is dropped.
        L = terms.decayed_products([r], terms.k, "rk").As[0].tril(-1)
        eye = torch.eye(C, dtype=r.dtype, device=r.device)
        R = torch.cat([Rd, terms.v], dim=-1)  # [n, P, C, K + V]
        X = torch.linalg.solve_triangular(eye + L, R, upper=False, unitriangular=True)
        return PseudoValueTerms(W=X[..., :K], U0=X[..., K:])


RULE = ObliqueRule()
