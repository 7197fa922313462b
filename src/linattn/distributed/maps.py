"""The affine map of a slice of tokens, S_out = M S_in + N, and how maps compose (spec section 8).

Every mechanism of DESIGN.md's table updates its state as S_t = A_t S_{t-1} + k_t w_t^T, so a
whole slice of tokens acts on the state it receives as an affine map. Its size, [B, H, K, K] and
[B, H, K, V], does not depend on the slice length: this is what context parallelism exchanges.

The transition part M is stored in the cheapest form the mechanism allows:

| mechanism                         | M                                   | stored as          |
|-----------------------------------|-------------------------------------|--------------------|
| linear attention                  | I                                   | None               |
| scalar decay (Mamba-2)            | exp(sum_t g_t) I                    | [B, H, 1, 1]       |
| per-channel decay (GLA)           | Diag(exp(sum_t g_t))                | [B, H, K, 1]       |
| delta rule, Gated DeltaNet, KDA   | prod_t A_t (compact WY form, sec 8) | [B, H, K, K]       |

For the additive rules N = sum_t Diag(exp(G_T - G_t)) k_t v_t^T is one weighted product. For the
delta rules the map comes from the chunked op itself: the state recurrence acts on each column of
S independently, so running ``linattn.ops.delta_rule`` from the initial state [0 | I] on the
values [v | 0] ends in the state [N | M] (the zero-value columns carry I to M I = M, the value
columns carry 0 to N). This reuses the chunk form's UT transform (and its autograd) and never
forms anything of size T x T, whatever the slice length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn import ops

# Kinds of transition, in the order of the table above (also sent in the shape descriptor).
IDENTITY, SCALAR, CHANNEL, FULL = 0, 1, 2, 3


def kind_of(beta: Tensor | None, g: Tensor | None) -> int:
    """Which row of the table a call belongs to (g: None, [B, T, H] or [B, T, H, K])."""
    if beta is not None:
        return FULL
    if g is None:
        return IDENTITY
    return SCALAR if g.dim() == 3 else CHANNEL


def apply(M: Tensor | None, N: Tensor, S: Tensor) -> Tensor:
    """M S + N for a stored M (None, a diagonal [B, H, 1|K, 1], or a full [B, H, K, K])."""
    if M is None:
        return S + N
    if M.shape[-1] == 1:
        return M * S + N  # the diagonal scales the rows of S
    return M @ S + N


def _to_end(g: Tensor) -> Tensor:
    """sum_{l > t} g_l along T for g [B, T, H, 1|K]; summed directly, so it stays accurate."""
    rest = torch.flip(torch.cumsum(torch.flip(g, dims=(1,)), dim=1), dims=(1,))  # sum_{l >= t}
    return torch.cat([rest[:, 1:], torch.zeros_like(rest[:, :1])], dim=1)


def additive_map(k: Tensor, v: Tensor, g: Tensor | None) -> tuple[Tensor | None, Tensor]:
    """(M, N) of linear attention with optional decay over a slice (compute-dtype tensors).

    k: [B, T, H, K]; v: [B, T, H, V]; g: None, [B, T, H] or [B, T, H, K] (log-decay <= 0).
    N = sum_t Diag(exp(G_T - G_t)) k_t v_t^T [B, H, K, V]; M = Diag(exp G_T) as in the table.
    """
    if g is None:
        return None, torch.einsum("bthk,bthv->bhkv", k, v)
    g4 = g.unsqueeze(-1) if g.dim() == 3 else g  # [B, T, H, 1|K]
    N = torch.einsum("bthk,bthv->bhkv", k * torch.exp(_to_end(g4)), v)
    M = torch.exp(g4.sum(dim=1)).unsqueeze(-1)  # [B, H, 1|K, 1]
    return M, N


def delta_map(
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None,
    *,
    chunk_size: int,
    use_qk_l2norm: bool,
) -> tuple[Tensor, Tensor]:
    """(M [B, H, K, K], N [B, H, K, V]) of the delta rule (any g) over a slice.

    One run of the chunked op from [0 | I] on [v | 0]; see the module docstring.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    values = torch.cat([v, v.new_zeros(B, T, H, K)], dim=-1)  # [B, T, H, V + K]
    eye = torch.eye(K, dtype=v.dtype, device=v.device).expand(B, H, K, K)
    start = torch.cat([v.new_zeros(B, H, K, V), eye], dim=-1)  # [B, H, K, V + K]
    # The queries are irrelevant to the final state; k is a valid stand-in of the right shape.
    _, S = ops.delta_rule(
        k,
        k,
        values,
        beta,
        g,
        mode="chunk",
        chunk_size=chunk_size,
        initial_state=start,
        output_final_state=True,
        use_qk_l2norm=use_qk_l2norm,
    )
    return S[..., V:], S[..., :V]
