"""The generalized delta rule: a diagonal-plus-low-rank transition (IPLR, DPLR, RWKV-7, Comba).

    S_t = A_t S_{t-1} + k_t v_t^T,        A_t = Diag(exp g_t) + a_t b_t^T

(spec sections 7, 8 and 10). b_t reads the state entering the token, S_{t-1}, not
decayed by g_t; a_t is the direction that read is written along; the write k_t v_t^T has no
strength of its own (the delta rule's beta goes into a and v: a = -beta k, b = k, v' = beta v is
the delta rule, and with b = exp(g) k its gated forms). The gate is none (IPLR: D = I), one per
head or one per key channel, as for every rule.

One token (the step) writes twice: k_t v_t^T, and a_t u_t^T with u_t = S_{t-1}^T b_t read before
the decay (``entering_write``).

The chunk form (section 8's derivation, generalized). A chunk of C tokens enters with state S;
G_t is the cumulative log-gate inside it (inclusive, G_0 = 0) and G_{t-1} its exclusive version.
Unrolling the recurrence inside the chunk,

    S_t = exp(G_t) S + sum_{s<=t} exp(G_t - G_s) (a_s u_s^T + k_s v_s^T),

so that the read of token t, u_t = S_{t-1}^T b_t, is

    u_t = (b_t exp(G_{t-1}))^T S + sum_{s<t} b_t^T exp(G_{t-1} - G_s) (a_s u_s^T + k_s v_s^T).

With Bd = b * exp(G_{t-1}) (b decayed to the state it reads) and the strictly lower products

    A_ba[t, s] = sum_c b_tc a_sc exp(G_{t-1,c} - G_{s,c}),  A_bk likewise with k  (s < t),

the reads U_b (C x V, row t = u_t^T) solve one unit-lower-triangular system (the UT transform):

    (I - A_ba) U_b = A_bk V + Bd S,      U_b = U0 - W S,
    U0 = T A_bk V,  W = -T Bd,  T = (I - A_ba)^{-1}.

The chunk then writes along two directions per token. Stacked along the token axis (2C rows):

    Ke = [k * exp(G_C - G); a * exp(G_C - G)]   U = [V; U_b]   A_q = [A_qk | A_qa]

with A_qa[t, s] = sum_c q_tc a_sc exp(G_t - G_s) (s <= t), and the chunk loop's three steps are
unchanged (``chunk``): 1. U = U0 - W S (U0 = [V; U0_b], W = [0; W_b]); 2. S_next = D S + Ke^T U;
3. O = Qd S + A_q U. Every exponent is a difference G_x - G_y with x >= y: non-positive. The
exclusive left gate of A_ba, A_bk is the inclusive product of b shifted one token up:
A_bk[t, s] = P[t - 1, s] with P[t', s] = sum_c b_{t'+1,c} k_sc exp(G_t' - G_s) (s <= t'), so the
products are ``_chunk_terms.Products`` (the per-channel halving included).

The product of the chunk's transitions (V = 0, the k-writes off) is its WY form,
A_C ... A_1 = Diag(exp G_C) + Ae^T T Bd, Ae = a * exp(G_C - G) (``linattn.reference.dplr``).

Inputs: ``terms.beta`` carries ab = [a | b] [n, P, C, 2K] (the ops' ``beta`` slot). The
gradient (``gradients``, which ``Terms.gradients`` hands a stacked rule): the solve's
(``pseudo_value_backward``), then the products', the shifts undone, and the gates'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from linattn.ops._blockmath import GateSum, decay_exp
from linattn.ops.rules.base import Input, PseudoValueTerms, Rule, read

# The default chunk size of the rule's public ops and layers (``generalized_delta_rule``, Comba,
# RWKV-7, GDN-2). A chunk's products and solve grow as C^2 and the state's products as C: per
# chunk 9 C^2 r + 7 C^2 d + 8 C r d (benchmarks/dplr.py) against the delta rule's 4 C^2 r +
# 3 C^2 d + 6 C r d, so this rule's work per token is lowest at a shorter chunk: 32 was the
# fastest size on the fused CPU kernels, forward and with the backward (benchmarks/README.md,
# "The dplr rule's chunk size"; benchmarks/from-the-code.md). The rounding is the chunk form's at
# any size (the property suite).
CHUNK_SIZE = 32


@dataclass
class DplrTerms(PseudoValueTerms):
    """The stacked terms (the module docstring): U0 = [V; T A_bk V], W = [0; -T Bd], Ke = [Ke;
    Ae], A_qk = [A_qk | A_qa], with what the backward reads: b_up (b one token up), A_bk, Bd,
    M = I - A_ba, X = M^{-1} [A_bk V | Bd], Ae, the exclusive decay exp(G_{t-1}) (None without a
    gate) and the products' own ``Products`` (P_bk, P_a)."""

    b_up: Tensor | None = None
    A_bk: Tensor | None = None
    Bd: Tensor | None = None
    M: Tensor | None = None
    X: Tensor | None = None
    Ae: Tensor | None = None
    eGx: Tensor | None = None  # noqa: N815 (exp(G) of the spec's names)
    P_bk: object = None
    P_a: object = None


