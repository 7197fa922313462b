"""Batched block algebra of the fast chunk form: decayed masked products and the unit-lower inverse.

Blocks are laid out ``[..., C, D]`` with a cumulative log-gate ``G: [..., C, 1]`` (scalar decay)
or ``[..., C, K]`` (per channel), or ``None`` (no decay). The decay between tokens j <= i is
exp(G_i - G_j), never exp(G_i) * exp(-G_j) over the whole sequence.

Per-channel decay cannot leave the sum over channels, so the masked product
``A_ij = sum_c a_ic b_jc exp(G_ic - G_jc)`` needs a reference row r per block of tokens:
``(a_i exp(G_i - G_r)) (b_j exp(G_r - G_j))`` is the decayed term for every pair of the block, a
matrix product. Two ways to pick r:

- *Direct blocks.* r is the middle row of a block of F tokens, and the block's whole F x F product
  is one matrix product, masked afterwards. Rows before r evaluate positive exponents, so this is
  used only where the gate's spread inside the block keeps every exponent within
  ``factor_budget(dtype)`` (a quarter of the largest finite exponent: each factor is at most
  max^(1/4), no factor under- or overflows, and even the masked entries stay finite).
- *Halving.* A block of 2s tokens is two halves; its lower-left s x s quadrant is one matrix
  product with r = the first row of the lower half (``a_i exp(G_i - G_r)`` for i >= r,
  ``b_j exp(G_r - G_j)`` for j < r: both exponents <= 0), and the two diagonal halves recurse.
  All quadrants of one size are one batched product.

A group halves until its blocks' spread fits the budget, then takes direct products: with trained
gates the first block, the whole chunk, already fits (one product, as without decay); gates too
steep for that halve down to single tokens, every exponent then <= 0.

This is the one per-channel product algorithm of the library: the group loop, the all-blocks form
(``mode="parallel"``, double backward) and the affine maps take it through ``_chunk_terms``, and
the fused C++ loop computes the same halving under the same budget.

G may be float64 for float32 blocks (``_chunk_terms`` sums the gates in float64, ``gate_floor``):
every exponent is then a difference taken in float64 and rounded once to the blocks' dtype before
its exponential, so that it keeps float32's accuracy however large G grows (resets, steep gates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from linattn.ops.tuning import SMALL_QUADRANT


def _pad_pow2(x: Tensor, C2: int, value_last: bool = False) -> Tensor:
    """Pad the token axis (-2) of ``x`` to C2 rows: zeros, or copies of the last row."""
    C = x.shape[-2]
    if C == C2:
        return x
    if value_last:
        fill = x[..., -1:, :].expand(*x.shape[:-2], C2 - C, x.shape[-1])
    else:
        fill = x.new_zeros(*x.shape[:-2], C2 - C, x.shape[-1])
    return torch.cat([x, fill], dim=-2)


def _blocks(x: Tensor, F: int) -> Tensor:
    """x [..., C, D] as blocks of F tokens: [..., C / F, F, D] (a view)."""
    return x.unflatten(-2, (x.shape[-2] // F, F))


def _diagonal_blocks(X: Tensor, F: int) -> Tensor:
    """The F x F diagonal blocks of X [..., C, C] (a view): [..., C / F, F, F]."""
    m = X.shape[-1] // F
    blocks = X.unflatten(-1, (m, F)).unflatten(-3, (m, F))  # [..., m, F, m, F]
    return blocks.diagonal(dim1=-4, dim2=-2).movedim(-1, -3)  # [..., m, F, F]


def _quadrants(X: Tensor, s: int) -> Tensor:
    """The lower-left s x s quadrants of the 2s x 2s diagonal blocks of X [..., C, C] (a view).

    Returns [..., C / (2s), s, s].
    """
    return _diagonal_blocks(X, 2 * s)[..., s:, :s]


def _halves(x: Tensor, s: int) -> tuple[Tensor, Tensor]:
    """Lower and upper halves of the 2s-token blocks of x [..., C, D]: each [..., C/(2s), s, D]."""
    blocks = _blocks(x, 2 * s)  # [..., C / (2s), 2s, D]
    return blocks[..., s:, :], blocks[..., :s, :]


def _quadrant_product(a: Tensor, b: Tensor, s: int) -> Tensor:
    """a [..., s, K] times b [..., s, K] transposed: [..., s, s]."""
    if s <= SMALL_QUADRANT:  # batched matmuls of 1 x K x 1 blocks cost more than the arithmetic
        return (a.unsqueeze(-2) * b.unsqueeze(-3)).sum(-1)
    return a @ b.transpose(-1, -2)


def fresh(name: str, like: Tensor, shape: tuple[int, ...] | None = None) -> Tensor:
    """An uninitialised tensor like ``like``: the default of the ``buffers`` arguments here and in
    ``_chunk_terms``, whose ``Buffers`` hands the same memory to every group instead."""
    return like.new_empty(like.shape if shape is None else shape)


def differentiable(name: str, like: Tensor, shape: tuple[int, ...] | None = None) -> None:
    """The ``buffers`` of the terms that autograd records (the all-blocks form, the maps): no
    buffer, so every ``out=`` is None and every term a new tensor, and no exponential that a
    backward pass needs is scaled in place afterwards (``scaled``)."""
    return None


def scaled(e: Tensor, x: Tensor, buffers) -> Tensor:
    """e * x, into e (a fresh exponential) unless autograd needs e (``differentiable``)."""
    return e * x if buffers is differentiable else e.mul_(x)


def gate_floor(dtype: torch.dtype) -> float:
    """The floor of a log-gate: log of the smallest subnormal number, minus 1 (-104.3 in float32,
    -745.4 in float64).

    ``exp`` of anything at or below it is exactly 0 in ``dtype``, so flooring each gate changes no
    decay (nor the gradient, exp(g) * ... = 0 there too: the floor's is 0), and it maps a reset,
    g = -inf, to a finite number, so that no inf - inf appears. With the floor every sum of C gates
    is at least C times it, and a float64 sum of float32 gates keeps each to float32 accuracy.
    """
    info = torch.finfo(dtype)
    return math.log(info.tiny * info.eps) - 1.0


# The grid of the exact part of a float64 gate sum (``gate_sums``): partial sums of floored gates
# (each >= -745.5) stay multiples of it below 2^53 GRID = 2^27 for up to 180,000 tokens.
GRID = 2.0**-26


class GateSum(NamedTuple):
    """A cumulative log-gate G = hi + lo [..., C, 1|K] (``gate_sums``); lo is None where G is one
    float64 sum of float32 gates. A difference G_i - G_j is (hi_i - hi_j) + (lo_i - lo_j)
    (``minus``): hi's difference is exact, so it is rounded once however large G grows."""

    hi: Tensor
    lo: Tensor | None = None

    def map(self, f: Callable[[Tensor], Tensor]) -> GateSum:
        """f (a view: slicing, padding, blocks) applied to both parts."""
        return GateSum(f(self.hi), None if self.lo is None else f(self.lo))

    def value(self) -> Tensor:
        """G itself (rounded): for the exponentials of G alone, whose relative error is
        |G| eps, negligible wherever exp(G) is not."""
        return self.hi if self.lo is None else self.hi + self.lo

    def minus(self, other: GateSum) -> Tensor:
        """G - other (broadcast), a new float64 tensor."""
        difference = self.hi - other.hi
        return difference if self.lo is None else difference.add_(self.lo - other.lo)


def as_gate_sum(G: Tensor | GateSum) -> GateSum:
    """G as a ``GateSum`` (a plain tensor is its own hi)."""
    return G if isinstance(G, GateSum) else GateSum(G)


def gate_sums(g: Tensor) -> GateSum:
    """G = cumsum of the floored gates (``gate_floor``) along the tokens (-2), in float64.

    float32 gates: one float64 sum (each partial sum keeps float32's accuracy). float64
    gates: a plain float64 sum loses |G| eps in every difference G_i - G_j, which grows with the
    sequence after resets or steep gates (|G| reaches 745 a reset: 1e-12 at T = 1,000 in the
    parallel form). Compensated: hi = the gates rounded to multiples of ``GRID``, whose
    sums are exact, and lo = the remainders (each below GRID / 2), whose sum is small and rounds
    little; hi + lo is the sum to about 1e-16 |G_i - G_j| in every difference.
    """
    g = g.clamp(min=gate_floor(g.dtype))
    if g.dtype != torch.float64:
        return GateSum(torch.cumsum(g, dim=-2, dtype=torch.float64))
    hi = torch.round(g / GRID) * GRID  # exact: a power-of-two scaling and a rounding
    return GateSum(torch.cumsum(hi, dim=-2), torch.cumsum(g - hi, dim=-2))  # g - hi: exact


def exp_difference(
    x: Tensor | GateSum, y: Tensor | GateSum, dtype: torch.dtype, floor: float | None = None
) -> Tensor:
    """exp(x - y) in ``dtype``: the difference taken in x's dtype (float64 for float32 blocks;
    of both parts of a ``GateSum``), rounded once, then ``decay_exp_`` (a new tensor)."""
    difference = as_gate_sum(x).minus(as_gate_sum(y))
    return decay_exp_(difference.to(dtype), floor)


def subnormal_floor(dtype: torch.dtype) -> float:
    """log of the smallest normal number (-87.3 in float32): ``exp`` below it returns subnormals."""
    return math.log(torch.finfo(dtype).tiny)


def decay_exp_(x: Tensor, floor: float | None = None) -> Tensor:
    """exp of non-positive exponents, in place; with ``floor``, those below it give exact zeros.

    An exponent below ``subnormal_floor`` gives a subnormal number (or zero), which costs about 40
    times as much in ``exp`` and slows every product that takes it (GLA and KDA with steep gates
    would run several times slower than with gentle ones). Flushed to zero, such a decay changes
    the terms it scales by less than the smallest normal number times their other factors, far
    below the rounding of any term that is not itself negligible (what a CPU's flush-to-zero mode
    does, for these numbers only). The chunk terms pass a floor only for groups whose decay
    reaches it.
    """
    if floor is not None:
        x.masked_fill_(x < floor, -math.inf)
    return x.exp_()


def decay_exp(x: Tensor, floor: float | None = None, out: Tensor | None = None) -> Tensor:
    """``decay_exp_`` into a new tensor (or ``out``), x unchanged."""
    return torch.exp(x if floor is None else x.masked_fill(x < floor, -math.inf), out=out)


def factor_budget(dtype: torch.dtype) -> float:
    """The largest exponent a direct block may evaluate: log(max finite) / 4 (22.2 in float32)."""
    return math.log(torch.finfo(dtype).max) / 4


def direct_block_size(G: Tensor, dtype: torch.dtype | None = None) -> int:
    """The largest block size F (C, C / 2, ..., 2, or 1) whose direct products stay in budget.

    G [..., C, K] with C a power of two, non-increasing along the tokens; ``dtype``: that of the
    products (G's by default). A block of F tokens with reference row r = F / 2 evaluates
    exp(G_i - G_r) and exp(G_r - G_i) for every row i of the block; the largest of these exponents
    are G_first - G_r and G_r - G_last.

    Under torch.compile the gates are unknown while tracing, and a block size chosen from them
    would end the graph: F = 1 then (halving down to single tokens, every exponent <= 0, which
    suits any gate).
    """
    if torch.compiler.is_compiling():
        return 1
    budget = factor_budget(G.dtype if dtype is None else dtype)
    F = G.shape[-2]
    while F > 1:
        blocks = _blocks(G, F)  # [..., C / F, F, K]
        ref = blocks[..., F // 2, :]
        widest = torch.maximum(blocks[..., 0, :] - ref, ref - blocks[..., -1, :]).max()
        if widest.item() <= budget:
            return F
        F //= 2
    return 1


class ChannelProducts:
    """A_p = sum_c a_p,ic b_jc exp(G_ic - G_jc) for several left factors a_p and one right b.

    A_p is causal (j <= i), or strictly causal (j < i) where ``strict[p]``. All tensors are
    [..., C, K]. Blocks of ``self.F`` tokens (``direct_block_size``) are direct products; the
    quadrants between them come from halving (the module docstring). The exponentials are shared by
    the products (A_qk and A_kk of the delta rule have the same k on the right). Nothing of a level
    is kept: the forward pass scales in place and the backward pass computes the level again.
    The tensors a kept level needs cost more than its exponentials: every one is fresh memory
    whose pages fault in.
    """

    def __init__(
        self,
        lefts: list[Tensor],
        b: Tensor,
        G: Tensor,
        strict: list[bool],
        buffers=fresh,
        floor: float | None = None,
        gates: Tensor | None = None,
    ) -> None:
        self.C, self.strict = b.shape[-2], strict
        self.buffers = buffers  # where the exponentials and products go (``fresh`` or reused)
        self.floor = floor  # of the halving's exponents (``decay_exp_``)
        C2 = 1 << max(0, (self.C - 1).bit_length())  # next power of two
        self.lefts = [_pad_pow2(a, C2) for a in lefts]
        self.b = _pad_pow2(b, C2)
        # g = 0 on padding: no wider spread
        self.G = as_gate_sum(G).map(lambda x: _pad_pow2(x, C2, value_last=True))
        self.dtype = b.dtype  # of the products; G may be float64 (the module docstring)
        self.gate_share = None  # the gates' share of the products' gradient (``backward``)
        # ``gates`` (autograd records the products): the floored g that G sums. The halving's
        # exponents are then sums of the gates each holds (``_level``), and no block is direct
        # (F = 1: each pair in one quadrant), so that autograd gives each gate the shares of the
        # pairs across it alone (``pair_crossings``).
        self.gates = None if gates is None else _pad_pow2(gates.to(torch.float64), C2)
        self.F = 1 if gates is not None else direct_block_size(self.G.value(), self.dtype)
        if self.F == C2:  # the whole block in one product per left factor
            a_s, b_s = self._direct()
            shape = (*self.b.shape[:-1], C2)  # [..., C2, C2]
            As = [
                torch.matmul(a, b_s.transpose(-1, -2), out=self.buffers(f"A{p}", a, shape))
                for p, a in enumerate(a_s)
            ]
        else:
            # Every entry on or below the diagonal is written below; tril_ clears the rest.
            As = [b.new_empty(*self.b.shape[:-1], C2) for _ in lefts]
            for s in self._sizes():
                e_low, e_up, a_lows, b_up = self._level(s)
                b_s = scaled(e_up, b_up, self.buffers)
                a_s = [a * e_low for a in a_lows[:-1]] + [scaled(e_low, a_lows[-1], self.buffers)]
                for A, a in zip(As, a_s, strict=True):
                    _quadrants(A, s).copy_(_quadrant_product(a, b_s, s))
            if self.F > 1:
                a_s, b_s = self._direct()
                for A, a in zip(As, a_s, strict=True):
                    _diagonal_blocks(A, self.F).copy_(_blocks(a, self.F) @ _blocks(b_s, self.F).mT)
            else:
                for A, a, strictly in zip(As, self.lefts, strict, strict=True):
                    if not strictly:
                        A.diagonal(dim1=-2, dim2=-1).copy_((a * self.b).sum(-1))
        for A, strictly in zip(As, strict, strict=True):
            A.tril_(-1 if strictly else 0)
        self.As = [A[..., : self.C, : self.C] for A in As]

    def _sizes(self, F: int | None = None) -> list[int]:
        """The halving levels: quadrants of s x s for s = F, 2 F, 4 F, ... below the padded C
        (F: ``self.F`` by default)."""
        F, C2 = self.F if F is None else F, self.b.shape[-2]
        return [F << i for i in range(max(0, (C2 // F - 1).bit_length()))]

    def _level(self, s: int) -> tuple[Tensor, Tensor, list[Tensor], Tensor]:
        """exp(G_i - G_r) on the lower halves, exp(G_r - G_j) on the upper halves (r: the first
        row of the lower half, so both exponents are <= 0), the lefts' lower halves and b's upper
        halves, for the 2s-token blocks: each [..., C / (2s), s, K]."""
        lefts, b_up = [_halves(a, s)[0] for a in self.lefts], _halves(self.b, s)[1]
        if self.gates is not None:  # sum_{r < m <= i} g_m and sum_{j < m <= r} g_m
            g_low, g_up = _halves(self.gates, s)
            low = torch.cat([torch.zeros_like(g_low[..., :1, :]), g_low[..., 1:, :]], dim=-2)
            up = torch.cat([g_up[..., 1:, :], g_low[..., :1, :]], dim=-2)
            up = torch.flip(torch.cumsum(torch.flip(up, dims=(-2,)), dim=-2), dims=(-2,))
            e_low = decay_exp(torch.cumsum(low, dim=-2).to(self.dtype), self.floor)
            return e_low, decay_exp(up.to(self.dtype), self.floor), lefts, b_up
        G_low, G_up = (self.G.map(lambda x, i=i: _halves(x, s)[i]) for i in (0, 1))
        ref = G_low.map(lambda x: x[..., :1, :])  # [..., m, 1, K]
        e_low = exp_difference(G_low, ref, self.dtype, self.floor)  # rows at or after r
        e_up = exp_difference(ref, G_up, self.dtype, self.floor)  # rows before r
        return e_low, e_up, lefts, b_up

    def _direct_exponentials(self) -> tuple[Tensor, Tensor]:
        """exp(G_i - G_r) and exp(G_r - G_i) for every row i, r the middle row of i's F-block
        (both within ``factor_budget``): each [..., C, K]."""
        F = self.F
        G = self.G.map(lambda x: _blocks(x, F))  # [..., C / F, F, K]
        ref = G.map(lambda x: x[..., F // 2 : F // 2 + 1, :])
        if G.hi.dtype != self.dtype or G.lo is not None:  # float64 sums: rounded once, then exp
            e_a = exp_difference(G, ref, self.dtype).flatten(-3, -2)
            e_b = exp_difference(ref, G, self.dtype).flatten(-3, -2)
            return e_a, e_b
        G, ref = G.hi, ref.hi
        e_a = torch.sub(G, ref, out=self.buffers("e_a", G)).exp_().flatten(-3, -2)
        e_b = torch.sub(ref, G, out=self.buffers("e_b", G)).exp_().flatten(-3, -2)
        return e_a, e_b

    def _direct(self) -> tuple[list[Tensor], Tensor]:
        """The lefts times exp(G_i - G_r), b times exp(G_r - G_j) (``_direct_exponentials``)."""
        e_a, e_b = self._direct_exponentials()
        a_s = [a * e_a for a in self.lefts[:-1]] + [scaled(e_a, self.lefts[-1], self.buffers)]
        return a_s, scaled(e_b, self.b, self.buffers)

    def backward(self, dAs: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """([da_p], db) for upstream gradients dA_p [..., C, C] (only the causal parts count),
        and the gates' share of them in ``gate_share`` [..., C, K] (a term of dg itself).

        The gates' share: each pair (i, j) holds g_m for j < m <= i in its exponent, and its share
        goes to those gates alone (as ``pair_crossings``): a quadrant of the halving with
        reference row r has alpha_i = a_i da_i (its rows i >= r) and beta_j = b_j db_j (j < r);
        g_m gets sum_{i >= m} alpha_i for m > r, sum_{j < m} beta_j for m <= r. The pairs of the
        direct blocks are taken by the halving's levels inside the blocks, for this share alone.
        As a da - b db summed into G, the pairs on both sides of a gate would cancel in float32,
        and an undecayed one (a run of zero gates) swamp the dg of a steep gate.
        """
        pad = self.b.shape[-2] - self.C
        dAs = [torch.nn.functional.pad(dA, (0, pad, 0, pad)) if pad else dA for dA in dAs]
        das = [torch.zeros_like(a) for a in self.lefts]
        db = torch.zeros_like(self.b)
        share = torch.zeros_like(self.b)
        for s in self._sizes(1):
            e_low, e_up, a_lows, b_up = self._level(s)
            b_s = b_up * e_up
            db_s = alpha = 0
            for dA, da, a_low in zip(dAs, das, a_lows, strict=True):
                a = a_low * e_low
                dQ = _quadrants(dA, s)  # [..., m, s, s]
                if s <= SMALL_QUADRANT:
                    da_s = (dQ.unsqueeze(-1) * b_s.unsqueeze(-3)).sum(-2) * e_low
                    db_s = db_s + (dQ.unsqueeze(-1) * a.unsqueeze(-2)).sum(-3)
                else:
                    da_s = (dQ @ b_s) * e_low
                    db_s = db_s + dQ.transpose(-1, -2) @ a
                alpha = alpha + a_low * da_s
                if s >= self.F:
                    _halves(da, s)[0].add_(da_s)
            db_s = db_s * e_up
            if s >= self.F:
                _halves(db, s)[1].add_(db_s)
            _level_share(share, s, alpha, b_up * db_s)
        self.gate_share = share[..., : self.C, :]
        if self.F > 1:
            # The direct blocks: their upstream gradient masked to the causal part, then
            # da = (dA b~) e_a and db = (dA^T a~) e_b blockwise.
            F = self.F
            e_a, e_b = self._direct_exponentials()
            b_s = _blocks(self.b * e_b, F)  # [..., C / F, F, K]
            db_s = 0
            for dA, da, a, strictly in zip(dAs, das, self.lefts, self.strict, strict=True):
                dQ = _diagonal_blocks(dA, F).tril(-1 if strictly else 0)  # [..., C / F, F, F]
                da.add_((dQ @ b_s).flatten(-3, -2).mul_(e_a))
                db_s = db_s + dQ.mT @ _blocks(a * e_a, F)
            db.add_(db_s.flatten(-3, -2).mul_(e_b))
        else:
            for dA, da, a, strictly in zip(dAs, das, self.lefts, self.strict, strict=True):
                if not strictly:
                    diag = dA.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
                    da.add_(diag * self.b)
                    db.add_(diag * a)
        return [da[..., : self.C, :] for da in das], db[..., : self.C, :]


def _level_share(share: Tensor, s: int, alpha: Tensor, beta: Tensor) -> None:
    """Add the gates' share of one halving level to ``share`` [..., C, K] (``ChannelProducts.
    backward``): alpha [..., m, s, K] of the lower halves' rows, beta of the upper halves'."""
    low, up = _halves(share, s)
    after = torch.flip(torch.cumsum(torch.flip(alpha, dims=(-2,)), dim=-2), dims=(-2,))
    low[..., 1:, :] += after[..., 1:, :]  # m > r: sum_{i >= m} alpha_i
    before = torch.cumsum(beta, dim=-2)
    low[..., :1, :] += before[..., -1:, :]  # m = r: every pair
    up[..., 1:, :] += before[..., :-1, :]  # m < r: sum_{j < m} beta_j


def scalar_decay(
    G: Tensor | GateSum,
    out: Tensor | None,
    floor: float | None = None,
    dtype: torch.dtype | None = None,
    gates: Tensor | None = None,
) -> Tensor:
    """exp(G_i - G_j) on j <= i, 0 above the diagonal; G [..., C, 1] -> out [..., C, C].

    The exponent is cut to 0 above the diagonal before the exponential (``tril_``), so none is
    evaluated above 0, and the result is cut to 0 there after it. ``floor``: see ``decay_exp_``.
    G may be float64 for a float32 ``out``: the differences are then taken in float64 and rounded
    once (the module docstring). ``out`` None (``differentiable``): new tensors in ``dtype``, none
    changed in place after its exponential; with ``gates`` (the floored g that G sums), the
    gradient goes to them by ``PairDecay``.
    """
    G = as_gate_sum(G)
    Gt = G.map(lambda x: x.transpose(-1, -2))
    if out is None:
        if gates is not None:  # the value from G, its gradient to the gates (``PairDecay``)
            with torch.no_grad():
                decay = scalar_decay(G.map(Tensor.detach), None, floor, dtype)
            return PairDecay.apply(gates, decay)
        exponents = torch.tril(G.minus(Gt)).to(dtype)  # [..., C, C]
        return torch.tril(decay_exp_(exponents, floor))
    if G.hi.dtype == out.dtype and G.lo is None:
        torch.sub(G.hi, Gt.hi, out=out)
    else:
        out.copy_(G.minus(Gt))
    return decay_exp_(out.tril_(), floor).tril_()


def pair_crossings(X: Tensor) -> Tensor:
    """sum_{i >= m > j} X_ij for every row m of X [..., C, C]: [..., C, 1].

    The gradient of one log-gate per token from the decays exp(G_i - G_j) of a product's pairs
    (X_ij = dA_ij A_ij): g_m is in the exponent of the pairs across it, j < m <= i. Formed as
    the row sums of G_i's shares less the column sums of G_j's, then summed over m (dg = reversed
    cumsum of dG), every pair on both sides of m would cancel in float32 (exactly, not in its
    rounding): a pair inside a run of zero gates (DeltaProduct's writes of one token) is
    undecayed, its share of order one, and it swamps the dg of a steep gate elsewhere, which is
    of order exp(g). Summed over the pairs across m alone, dg keeps its own relative accuracy.
    """
    Y = X.flip(-2).cumsum(-2).flip(-2)  # Y_mj = sum_{i >= m} X_ij
    return Y.tril(-1).sum(-1, keepdim=True)


class PairDecay(torch.autograd.Function):
    """exp(G_i - G_j) on j <= i for autograd (``scalar_decay``'s all-blocks form), whose gradient
    goes to the gates g themselves by ``pair_crossings``, not through G = cumsum(g).

    forward(g, decay): ``decay`` is the value (formed from G as ``scalar_decay`` forms it), g
    [..., C, 1] the floored gates it is a function of. The output is saved, so that the backward
    pass (differentiable ops of it) is itself differentiable for double backward.
    """

    @staticmethod
    def forward(ctx, g: Tensor, decay: Tensor) -> Tensor:  # noqa: D102
        out = decay.clone()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, d_decay: Tensor) -> tuple[Tensor, None]:  # noqa: D102
        (decay,) = ctx.saved_tensors
        return pair_crossings(d_decay * decay), None


def sums_after(g: Tensor) -> Tensor:
    """sum_{m > i} g_m for every row i of g [..., C, K], in float64: the exponent of exp(G_C -
    G_i) as a sum of the gates it holds, so that autograd's gradient of each gate is the sum of
    the shares of the rows before it (each a term across it), not G_C's share less G_i's (which
    cancel for the rows after a run of zero gates, as ``pair_crossings`` says)."""
    g = g.to(torch.float64)
    after = torch.flip(torch.cumsum(torch.flip(g, dims=(-2,)), dim=-2), dims=(-2,))
    return torch.cat([after[..., 1:, :], torch.zeros_like(after[..., :1, :])], dim=-2)


def unit_lower_inverse(A: Tensor, out: Tensor | None = None) -> Tensor:
    """(I + L)^{-1} for unit-lower-triangular A [..., C, C]: one batched triangular solve.

    The explicit inverse serves twice: W and U0 are one product with it, and the backward pass
    needs its transpose (dR = A^{-T} dX). Measured on this CPU, a batched solve against the
    identity costs about one product of the same blocks; the doubling of blocks (two batched
    products per level) and a row-by-row substitution both cost more.
    """
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device).expand_as(A)
    return torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True, out=out)


class _UnitLowerInverse(torch.autograd.Function):
    """Y = (I + N)^{-1} of a strictly lower N, differentiated by products: dN = -tril(Y^T dY
    Y^T, -1) (the diagonal and the upper triangle are implied, so they get no gradient)."""

    @staticmethod
    def forward(ctx, N: Tensor) -> Tensor:
        Y = unit_lower_inverse(N)
        ctx.save_for_backward(Y)
        return Y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dY: Tensor) -> Tensor:
        (Y,) = ctx.saved_tensors
        Yt = Y.transpose(-1, -2)
        return -(Yt @ dY @ Yt).tril_(-1)


def unit_lower_inverse_of_strict(N: Tensor) -> Tensor:
    """(I + N)^{-1} for a strictly lower N [..., C, C] (its diagonal and upper triangle are
    read as the identity's): ``unit_lower_inverse`` whose backward is two batched products
    (dN = -tril(Y^T dY Y^T, -1) with Y the inverse) instead of a second triangular solve.
    Differentiable once."""
    return _UnitLowerInverse.apply(N)
