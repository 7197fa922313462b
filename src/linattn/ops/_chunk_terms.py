"""The state-independent terms of a batch of chunks, and their gradients (spec sections 5.1, 8).

A batch is n chunks of C tokens of all P = B HV heads, laid out ``[n, P, C, D]`` (``_layout``).
With G the cumulative log-gate inside each chunk (``[n, P, C, 1|K]``, or None without decay):

    Qd = q * exp(G)            Kd = k * exp(G)            Ke = k * exp(G_C - G)     D = exp(G_C)
    A_qk = decayed tril(q k^T) (j <= i), and the rule's own products (the delta rule's A_kk)
    W, U0: the rule's pseudo-value terms (U = U0 - W S; ``rules``), with its own in ``own``

The loop that uses them (U, then S_next = D S + Ke^T U, then O = Qd S + A_qk U) is ``chunk``'s;
the terms are the same for the group loop (reused ``Buffers``), the all-blocks form
(``differentiable``: new tensors that autograd records) and the affine maps (no q: no output
terms). Which terms exist is decided by the ``Mechanism`` (rule and gate), resolved once at the
public op. Where each is computed:

    G, exp(G), exp(G_C - G), D, Qd, Kd, Ke        Terms._gates
    A_qk and the rule's products                  Products: _blockmath.scalar_decay (gate per
                                                  head), _blockmath.ChannelProducts (per channel)
    I + L, (I + L)^{-1}, W, U0 (UT transform)     rules.delta.pseudo_value_terms
    dplr's A_bk, A_ba, A_qa, W, U0, stacked       rules.dplr.pseudo_value_terms (its products:
    Ke = [Ke; Ae], A_q = [A_qk | A_qa]            Terms.decayed_products)
    their gradients                               Terms.gradients (the gates, the products), the
                                                  rule's pseudo_value_backward (a STACKED rule's
                                                  gradients, with Terms.gate_gradients)

The gates' exponents here are <= 0 (G_i and G_C - G_i are sums of gates, g <= 0); the per-channel
products bound theirs by ``_blockmath.factor_budget`` instead (see there). Each gate is floored at
``_blockmath.gate_floor`` (its decay is exactly 0 there; a reset, g = -inf, becomes finite) and G
is summed in float64, every exponent a float64 difference rounded once to the compute dtype: a
float32 G would lose the small gates after a large one. float64 gates are summed
compensated (``_blockmath.gate_sums``: an exact part and a remainder), so that the differences
keep float64's accuracy however large G grows after resets or steep gates (docs/design.md,
"Gates").
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops._blockmath import (
    ChannelProducts,
    decay_exp,
    differentiable,
    exp_difference,
    fresh,
    gate_floor,
    gate_sums,
    pair_crossings,
    scalar_decay,
    subnormal_floor,
    sums_after,
)
from linattn.ops.mechanism import Mechanism


class Buffers:
    """Named tensors that one group hands on to the next, so that the terms of every group (gates,
    products, inverse, right-hand sides) are written into the same memory: a fresh tensor per group
    is fresh pages (their faults cost more than the arithmetic on them) once glibc has returned the
    previous group's to the system. Valid while one group's ``Terms`` are in use; the next group
    overwrites them. Called as ``buffers(name, like, shape=None)``, as ``_blockmath.fresh``.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, Tensor] = {}

    def __call__(self, name: str, like: Tensor, shape: torch.Size | None = None) -> Tensor:
        shape = like.shape if shape is None else shape
        t = self.tensors.get(name)
        if t is None or t.shape != shape or t.dtype != like.dtype:
            t = self.tensors[name] = like.new_empty(shape)
        return t


