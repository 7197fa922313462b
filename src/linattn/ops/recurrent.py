"""The recurrent form: one token at a time (spec sections 5 and 7; docs/design.md, "Three forms
that agree").

Every mechanism is ``S_t = A_t S_{t-1} + k_t w_t^T``, ``o_t = S_t^T q_t``; ``step`` applies the gate
and the rule's write (``rules``: the one place of each rule's step), and one call of it is the
generation step.

Internal layout (the public wrappers convert): q, k: [B, H, T, K]; v: [B, HV, T, V]; beta:
[B, HV, T], [B, HV, T, 2K] (the generalized rule's [a | b]) or None (the additive rule); g:
None, [B, HV, T, 1] (scalar decay) or [B, HV, T, K] (per channel); states [B, HV, K, V]. The
scale is already folded into q. Grouped value heads: HV = groups H, value head j reads q/k head
j // groups (broadcast, no copy); groups = 1 the plain case.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import Tensor

from linattn.ops import rules
from linattn.ops.mechanism import Mechanism
from linattn.ops.rules import read

__all__ = ["read", "recurrent_forward", "step"]


def step(
    S: Tensor,
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
    beta_t: Tensor | None,
    g_t: Tensor | None,
    inplace: bool = False,
    rule: ModuleType | None = None,
) -> tuple[Tensor, Tensor]:
    """One token: decay, then the rule's write (read, correct), then read. Returns (o_t, S_t).

    S: [B, HV, K, V]; q_t, k_t: [B, H, K]; v_t: [B, HV, V]; beta_t: [B, HV] (the delta rule),
    [B, HV, 2K] (the generalized rule's [a_t | b_t]) or None; g_t: [B, HV, 1|K] or None; HV =
    groups H (value head j reads q/k head j // groups, broadcast). The decay is applied first and
    the delta rule's error is read from the decayed state; the generalized rule's b_t reads the
    state entering the token:

        (a_t, r_t) = rule.entering_write(S, beta_t)     (dplr: r_t = S^T b_t; others: none)
        S <- Diag(exp g_t) S              (alpha_t I or Diag(alpha_t); the identity if g is None)
        u_t = rule.write(S, k_t, v_t, beta_t)   (additive, dplr: v_t; delta: beta_t (v_t - S^T k_t))
        S <- S + k_t u_t^T (+ a_t r_t^T);   o_t = S^T q_t

    ``rule``: the rule's module (``Mechanism.rule``, resolved by the caller); None for direct
    calls: the delta rule where beta_t is given. ``inplace``: update S in its own memory (the
    generation step: no new state per token).
    """
    rule = rules.named("additive" if beta_t is None else "delta") if rule is None else rule
    state = S
    H = k_t.shape[1]
    heads = (H, S.shape[1] // max(H, 1))  # (H, groups): the value heads of each q/k head
    # [B, HV, ...] -> [B, H, groups, ...] views; q, k [B, H, K] -> [B, H, 1, K], broadcast
    S = S.unflatten(1, heads)
    q_t, k_t, v_t = q_t.unsqueeze(2), k_t.unsqueeze(2), v_t.unflatten(1, heads)
    if beta_t is not None:
        beta_t = beta_t.unflatten(1, heads)  # [B, H, groups] or [B, H, groups, 2K]
    entering = rule.entering_write(S, beta_t)  # before the decay changes S in place
    if g_t is not None:
        alpha = torch.exp(g_t.unflatten(1, heads)).unsqueeze(-1)  # [B, H, groups, 1|K, 1]: rows
        S = S.mul_(alpha) if inplace else alpha * S
    u_t = rule.write(S, k_t, v_t, beta_t)
    k_col, u_row = k_t.unsqueeze(-1), u_t.unsqueeze(-2)  # the rank-one write k_t u_t^T
    S = S.addcmul_(k_col, u_row) if inplace else torch.addcmul(S, k_col, u_row)
    if entering is not None:  # the rank-one write a_t r_t^T
        a_t, r_t = entering
        S = S.addcmul_(a_t.unsqueeze(-1), r_t.unsqueeze(-2))
    o_t = read(S, q_t).flatten(1, 2)  # [B, H, groups, V] -> [B, HV, V]
    return o_t, (state if inplace else S.flatten(1, 2))


def recurrent_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
    mech: Mechanism,
) -> tuple[Tensor, Tensor]:
    """Loop ``step`` over the T tokens; returns o [B, HV, T, V] and the final state
    [B, HV, K, V]."""
    B, _, T, K = k.shape
    S = initial_state
    if S is None:
        S = q.new_zeros(B, v.shape[1], K, v.shape[-1])
    outputs = []
    for t in range(T):
        o_t, S = step(
            S,
            q[:, :, t],
            k[:, :, t],
            v[:, :, t],
            None if beta is None else beta[:, :, t],
            None if g is None else g[:, :, t],
            rule=mech.rule,
        )
        outputs.append(o_t)
    return torch.stack(outputs, dim=2), S
