"""The chunk form: blocks of C tokens, masked products inside, the state carried across (5.1, 8).

One engine serves the whole DESIGN.md table. Linear attention is the case where the pseudo-values U
equal the values V; the delta rule is the case where U comes from the UT transform. Decay enters
only through the cumulative log-gate G of each block (``_gates``). For a block with incoming state
S (K x V) and tokens i = 1..C, Gamma_i = Diag(exp G_i):

    S_i = Gamma_i S + sum_{j <= i} Gamma_i Gamma_j^{-1} k_j u_j^T
    delta rule:  (I + L) U = diag(beta) (V - (K * exp G) S),   L_ij = beta_i sum_c k_ic k_jc
                 exp(G_ic - G_jc) for j < i;  T = (I + L)^{-1} diag(beta)  (the UT transform),
                 W = T (K * exp G),  U0 = T V,  U = U0 - W S
    linear attention:  U = V  (W = 0)
    o_i = S^T (exp(G_i) * q_i) + sum_{j <= i} (sum_c q_ic k_jc exp(G_ic - G_jc)) u_j
    S_out = Diag(exp G_C) S + (K * exp(G_C - G))^T U = M S + N,
    M = Diag(exp G_C) - (K * exp(G_C - G))^T W,   N = (K * exp(G_C - G))^T U0.

Everything except the state recurrence (G, the decayed products, the solves, W, U0, M, N) is
computed for all blocks at once in batched ops; only ``S <- M S + N`` loops over blocks (a
cumulative sum when there is neither decay nor a delta rule). No loop over tokens.

Internal layout: q, k [B, H, T, K]; v [B, H, T, V]; beta [B, H, T] or None (additive rule); g None,
[B, H, T, 1] or [B, H, T, K]; states [B, H, K, V]; the scale is already folded into q.

This is the reference engine: all blocks at once, plain autograd. It runs the parallel form (one
block of T tokens) and is the cross-check of ``chunk_function``, which runs ``mode="chunk"`` with
the same algebra in cache-sized groups of blocks and its own backward pass (memory linear in T).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops import _gates


class BlockTerms(NamedTuple):
    """Everything about a block that does not depend on its incoming state.

    Shapes for blocks laid out as [..., C, D] (``...`` = B, H, N):
    g [..., C, 1|K] or None (the block's log-gates); q_gate, k_to_end [..., C, 1|K] (exp G_i and
    exp(G_C - G_i)) or None; W [..., C, K] or None (additive rule); U0 [..., C, V];
    M_diag [..., 1|K, 1] (exp G_C) or None; M [..., K, K] or None (delta rule only); N [..., K, V].
    """

    g: Tensor | None
    q_gate: Tensor | None
    k_to_end: Tensor | None
    W: Tensor | None
    U0: Tensor
    M_diag: Tensor | None
    M: Tensor | None
    N: Tensor


def ut_transform(k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, k_gate: Tensor | None):
    """Solve (I + L) [W, U0] = diag(beta) [K * exp G, V] for every block at once (section 8).

    k: [..., C, K]; v: [..., C, V]; beta: [..., C]; returns W [..., C, K] and U0 [..., C, V].
    One unit-lower-triangular solve per block replaces the token loop of the delta rule.
    """
    C = k.shape[-2]
    L = beta.unsqueeze(-1) * _gates.decayed_products(k, k, g, strict=True)  # [..., C, C]
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    k_decayed = k if k_gate is None else k * k_gate
    rhs = beta.unsqueeze(-1) * torch.cat([k_decayed, v], dim=-1)  # [..., C, K + V]
    X = torch.linalg.solve_triangular(eye + L, rhs, upper=False, unitriangular=True)
    return X[..., : k.shape[-1]], X[..., k.shape[-1] :]


def block_terms(k: Tensor, v: Tensor, beta: Tensor | None, g: Tensor | None) -> BlockTerms:
    """Steps 1-3 of the chunk form for blocks [..., C, D]: gates, UT transform, (M, N)."""
    # Step 1: cumulative log-gates exp(G_i) and exp(G_C - G_i), every exponent <= 0.
    q_gate, k_to_end = _gates.cumulative(g)
    # Step 2: pseudo-values. Additive rule: U = V. Delta rule: U = U0 - W S (UT transform).
    if beta is None:
        W, U0 = None, v
    else:
        W, U0 = ut_transform(k, v, beta, g, q_gate)
    # Step 3: the block's affine map S_out = M S_in + N.
    k_end = k if k_to_end is None else k * k_to_end  # [..., C, K]
    N = k_end.transpose(-1, -2) @ U0  # [..., K, V]
    M_diag = None if q_gate is None else q_gate[..., -1, :].unsqueeze(-1)  # [..., 1|K, 1]
    M = None
    if W is not None:
        K = k.shape[-1]
        diag = k.new_ones(K) if M_diag is None else M_diag.squeeze(-1).expand(*N.shape[:-2], K)
        M = torch.diag_embed(diag) - k_end.transpose(-1, -2) @ W  # [..., K, K]
    return BlockTerms(g, q_gate, k_to_end, W, U0, M_diag, M, N)


def _blocks(x: Tensor | None, C: int, pad: int) -> Tensor | None:
    """[B, H, T, ...] -> [B, H, N, C, ...], zero-padded at the end to N * C tokens."""
    if x is None:
        return None
    if pad:
        widths = [0, 0] * (x.dim() - 3) + [0, pad]  # F.pad lists the last dimension first
        x = F.pad(x, widths)
    return x.reshape(*x.shape[:2], -1, C, *x.shape[3:])


def block_states(terms: BlockTerms, S0: Tensor) -> tuple[Tensor, Tensor]:
    """Step 4: the incoming state of every block, S_{n+1} = M_n S_n + N_n, and the final state.

    Returns states [B, H, N, K, V] (the state entering block n) and the state after the last block.
    """
    if terms.M is None and terms.M_diag is None:
        # Linear attention without decay: the states are a cumulative sum of the blocks' writes.
        totals = torch.cumsum(terms.N, dim=2)  # [B, H, N, K, V]
        states = torch.cat([torch.zeros_like(totals[:, :, :1]), totals[:, :, :-1]], dim=2)
        return S0.unsqueeze(2) + states, S0 + totals[:, :, -1]
    # unbind, not M[:, :, n]: each indexing's backward would allocate a zero tensor of the
    # full size, making the backward quadratic in the number of blocks.
    maps = terms.M if terms.M is not None else terms.M_diag
    apply = torch.matmul if terms.M is not None else torch.mul
    states = []
    S = S0
    for M_n, N_n in zip(maps.unbind(2), terms.N.unbind(2), strict=True):
        states.append(S)
        S = apply(M_n, S) + N_n
    return torch.stack(states, dim=2), S


def chunk_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
    chunk_size: int,
) -> tuple[Tensor, Tensor]:
    """The chunk form for any chunk_size >= 1; returns o [B, H, T, V] and the final state.

    Padding tokens (k = v = 0, g = 0, beta = 0) leave the state unchanged and are sliced off.
    """
    B, H, T, K = k.shape
    C = min(chunk_size, T)
    pad = -T % C
    # Step 0: blocks. [B, H, T, D] -> [B, H, N, C, D]
    qb, kb, vb, gb, bb = (_blocks(x, C, pad) for x in (q, k, v, g, beta))
    # Steps 1-3: everything that does not depend on the incoming state, all blocks at once.
    terms = block_terms(kb, vb, bb, gb)
    # Step 4: the only loop, over blocks: the incoming state of each block.
    S0 = initial_state if initial_state is not None else q.new_zeros(B, H, K, v.shape[-1])
    states, final = block_states(terms, S0)
    # Step 5: the pseudo-values given the incoming states, U = U0 - W S.
    U = terms.U0 if terms.W is None else terms.U0 - terms.W @ states  # [B, H, N, C, V]
    # Step 6: outputs: the read of the incoming state plus the masked product inside the block.
    q_read = qb if terms.q_gate is None else qb * terms.q_gate
    scores = _gates.decayed_products(qb, kb, terms.g)  # [B, H, N, C, C]
    o = q_read @ states + scores @ U  # [B, H, N, C, V]
    return o.reshape(B, H, -1, v.shape[-1])[:, :, :T], final