class Products:
    """Decayed causal products of several left factors by one right factor, with gradients.

    A_p[i, j] = sum_c a_p,ic b_jc exp(G_ic - G_jc) for j <= i (j < i where ``strict[p]``), else 0:
    A_qk (a = q) and A_kk (a = k, strict) share b = k and the decay. G: None, [..., C, 1] or
    [..., C, K], as the mechanism's ``gate`` says. ``groups``: the factors' heads come in runs of
    ``groups`` equal ones (q and k broadcast over grouped value heads), so that without a gate per
    channel
    the undecayed product a b^T is formed once per group (``shared_product``).
    """

    def __init__(
        self,
        lefts: list[Tensor],
        b: Tensor,
        G: Tensor | None,
        strict: list[bool],
        gate: str,
        buffers=fresh,
        floor: float | None = None,
        groups: int = 1,
        gates: Tensor | None = None,
    ):
        self.lefts, self.b, self.strict = lefts, b, strict
        self.channel = self.decay = self.gate_share = None
        if gate == "channel":
            self.channel = ChannelProducts(lefts, b, G, strict, buffers, floor, gates)
            self.As = self.channel.As
            return
        C = b.shape[-2]
        shape = (*b.shape[:-1], C)  # [..., C, C]
        if gate == "head":  # [..., C, C], zero above the diagonal
            out = buffers("decay", b, shape)
            self.decay = scalar_decay(G, out=out, floor=floor, dtype=b.dtype, gates=gates)
        self.As = []
        for p, (a, strictly) in enumerate(zip(lefts, strict, strict=True)):
            P = shared_product(a, b, groups, buffers(f"A{p}", a, shape))
            if self.decay is not None:
                P.mul_(self.decay)  # zero above the diagonal
            self.As.append(P.tril_(-1) if strictly else P if self.decay is not None else P.tril_())

    def backward(self, dAs: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """([da_p], db) for the upstream gradients dA_p (only their causal parts are used).

        The dA_p are fresh tensors of the caller's: masked (and decayed) in place. With one gate
        per head, the gates' share is kept in ``gate_share`` [..., C, 1] (``pair_crossings``: a
        term of dg itself, not of dG), which the factors' a da - b db no longer carry to dG; with
        one per channel, [..., C, K] (``ChannelProducts.backward``).
        """
        if self.channel is not None:
            das, db = self.channel.backward(dAs)
            self.gate_share = self.channel.gate_share
            return das, db
        if self.decay is not None:
            X = sum(dA * A for dA, A in zip(dAs, self.As, strict=True))
            self.gate_share = pair_crossings(X)
        das, db = [], None
        for dA, a, strictly in zip(dAs, self.lefts, self.strict, strict=True):
            dP = dA.tril_(-1 if strictly else 0) if self.decay is None else dA.mul_(self.decay)
            if strictly and self.decay is not None:
                dP.tril_(-1)
            das.append(dP @ self.b)
            # The first product starts db (no pass adding it to a zero); later ones add in place.
            if db is None:
                db = dP.transpose(-1, -2) @ a
            else:
                db.add_(dP.transpose(-1, -2) @ a)
        return das, db


def _prefixed(buffers: Buffers, prefix: str):
    """``buffers`` under names that start with ``prefix`` (beside the terms' own)."""
    return lambda name, like, shape=None: buffers(prefix + name, like, shape)


def shared_product(a: Tensor, b: Tensor, groups: int, out: Tensor | None) -> Tensor:
    """a b^T [..., P, C, C] for factors [..., P, C, K] whose heads come in runs of ``groups``
    equal ones (q and k of grouped value heads, broadcast): one product per run, copied to its
    heads (into ``out`` where given). groups = 1: the plain product."""
    if groups == 1:
        return torch.matmul(a, b.transpose(-1, -2), out=out)
    # [..., P, C, K] -> [..., P / groups, groups, C, K] -> each run's first [..., P / groups, C, K]
    a1, b1 = (x.unflatten(-3, (-1, groups))[..., 0, :, :] for x in (a, b))
    P1 = (a1 @ b1.transpose(-1, -2)).unsqueeze(-3)  # [..., P / groups, 1, C, C]
    if out is None:  # differentiable: a new [..., P / groups, groups, C, C] -> [..., P, C, C]
        return P1.expand(*P1.shape[:-3], groups, *P1.shape[-2:]).contiguous().flatten(-4, -3)
    out.unflatten(-3, (-1, groups)).copy_(P1)  # [..., P / groups, groups, C, C]
    return out


class Terms:
    """All state-independent terms of a group of chunks [n, P, C, D] (see the module docstring).

    ``buffers`` (``Buffers``) holds the terms from one group to the next; by default (``fresh``)
    every group's are new tensors; ``differentiable``: new tensors that autograd records.
    q None: the terms of the state alone (no Qd, A_qk), for the affine maps. ``groups``: q's and
    k's heads come in groups of that many equal ones (grouped value heads broadcast; ``Products``).
    The rule (``mech.rule``) adds its own products and its pseudo-value terms (W, U0).
    """

    def __init__(
        self,
        q: Tensor | None,
        k: Tensor,
        v: Tensor,
        beta: Tensor | None,
        g: Tensor | None,
        mech: Mechanism,
        buffers=fresh,
        groups: int = 1,
    ):
        self.q, self.k, self.v, self.beta, self.g = q, k, v, beta, g
        self.mech, self.rule, self.buffers = mech, mech.rule, buffers
        self.G = self.eG = self.eEnd = self.D = self.gates = None
        self.Qd, self.Ke = q, k
        self.Kd = k if self.rule.DECAYED_KEYS else None
        floor = self.floor = self._gates() if mech.decays else None
        # The decayed causal products with k on the right: A_qk (the outputs; none without q),
        # then the rule's own (the delta rule's A_kk).
        named = ((("q", False),) if q is not None else ()) + self.rule.PRODUCTS
        self.products = None
        if named:
            lefts = [getattr(self, name) for name, _ in named]
            strict = [strictly for _, strictly in named]
            self.products = Products(
                lefts, k, self.G, strict, mech.gate, buffers, floor, groups, self.gates
            )
        self.A_qk = None if q is None else self.products.As[0]  # [n, P, C, C]
        # The rule's own terms, typed (``rules.PseudoValueTerms``): U = U0 - W S, and a stacked
        # rule's write directions and scores in place of the keys' own.
        self.own = self.rule.pseudo_value_terms(self)
        self.W, self.U0 = self.own.W, self.own.U0
        if self.own.Ke is not None:
            self.Ke = self.own.Ke
        if self.own.A_qk is not None:
            self.A_qk = self.own.A_qk

    def decayed_products(self, lefts: list[Tensor], right: Tensor, prefix: str) -> Products:
        """A rule's own causal products (``Products``, j <= i) of ``lefts`` by ``right``, with
        this group's gates; their buffers' names start with ``prefix``. No grouped broadcast: a
        rule's vectors are per value head."""
        buffers = self.buffers
        if buffers not in (fresh, differentiable):
            buffers = _prefixed(self.buffers, prefix)
        strict = [False] * len(lefts)
        gate = self.mech.gate
        return Products(lefts, right, self.G, strict, gate, buffers, self.floor, gates=self.gates)

    def _gates(self) -> float | None:
        """G, exp(G), exp(G_C - G), D = exp(G_C) and Qd, Ke (and Kd where the rule reads it);
        returns the subnormal floor of the group's exponentials, or None where no decay of it
        reaches it."""
        q, k, g, buffers = self.q, self.k, self.g, self.buffers
        # The floored gates summed in float64, compensated for float64 gates (the module
        # docstring): [n, P, C, 1|K] as hi + lo.
        self.G = gate_sums(g)
        G_end = self.G.map(lambda x: x[..., -1:, :])  # [n, P, 1, 1|K]
        G_last = G_end.value()
        # Every exponent below is >= G_C (a sum of gates inside one chunk): only where a
        # chunk's whole decay reaches the subnormal range are any flushed (``decay_exp_``).
        # Under torch.compile the gates are unknown while tracing: no floor (the same decays, the
        # subnormal ones kept; a data-dependent branch would end the graph).
        floor = subnormal_floor(g.dtype)
        if torch.compiler.is_compiling() or not G_last.min().item() < floor:
            floor = None
        self.eG = decay_exp(self.G.value().to(g.dtype), floor, out=buffers("eG", g))  # <= 1
        if buffers is differentiable:
            # Autograd differentiates the exponents: G_C - G_i would give each gate G_C's share
            # less G_i's (``_blockmath.sums_after``), and G_i - G_j likewise (``PairDecay``).
            self.gates = g.clamp(min=gate_floor(g.dtype))
            self.eEnd = decay_exp(sums_after(self.gates).to(g.dtype), floor)
        else:
            self.eEnd = exp_difference(G_end, self.G, g.dtype, floor)
        self.D = decay_exp(G_last.to(g.dtype), floor).transpose(-1, -2)  # [n, P, 1|K, 1]
        self.Qd = None if q is None else torch.mul(q, self.eG, out=buffers("Qd", q))
        self.Ke = torch.mul(k, self.eEnd, out=buffers("Ke", k))
        if self.rule.DECAYED_KEYS:  # the rule's right-hand side (the additive rule skips the pass)
            self.Kd = torch.mul(k, self.eG, out=buffers("Kd", k))
        return floor

    def gradients(
        self, dQd: Tensor, dA_qk: Tensor, dKe: Tensor, dD: Tensor | None, dU: Tensor, S: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
        """(dq, dk, dv, dbeta, dg) from the gradients of Qd, A_qk, Ke, D (rows) and U.

        dA_qk: a fresh tensor (masked in place). dD: [n, P, 1|K, 1] or None. S: the states
        entering the chunks [n, P, K, V] (the rule's backward reads them). A rule whose chunk
        writes along stacked directions (``STACKED``: dplr's A_q = [A_qk | A_qa], Ke = [Ke; Ae])
        takes its stacked gradients itself (``rule.gradients``), with ``diagonal``,
        ``products.backward`` and ``gate_gradients`` from here.
        """
        if self.rule.STACKED:
            return self.rule.gradients(self, dQd, dA_qk, dKe, dD, dU, S)
        diag = self.diagonal(dA_qk)
        dv, dbeta, dKd, dAs = self.rule.pseudo_value_backward(self, dU, S)
        (dq, *das), dk = self.products.backward([dA_qk, *dAs])
        # The decay inside the products has its share in ``gate_share``, a term of dg itself
        # (``Products.backward``), not of dG.
        grads = {"q": dq, "k": dk}
        for (name, _), da in zip(self.rule.PRODUCTS, das, strict=True):
            grads[name] = grads[name] + da
        dq, dk = grads["q"], grads["k"]
        if not self.mech.decays:
            # dq and dk are fresh products here: accumulate in place (no new tensors).
            dq.add_(dQd)
            dk.add_(dKe)
            if dKd is not None:
                dk.add_(dKd)
            return dq, dk, dv, dbeta, None
        share = self.products.gate_share
        dq, dk, dg = self.gate_gradients(dq, dk, None, diag, dQd, dKe, dKd, dD, pairs=share)
        return dq, dk, dv, dbeta, dg

    def diagonal(self, dA: Tensor) -> Tensor | None:
        """The diagonal of an inclusive product's gradient dA [n, P, C, C], taken out of it (set
        to 0 in place) as [n, P, C, 1]; None without a gate (nothing taken).

        The diagonal (no decay) is kept out of the products' backward and added to the factors'
        gradients alone: its shares of a da and b db in dG cancel, and their rounding would
        swamp the small dg of steep gates."""
        if not self.mech.decays:
            return None
        diag = dA.diagonal(dim1=-2, dim2=-1)
        diag, _ = diag.unsqueeze(-1).clone(), diag.zero_()  # [n, P, C, 1]
        return diag

    def gate_gradients(
        self, dq, dk, dG, diag, dQd, dKe, dKd, dD, dG_more: Tensor | None = None, pairs=None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The gates: Qd = q e^G, Kd = k e^G, Ke = k e^(G_C - G), D = e^(G_C); (dq, dk, dg).

        dKe: the keys' rows [n, P, C, K]; ``dG_more``: a stacked rule's own share of the gates
        that decay to the chunk's end, as Ke's (dplr's Ae = a e^(G_C - G)), or None. dG: a
        rule's own share of G, or None; ``pairs``: the products' share of g itself (their
        ``gate_share`` summed), or None."""
        C = self.k.shape[-2]
        dq = dq + diag * self.k + dQd * self.eG
        dk = dk + diag * self.q + dKe * self.eEnd
        dG = dQd * self.Qd if dG is None else dG + dQd * self.Qd
        # Ke_i depends on the gates after i only: its share is a prefix sum (below), not G_C's
        # share less G_i's, whose rounding would be that of the undecayed Ke_C.
        dG_ke = dKe * self.Ke[..., :C, :]  # the keys' rows (a stacked rule's Ke has more)
        if dG_more is not None:
            dG_ke = dG_ke + dG_more
        if dKd is not None:
            dk = dk + dKd * self.eG
            dG = dG + dKd * self.Kd
        if self.mech.gate == "head":  # scalar decay: one gate per token, shared by the channels
            dG, dG_ke = dG.sum(-1, keepdim=True), dG_ke.sum(-1, keepdim=True)
        if dD is not None:
            dG[..., -1:, :] += (dD * self.D).transpose(-1, -2)  # [n, P, 1, 1|K]
        # G = cumsum(g): dg_i = sum_{l >= i} dG_l (a reversed cumulative sum inside the chunk)
        # plus Ke's share sum_{l < i}; a floored gate has the floor's gradient, 0 (``gate_floor``).
        dg = torch.flip(torch.cumsum(torch.flip(dG, dims=(-2,)), dim=-2), dims=(-2,))
        dg[..., 1:, :] += torch.cumsum(dG_ke[..., :-1, :], dim=-2)
        if pairs is not None:
            dg += pairs
        return dq, dk, dg.masked_fill_(self.g <= gate_floor(self.g.dtype), 0.0)
