"""The delta rule: DeltaNet and its gated forms, Gated DeltaNet and KDA (spec sections 7, 8).

    S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T

The decay is applied first and the error is read from the decayed state. One token writes the
pseudo-value u_t = beta_t (v_t - S^T k_t) (read, correct, write: section 7). A chunk of C tokens
entering with state S writes U = T (V - Kd S), T = (I + L)^{-1} diag(beta) (section 8: the UT
transform), where L = diag(beta) A_kk is the strictly lower decayed product of the keys and
Kd = K * exp(G) the keys decayed from the chunk's start. Split into its state-independent terms:

    (I + L) U = diag(beta) (V - Kd S)        U = U0 - W S,
    W = T Kd,  U0 = T V                      (one product with the explicit inverse (I + L)^{-1})

so that the chunk loop's only sequential step is U = U0 - W S, then S <- D S + Ke^T U.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from linattn.ops._blockmath import unit_lower_inverse
from linattn.ops.rules.base import Input, PseudoValueTerms, Rule, read


@dataclass
class DeltaTerms(PseudoValueTerms):
    """The UT transform's terms: W = T Kd, U0 = T V, T = (I + L)^{-1} diag(beta), with what the
    backward reads: A_kk (the strictly lower decayed k k^T), I + L, its inverse (None where
    autograd records the terms) and X = [W, U0]."""

    A_kk: Tensor | None = None
    I_plus_L: Tensor | None = None
    Ainv: Tensor | None = None
    X: Tensor | None = None


class DeltaRule(Rule):
    """u_t = beta_t (v_t - S^T k_t): one write strength beta in [0, 2] a token and value head."""

    NAME = "delta"
    INPUTS = (Input("beta", "1", 0.0, 2.0),)
    READS_STATE = True  # U = U0 - W S
    PRODUCTS = (("k", True),)  # A_kk = decayed tril(k k^T), j < i: the rows of L
    DECAYED_KEYS = True  # Kd = K exp(G), the keys decayed from the chunk's start (terms.Kd)
    FUSED = True

    def write(self, S: Tensor, k_t: Tensor, v_t: Tensor, x_t: Tensor | None) -> Tensor:
        """u_t = beta_t (v_t - S^T k_t), S the decayed state (beta_t [...] broadcast over V)."""
        return x_t.unsqueeze(-1) * (v_t - read(S, k_t))

    def pseudo_value_terms(self, terms) -> DeltaTerms:
        """W = T Kd and U0 = T V with T = (I + L)^{-1} diag(beta), and what the backward needs."""
        k, v, buffers = terms.k, terms.v, terms.buffers
        A_kk = terms.products.As[-1]  # [n, P, C, C], strictly lower
        b = terms.beta.unsqueeze(-1)  # [n, P, C, 1]
        A = torch.mul(A_kk, b, out=buffers("A", A_kk))  # L = diag(beta) A_kk
        A.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # [n, P, C, C], unit lower triangular
        K = k.shape[-1]
        R = buffers("R", k, (*k.shape[:-1], K + v.shape[-1]))
        if R is None:
            # Differentiable: one solve for both right-hand sides, X = (I + L)^{-1} R (no
            # explicit inverse: only the hand-written backward needs it; for long chunks, as
            # the parallel form's one chunk of T tokens, it would cost C^3 against C^2 (K + V)).
            R = torch.cat([terms.Kd, v], dim=-1) * b  # [n, P, C, K + V]
            Ainv = None
            X = torch.linalg.solve_triangular(A, R, upper=False, unitriangular=True)
        else:
            Ainv = unit_lower_inverse(A, out=buffers("Ainv", A))  # [n, P, C, C]
            # One product for both right-hand sides: X = Ainv [beta Kd, beta v] = [W, U0].
            torch.mul(terms.Kd, b, out=R[..., :K])
            torch.mul(v, b, out=R[..., K:])
            X = torch.matmul(Ainv, R, out=buffers("X", R))  # [n, P, C, K + V]
        return DeltaTerms(W=X[..., :K], U0=X[..., K:], A_kk=A_kk, I_plus_L=A, Ainv=Ainv, X=X)

    def pseudo_value_backward(self, terms, dU: Tensor, S: Tensor) -> tuple:
        """(dv, dbeta, dKd, [dA_kk]) from dU, S the states entering the chunks [n, P, K, V].

        U = U0 - W S: dU0 = dU, dW = -dU S^T. X = [W, U0] = Ainv R with R = beta [Kd, v]:
        dR = Ainv^T [dW, dU0], so dR_v = Ainv^T dU and dR_k = -dR_v S^T (one C x C product less
        than Ainv^T [dW, dU0], and no concatenation); d(I + L) = -dR X^T (strictly lower), and
        I + L = I + diag(beta) A_kk gives dA_kk = diag(beta) d(I + L) and dbeta from both the
        rows of L and the right-hand side.
        """
        own = terms.own
        dR_v = own.Ainv.transpose(-1, -2) @ dU  # [n, P, C, V]
        dR_k = (dR_v @ S.transpose(-1, -2)).neg_()  # [n, P, C, K]
        dA = dR_k @ own.W.transpose(-1, -2)  # [n, P, C, C]
        dA.flatten(0, 1).baddbmm_(dR_v.flatten(0, 1), own.U0.transpose(-1, -2).flatten(0, 1))
        dA.neg_()
        b = terms.beta.unsqueeze(-1)
        dKd = b * dR_k
        dv = b * dR_v
        dbeta = (dA * own.A_kk).sum(-1) + (dR_k * terms.Kd).sum(-1) + (dR_v * terms.v).sum(-1)
        return dv, dbeta, dKd, [dA.mul_(b)]


RULE = DeltaRule()
