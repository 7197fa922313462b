"""The affine map of a block of tokens: S_out = M S_in + N (spec section 8, the WY form).

Every mechanism of the table is affine in its state, so a block of tokens acts on the incoming
state as one affine map. Composing the maps of consecutive blocks is how the chunk form carries the
state (``chunk.block_states``) and how context parallelism will carry it across devices.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import _engine
from linattn.ops import checks as _checks
from linattn.ops.chunk import block_terms


def chunk_affine_map(
    k: Tensor, v: Tensor, beta: Tensor | None = None, g: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The pair (M, N) with S_out = M S_in + N for one block of tokens.

    M is the product of the block's transitions (the latest on the left) and N the state the block
    writes from zero. With the cumulative log-gate G of the block (G_C its last row):

    - additive rule (beta None): M = Diag(exp G_C), N = (K * exp(G_C - G))^T V;
    - delta rule: M = Diag(exp G_C) - (K * exp(G_C - G))^T W, N = (K * exp(G_C - G))^T U0, with
      W = T (K * exp G), U0 = T V and T = (I + L)^{-1} diag(beta) the UT transform; without decay
      M = I - K^T T K, the compact WY form of prod_t (I - beta_t k_t k_t^T).

    Args:
        k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H] in [0, 2] or None (additive rule);
        g: None, [B, T, H] or [B, T, H, K], log-decay <= 0 (-inf: a reset). Keys are used as given.

    Returns:
        M: [B, H, K, K] and N: [B, H, K, V], in float32 (float64 for float64 inputs).
    """
    B, T, H, K, V = _checks.kv(k, v)
    if beta is not None:
        _checks.beta(beta, B, T, H)
    _checks.gate(g, B, T, H, K)
    dtype = _engine.compute_dtype(k.dtype)
    # [B, T, H, D] -> [B, H, T, D]: the whole block is one chunk of C = T tokens.
    k, v = k.to(dtype).transpose(1, 2), v.to(dtype).transpose(1, 2)
    if beta is not None:
        beta = beta.to(dtype).transpose(1, 2)
    if g is not None:
        g = g.to(dtype).transpose(1, 2)
        g = g.unsqueeze(-1) if g.dim() == 3 else g  # [B, H, T, 1 | K]
    if T == 0:
        return _empty_block(k, v, beta, g)
    terms = block_terms(k, v, beta, g)
    if terms.M is not None:
        return terms.M, terms.N
    diag = k.new_ones(B, H, K) if terms.M_diag is None else terms.M_diag[..., 0].expand(B, H, K)
    return torch.diag_embed(diag), terms.N


def _empty_block(k: Tensor, v: Tensor, beta: Tensor | None, g: Tensor | None):
    """A block of no tokens is the identity map: M = I [B, H, K, K], N = 0 [B, H, K, V].

    The sum of the (empty) inputs is an exact 0 that keeps them in the graph, so that each gets
    an empty gradient of its shape, as from PyTorch's own ops.
    """
    B, H, _, K = k.shape
    link = sum(x.sum() for x in (k, v, beta, g) if x is not None)  # 0: all are empty
    M = torch.eye(K, dtype=k.dtype, device=k.device).expand(B, H, K, K) + link
    return M, k.new_zeros(B, H, K, v.shape[-1]) + link
