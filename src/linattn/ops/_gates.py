"""Cumulative log-gates and decay masks inside a block of tokens (spec section 8, with decay).

Internal layout: tokens on axis -2, so a gate is ``g: [..., C, 1]`` (one decay per head, Mamba-2 /
Gated DeltaNet) or ``g: [..., C, K]`` (one per key channel, GLA / KDA); ``None`` means no decay.

With ``G_i = sum_{l <= i} g_l`` (the cumulative log-gate of the block), the decay between tokens
j <= i is ``exp(G_i - G_j)``. We never evaluate ``exp(G_i) * exp(-G_j)``: ``exp(-G_j)`` overflows on
long blocks with strong decay. Instead the *segment sums* ``G_i - G_j = sum_{j < l <= i} g_l`` are
formed directly (a cumulative sum over a masked copy of g, as in Mamba-2's ssd_minimal ``segsum``),
and masked to -inf above the diagonal *before* the exponential, so every exponent evaluated is <= 0
and no gradient flows through a masked entry.
"""

from __future__ import annotations

import torch
from torch import Tensor


def segment_sums(g: Tensor) -> Tensor:
    """out[..., i, j] = sum_{j < l <= i} g[..., l] for i >= j, and -inf for i < j.

    g: [..., C] -> [..., C, C]. Summing only the terms between j and i (rather than subtracting two
    cumulative sums) keeps the difference accurate when G itself is large.
    """
    C = g.shape[-1]
    ones = torch.ones(C, C, dtype=torch.bool, device=g.device)
    # x[..., i, l] = g[..., i] for i > l, else 0; cumsum over i gives sum_{l < m <= i} g_m.
    x = g.unsqueeze(-1).expand(*g.shape, C).masked_fill(~torch.tril(ones, -1), 0.0)
    return torch.cumsum(x, dim=-2).masked_fill(~torch.tril(ones), float("-inf"))


def decay_mask(g: Tensor | None) -> Tensor | None:
    """exp(G_i - G_j) for i >= j, 0 above the diagonal.

    g: None -> None (no decay); [..., C, 1] -> [..., C, C]; [..., C, K] -> [..., K, C, C].
    """
    if g is None:
        return None
    if g.shape[-1] == 1:
        return torch.exp(segment_sums(g[..., 0]))
    return torch.exp(segment_sums(g.transpose(-1, -2)))


def decayed_products(a: Tensor, b: Tensor, mask: Tensor | None, *, strict: bool = False) -> Tensor:
    """P[..., i, j] = sum_c a_ic b_jc exp(G_ic - G_jc) for j <= i (j < i if strict), else 0.

    a, b: [..., C, D]; mask: from ``decay_mask`` (None, [..., C, C] or [..., D, C, C]).
    Returns [..., C, C].
    These are the decayed score matrix (a = q, b = k) and the decayed key Gram matrix (a = b = k).
    """
    if mask is None or mask.dim() == a.dim():
        P = a @ b.transpose(-1, -2)  # [..., C, C]
        if mask is not None:
            P = P * mask
    else:
        # Per-channel decay: the exponent depends on the channel c, so it cannot leave the sum.
        P = torch.einsum("...ic,...jc,...cij->...ij", a, b, mask)
    return torch.tril(P, -1 if strict else 0)


def cumulative(g: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """(exp(G_i), exp(G_C - G_i)) for each token i of the block, both [..., C, 1|K].

    None, None without decay. ``G_C - G_i = sum_{l > i} g_l`` is summed directly (a reversed
    cumulative sum, shifted by one) rather than subtracted, so it stays accurate on long blocks.
    Both exponents are <= 0 because g <= 0.
    """
    if g is None:
        return None, None
    G = torch.cumsum(g, dim=-2)
    # rest[..., i, :] = sum_{l >= i} g_l; the sum over l > i is the next row (0 after the last).
    rest = torch.flip(torch.cumsum(torch.flip(g, dims=(-2,)), dim=-2), dims=(-2,))
    to_end = torch.cat([rest[..., 1:, :], torch.zeros_like(rest[..., :1, :])], dim=-2)
    return torch.exp(G), torch.exp(to_end)
