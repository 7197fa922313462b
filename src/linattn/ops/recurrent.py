"""The recurrent form: one token at a time (spec sections 5 and 7; DESIGN.md's table).

Every mechanism is ``S_t = A_t S_{t-1} + k_t w_t^T``, ``o_t = S_t^T q_t``; ``step`` is the one place
that knows the transitions and writes, and one call of it is the generation step.

Internal layout (the public wrappers convert): q, k: [B, H, T, K]; v: [B, H, T, V]; beta: [B, H, T]
or None (None = the additive rule); g: None, [B, H, T, 1] (scalar decay) or [B, H, T, K] (per
channel); states [B, H, K, V]. The scale is already folded into q.
"""

from __future__ import annotations

import torch
from torch import Tensor


def step(
    S: Tensor,
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    beta_t: Tensor | None,
    g_t: Tensor | None,
    inplace: bool = False,
) -> tuple[Tensor, Tensor]:
    """One token: decay, then read-correct-write, then read. Returns (o_t, S_t).

    S: [B, H, K, V]; q_t, k_t: [B, H, K]; v_t: [B, H, V]; beta_t: [B, H] or None; g_t: [B, H, 1|K]
    or None. The decay is applied first and the delta rule's error is read from the decayed state:

        S <- Diag(exp g_t) S              (alpha_t I or Diag(alpha_t); the identity if g is None)
        u_t = v_t                         (additive rule)
        u_t = beta_t (v_t - S^T k_t)      (delta rule: the pseudo-value, section 7)
        S <- S + k_t u_t^T;   o_t = S^T q_t

    ``inplace``: update S in its own memory (the generation step: no new state per token).
    """
    if g_t is not None:
        alpha = torch.exp(g_t).unsqueeze(-1)  # [B, H, 1|K, 1] scales the rows of S
        S = S.mul_(alpha) if inplace else alpha * S
    if beta_t is None:
        u_t = v_t
    else:
        u_t = beta_t.unsqueeze(-1) * (v_t - read(S, k_t))
    k_col, u_row = k_t.unsqueeze(-1), u_t.unsqueeze(-2)  # the rank-one write k_t u_t^T
    S = S.addcmul_(k_col, u_row) if inplace else torch.addcmul(S, k_col, u_row)
    return read(S, q_t), S


def read(S: Tensor, x: Tensor) -> Tensor:
    """S^T x for every batch and head: S [B, H, K, V], x [B, H, K] -> [B, H, V]."""
    return (x.unsqueeze(-2) @ S).squeeze(-2)  # [B, H, 1, K] @ [B, H, K, V]


def recurrent_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Loop ``step`` over the T tokens; returns o [B, H, T, V] and the final state [B, H, K, V]."""
    B, H, T, K = k.shape
    S = initial_state
    if S is None:
        S = q.new_zeros(B, H, K, v.shape[-1])
    outputs = []
    for t in range(T):
        o_t, S = step(
            S,
            q[:, :, t],
            k[:, :, t],
            v[:, :, t],
            None if beta is None else beta[:, :, t],
            None if g is None else g[:, :, t],
        )
        outputs.append(o_t)
    return torch.stack(outputs, dim=2), S
