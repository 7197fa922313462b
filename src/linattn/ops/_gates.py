"""Cumulative log-gates and decayed products inside a block of tokens (spec section 8, with decay).

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
import torch.nn.functional as F
from torch import Tensor

from linattn.ops.tuning import SUB_BLOCK


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


def sums_after(g: Tensor) -> Tensor:
    """out[..., i, :] = sum_{l > i} g[..., l, :] over the token axis -2 (0 for the last token).

    A reversed cumulative sum shifted by one: only the terms after i are added, so it stays
    accurate on long blocks (no difference of two large sums).
    """
    rest = torch.flip(torch.cumsum(torch.flip(g, dims=(-2,)), dim=-2), dims=(-2,))
    return torch.cat([rest[..., 1:, :], torch.zeros_like(rest[..., :1, :])], dim=-2)


def cumulative(g: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """(exp(G_i), exp(G_C - G_i)) for each token i of the block, both [..., C, 1|K].

    None, None without decay. Both exponents are <= 0 because g <= 0.
    """
    if g is None:
        return None, None
    return torch.exp(torch.cumsum(g, dim=-2)), torch.exp(sums_after(g))


def decayed_products(a: Tensor, b: Tensor, g: Tensor | None, *, strict: bool = False) -> Tensor:
    """P[..., i, j] = sum_c a_ic b_jc exp(G_ic - G_jc) for j <= i (j < i if strict), else 0.

    a, b: [..., C, D]; g: None, [..., C, 1] or [..., C, D] -> P: [..., C, C]. These are the decayed
    score matrix (a = q, b = k) and the decayed key Gram matrix (a = b = k).
    """
    if g is None:
        P = a @ b.transpose(-1, -2)
    elif g.shape[-1] == 1:
        # One decay per head: it leaves the sum over channels as one factor exp(G_i - G_j).
        P = (a @ b.transpose(-1, -2)) * torch.exp(segment_sums(g[..., 0]))
    elif a.shape[-2] <= SUB_BLOCK:
        P = _channel_products(a, b, g)
    else:
        P = _sub_block_products(a, b, g)
    return torch.tril(P, -1 if strict else 0)


def _channel_products(a: Tensor, b: Tensor, g: Tensor) -> Tensor:
    """Per-channel decay, exactly: the [..., D, C, C] tensor exp(G_ic - G_jc), masked to i >= j."""
    decay = torch.exp(segment_sums(g.transpose(-1, -2)))  # [..., D, C, C]
    return torch.einsum("...ic,...jc,...cij->...ij", a, b, decay)


def _sub_block_products(a: Tensor, b: Tensor, g: Tensor) -> Tensor:
    """Per-channel decay in sub-blocks of c = SUB_BLOCK tokens (the boundary trick).

    Inside a sub-block: the exact decay tensor (``_channel_products``), c x c x D per sub-block.
    Between sub-blocks alpha > beta, for i in alpha and j in beta, split the decay at the boundary:
        G_i - G_j = (G_i - G_s) + (sum of the sub-blocks strictly between) + (G_e - G_j),
    with s the last token before alpha and e the last token of beta; each part is <= 0, so
        P[alpha, beta] = (a * exp(G_i - G_s) * exp(between[alpha, beta])) (b * exp(G_e - G_j))^T
    is a matrix product. Memory per block C * c * D (not C * C * D).
    """
    C = a.shape[-2]
    c = SUB_BLOCK
    n = -(-C // c)
    pad = n * c - C  # zero tokens (a = b = 0, g = 0) at the end; sliced off below
    a, b, g = (F.pad(x, (0, 0, 0, pad)).unflatten(-2, (n, c)) for x in (a, b, g))  # [..., n, c, D]
    inside = _channel_products(a, b, g)  # [..., n, c, c]
    local = torch.cumsum(g, dim=-2)  # G_i - G_s for i in its sub-block
    a_part = a * torch.exp(local)
    b_part = b * torch.exp(sums_after(g))  # exp(G_e - G_j)
    totals = local[..., -1, :].transpose(-1, -2)  # [..., D, n]: the sum over each sub-block
    # between[alpha, beta] = sum over sub-blocks beta < gamma < alpha, i.e. row alpha - 1 of the
    # segment sums of the totals; -inf where alpha <= beta (including the first row).
    seg = segment_sums(totals)  # [..., D, n, n]
    between = torch.cat([torch.full_like(seg[..., :1, :], float("-inf")), seg[..., :-1, :]], -2)
    between = torch.exp(between).permute(*range(between.dim() - 3), -2, -1, -3)  # [..., n, n, D]
    a_hat = a_part.unsqueeze(-3) * between.unsqueeze(-2)  # [..., n(alpha), n(beta), c, D]
    across = a_hat @ b_part.unsqueeze(-4).transpose(-1, -2)  # [..., n, n, c, c], 0 if alpha <= beta
    eye = torch.eye(n, dtype=a.dtype, device=a.device)[:, :, None, None]
    blocks = across + eye * inside.unsqueeze(-3)  # the diagonal blocks from inside
    # [..., n, n, c, c] -> [..., n, c, n, c] -> [..., n * c, n * c]
    P = blocks.transpose(-3, -2).reshape(*blocks.shape[:-4], n * c, n * c)
    return P[..., :C, :C]