def split(ab: Tensor) -> tuple[Tensor, Tensor]:
    """[..., 2K] -> (a, b), each [..., K] (views)."""
    K = ab.shape[-1] // 2
    return ab[..., :K], ab[..., K:]


def _shift_up(x: Tensor) -> Tensor:
    """Row t of x [..., C, D] moved to row t - 1, a zero last row (a new tensor)."""
    return torch.cat([x[..., 1:, :], torch.zeros_like(x[..., :1, :])], dim=-2)


def _shift_down(x: Tensor) -> Tensor:
    """Row t of x [..., C, D] moved to row t + 1, a zero first row (a new tensor)."""
    return torch.cat([torch.zeros_like(x[..., :1, :]), x[..., :-1, :]], dim=-2)


def _exclusive(G: GateSum) -> GateSum:
    """G_{t-1} for every row t of G [..., C, 1|K] (0 on the first row): the decay of the state
    a token's b reads (``_blockmath.GateSum``: both parts shifted)."""
    return G.map(_shift_down)


class DplrRule(Rule):
    """A_t = Diag(exp g_t) + a_t b_t^T: the inputs a, b [K] each, packed as [a | b]."""

    NAME = "dplr"
    INPUTS = (Input("a", "K"), Input("b", "K"))
    READS_STATE = True  # U_b = U0 - W S
    PRODUCTS = ()  # its own have a on the right, not k: ``_products``
    DECAYED_KEYS = False  # reads Bd = b exp(G_{t-1}), not Kd
    STACKED = True  # writes along k and a: A_q = [A_qk | A_qa], Ke = [Ke; Ae], U = [V; U_b]
    CHUNK_SIZE = CHUNK_SIZE
    FUSED = True

    def entering_write(self, S: Tensor, x_t: Tensor | None) -> tuple[Tensor, Tensor]:
        """(a_t, u_t = S^T b_t), S the state entering the token (before its decay): the write
        a_t u_t^T. x_t = [a_t | b_t] [..., 2K]; S [..., K, V]."""
        a_t, b_t = split(x_t)
        return a_t, read(S, b_t)

    def write(self, S: Tensor, k_t: Tensor, v_t: Tensor, x_t: Tensor | None) -> Tensor:
        """u_t = v_t: the write k_t v_t^T (the low-rank part is ``entering_write``'s)."""
        return v_t

    def pseudo_value_terms(self, terms) -> DplrTerms:
        """U0 = [V; T A_bk V], W = [0; -T Bd] (T = (I - A_ba)^{-1}) and the stacked Ke, A_q (the
        module docstring)."""
        a, b = split(terms.beta)  # [n, P, C, K] each
        C, V = a.shape[-2], terms.v.shape[-1]
        b_up = _shift_up(b)  # row t: b_{t+1}
        # The strictly lower products of b with the exclusive left gate, and the causal A_qa.
        P_bk = terms.decayed_products([b_up], terms.k, "bk")
        P_a = terms.decayed_products([b_up] if terms.q is None else [b_up, terms.q], a, "a")
        A_bk, A_ba = _shift_down(P_bk.As[0]), _shift_down(P_a.As[0])  # [n, P, C, C]
        Bd, eGx = b, None
        if terms.G is not None:  # b * exp(G_{t-1}): the exclusive gate, exponents <= 0
            eGx = decay_exp(_exclusive(terms.G).value().to(b.dtype), terms.floor)
            Bd = b * eGx
        eye = torch.eye(C, dtype=a.dtype, device=a.device)
        R = torch.cat([A_bk @ terms.v, Bd], dim=-1)  # [n, P, C, V + K]
        M = eye - A_ba  # unit lower triangular
        X = torch.linalg.solve_triangular(M, R, upper=False, unitriangular=True)
        Ae = a if terms.eEnd is None else a * terms.eEnd  # a * exp(G_C - G)
        return DplrTerms(
            W=torch.cat([torch.zeros_like(Bd), -X[..., V:]], dim=-2),  # [n, P, 2C, K]
            U0=torch.cat([terms.v, X[..., :V]], dim=-2),  # [n, P, 2C, V]
            Ke=torch.cat([terms.Ke, Ae], dim=-2),  # [n, P, 2C, K]
            A_qk=None if terms.q is None else torch.cat([terms.A_qk, P_a.As[1]], dim=-1),
            b_up=b_up, A_bk=A_bk, Bd=Bd, M=M, X=X, Ae=Ae, eGx=eGx, P_bk=P_bk, P_a=P_a,
        )  # fmt: skip

    def pseudo_value_backward(self, terms, dU: Tensor, S: Tensor) -> tuple:
        """(dv, dBd, dA_bk, dA_ba) from dU = [dU_v; dU_b] [n, P, 2C, V] and the states S entering
        the chunks [n, P, K, V].

        U_b = X_v + X_b S (U0_b = X_v, W_b = -X_b) with X = M^{-1} [A_bk V | Bd], M = I - A_ba:
        dX = [dU_b | dU_b S^T], dR = M^{-T} dX (one solve), dA_ba = -dM = dR X^T and
        dA_bk = dR_v V^T (both strictly lower), dv = dU_v + A_bk^T dR_v, dBd = dR_b.
        """
        own = terms.own
        C, V = terms.k.shape[-2], terms.v.shape[-1]
        dU_v, dU_b = dU[..., :C, :], dU[..., C:, :]
        dX = torch.cat([dU_b, dU_b @ S.transpose(-1, -2)], dim=-1)  # [n, P, C, V + K]
        dR = torch.linalg.solve_triangular(
            own.M.transpose(-1, -2), dX, upper=True, unitriangular=True
        )
        dA_ba = (dR @ own.X.transpose(-1, -2)).tril_(-1)  # [n, P, C, C]
        dR_v = dR[..., :V]
        dA_bk = (dR_v @ terms.v.transpose(-1, -2)).tril_(-1)
        dv = dU_v + own.A_bk.transpose(-1, -2) @ dR_v
        return dv, dR[..., V:], dA_bk, dA_ba

    def gradients(self, terms, dQd, dA_q, dKe, dD, dU: Tensor, S: Tensor) -> tuple:
        """(dq, dk, dv, d[a | b], dg) from the gradients of the stacked terms
        (``Terms.gradients``): dA_q = [dA_qk | dA_qa] [n, P, C, 2C], dKe = [dKe; dAe]
        [n, P, 2C, K], dU [n, P, 2C, V].

        The products' gradients (``Products.backward``, their undecayed diagonals kept apart as
        the terms keep A_qk's), the shifts undone (A_bk[t] = P_bk[t - 1]: dP_bk = dA_bk moved up
        a row; b_up[t] = b[t + 1]: db = db_up moved down), and the gates: each product's share of
        dg over the pairs across each gate (``Products.gate_share``), plus Bd's exclusive gate
        (dG_{t-1} += dBd_t Bd_t) and Ae's share of the decays to the chunk's end (as Ke's).
        """
        own = terms.own
        C = terms.k.shape[-2]
        q, k, b_up = terms.q, terms.k, own.b_up
        a, _ = split(terms.beta)
        dA_qk, dA_qa = dA_q[..., :C], dA_q[..., C:]
        dKe_k, dAe = dKe[..., :C, :], dKe[..., C:, :]
        dv, dBd, dA_bk, dA_ba = self.pseudo_value_backward(terms, dU, S)
        dP_bk, dP_ba = _shift_up(dA_bk), _shift_up(dA_ba)
        diags = [terms.diagonal(x) for x in (dA_qk, dA_qa, dP_bk, dP_ba)]
        (dq,), dk = terms.products.backward([dA_qk])
        (db_up,), dk_b = own.P_bk.backward([dP_bk])
        (db_up_a, dq_a), da = own.P_a.backward([dP_ba, dA_qa])
        dq, dk, db_up = dq + dq_a, dk + dk_b, db_up + db_up_a
        dg = None
        if terms.mech.decays:
            dG = _shift_up(dBd * own.Bd)
            pairs = sum(p.gate_share for p in (terms.products, own.P_bk, own.P_a))
            _, d_qa, d_bk, d_ba = diags  # the diagonals: no decay, no share of dG
            dq, da = dq + d_qa * a, da + d_qa * q + d_ba * b_up
            dk, db_up = dk + d_bk * b_up, db_up + d_bk * k + d_ba * a
            da = da + dAe * terms.eEnd
            dG_ae = dAe * own.Ae  # Ae's share of the decays to the chunk's end
            dq, dk, dg = terms.gate_gradients(
                dq, dk, dG, diags[0], dQd, dKe_k, None, dD, dG_ae, pairs=pairs
            )
            db = _shift_down(db_up) + dBd * own.eGx
        else:
            dq, dk, da = dq + dQd, dk + dKe_k, da + dAe
            db = _shift_down(db_up) + dBd
        return dq, dk, dv, torch.cat([da, db], dim=-1), dg


RULE = DplrRule()
