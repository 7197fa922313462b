"""Batched block algebra of the fast chunk form: decayed masked products and the unit-lower inverse.

Blocks are laid out ``[..., C, D]`` with a cumulative log-gate ``G: [..., C, 1]`` (scalar decay)
or ``[..., C, K]`` (per channel), or ``None`` (no decay). Every exponent evaluated is <= 0 (spec
section 8 with decay; DESIGN.md): the decay between tokens j <= i is exp(G_i - G_j), never
exp(G_i) * exp(-G_j).

Per-channel decay cannot leave the sum over channels, so the masked product
``A_ij = sum_c a_ic b_jc exp(G_ic - G_jc)`` is built by halving: a block of 2s tokens is two halves;
its lower-left s x s quadrant is one matrix product with the reference index r = the first row of
the lower half (``a_i exp(G_i - G_r)`` for i >= r, ``b_j exp(G_r - G_j)`` for j < r: both exponents
<= 0), and the two diagonal halves recurse. All quadrants of one size are one batched product, so
a block of C tokens takes log2(C) batched products and no token loop.
"""

from __future__ import annotations

import torch
from torch import Tensor


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


def _quadrants(X: Tensor, s: int) -> Tensor:
    """The lower-left s x s quadrants of the 2s x 2s diagonal blocks of X [..., C, C] (a view).

    Returns [..., C / (2s), s, s].
    """
    C = X.shape[-1]
    m = C // (2 * s)
    blocks = X.unflatten(-1, (m, 2 * s)).unflatten(-3, (m, 2 * s))  # [..., m, 2s, m, 2s]
    diag = blocks.diagonal(dim1=-4, dim2=-2)  # [..., 2s, 2s, m]
    return diag.movedim(-1, -3)[..., s:, :s]  # [..., m, s, s]


def _halves(x: Tensor, s: int) -> tuple[Tensor, Tensor]:
    """Lower and upper halves of the 2s-token blocks of x [..., C, D]: each [..., C/(2s), s, D]."""
    v = x.unflatten(-2, (x.shape[-2] // (2 * s), 2, s))  # [..., m, 2, s, D]
    return v[..., 1, :, :], v[..., 0, :, :]


class ChannelProducts:
    """A_ij = sum_c a_ic b_jc exp(G_ic - G_jc), j <= i (j < i if strict), and its gradient.

    a, b, G: [..., C, K]. Keeps the scaled factors of each halving level for the backward pass.
    """

    def __init__(self, a: Tensor, b: Tensor, G: Tensor, strict: bool) -> None:
        self.C, self.strict = a.shape[-2], strict
        C2 = 1 << max(0, (self.C - 1).bit_length())  # next power of two
        a, b = _pad_pow2(a, C2), _pad_pow2(b, C2)
        G = _pad_pow2(G, C2, value_last=True)  # g = 0 on padding: G stays, exponents stay <= 0
        self.a, self.b, self.levels = a, b, []
        A = a.new_zeros(*a.shape[:-1], C2)
        s = 1
        while s < C2:
            a_low, _ = _halves(a, s)
            _, b_up = _halves(b, s)
            G_low, G_up = _halves(G, s)
            ref = G_low[..., :1, :]  # [..., m, 1, K]: the first row of the lower half
            e_low = torch.exp(G_low - ref)  # exponents <= 0 (rows at or after r)
            e_up = torch.exp(ref - G_up)  # exponents <= 0 (rows before r)
            a_s, b_s = a_low * e_low, b_up * e_up
            _quadrants(A, s).copy_(a_s @ b_s.transpose(-1, -2))
            self.levels.append((s, e_low, e_up, a_s, b_s))
            s *= 2
        if not strict:
            A.diagonal(dim1=-2, dim2=-1).copy_((a * b).sum(-1))
        self.A = A[..., : self.C, : self.C]

    def backward(self, dA: Tensor) -> tuple[Tensor, Tensor]:
        """(da, db) for an upstream gradient dA [..., C, C] (only its lower part is used)."""
        C2 = self.a.shape[-2]
        dA = torch.nn.functional.pad(dA, (0, C2 - self.C, 0, C2 - self.C))
        da, db = torch.zeros_like(self.a), torch.zeros_like(self.b)
        for s, e_low, e_up, a_s, b_s in self.levels:
            dQ = _quadrants(dA, s)  # [..., m, s, s]
            da_low, _ = _halves(da, s)
            _, db_up = _halves(db, s)
            da_low += (dQ @ b_s) * e_low
            db_up += (dQ.transpose(-1, -2) @ a_s) * e_up
        if not self.strict:
            diag = dA.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
            da += diag * self.b
            db += diag * self.a
        return da[..., : self.C, :], db[..., : self.C, :]


def causal_mask(C: int, strict: bool, like: Tensor) -> Tensor:
    """Boolean [C, C]: True where j <= i (j < i if strict)."""
    ones = torch.ones(C, C, dtype=torch.bool, device=like.device)
    return torch.tril(ones, -1 if strict else 0)


def scalar_decay(G: Tensor, strict: bool) -> Tensor:
    """exp(G_i - G_j) on j <= i (j < i if strict), 0 elsewhere; G [..., C, 1] -> [..., C, C].

    The exponent is masked to -inf before the exponential, so none is evaluated above 0.
    """
    diff = G - G.transpose(-1, -2)  # [..., C, C]
    mask = causal_mask(G.shape[-2], strict, G)
    return torch.exp(diff.masked_fill(~mask, float("-inf")))


def unit_lower_inverse(A: Tensor) -> Tensor:
    """(I + L)^{-1} for unit-lower-triangular A [..., C, C]: one batched triangular solve.

    The explicit inverse serves twice: W and U0 are one product with it, and the backward pass
    needs its transpose (dR = A^{-T} dX). Measured on this CPU, a batched solve against the
    identity costs about one product of the same blocks; the doubling of blocks (two batched
    products per level) and a row-by-row substitution both cost more.
    """
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device).expand_as(A)
    return torch.linalg.solve_triangular(A, eye, upper=False, unitriangular=True)
