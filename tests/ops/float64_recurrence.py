"""An independent float64 recurrence for the property tests: a plain loop over tokens.

Written from the mechanism table (docs/design.md), not from the library (``linattn.reference``
included), so that it
can check every form of every op: S_t = A_t S_{t-1} + k_t w_t^T, o_t = S_t^T (scale q_t), with the
decay applied first and the delta rule's error read from the decayed state:

    S <- Diag(alpha_t) S                       (alpha_t = exp g_t; alpha_t I for a scalar gate)
    S <- S + k_t v_t^T                         (additive rule)
    S <- S + beta_t k_t (v_t - S^T k_t)^T      (delta rule)
    o_t = S^T (scale q_t)

and the generalized delta rule (its definition), whose b_t reads the state entering the
token: S_t = Diag(alpha_t) S_{t-1} + a_t (b_t^T S_{t-1}) + k_t v_t^T.

It runs in plain PyTorch float64 so that autograd gives the reference gradients of every input.
Layout as the public ops: q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H] or None, g None,
[B, T, H] or [B, T, H, K], states [B, H, K, V].
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_step(
    S: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    a: Tensor | None = None,
    b: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One token for every batch and head: S [B, H, K, V]; q, k [B, H, K]; v [B, H, V];
    beta [B, H] or None; g None, [B, H] or [B, H, K]; a, b [B, H, K] or None (the generalized
    rule) (q already scaled). Returns (o_t, S_t)."""
    low_rank = None
    if a is not None:  # a_t (b_t^T S_{t-1}): read before the decay
        low_rank = a[..., :, None] * torch.einsum("bhk,bhkv->bhv", b, S)[..., None, :]
    if g is not None:
        alpha = torch.exp(g)  # exp(-inf) = 0: a reset empties the memory exactly
        alpha = alpha[..., None, None] if alpha.dim() == 2 else alpha[..., None]  # [B,H,1|K,1]
        S = alpha * S
    if beta is None:
        w = v
    else:
        error = v - torch.einsum("bhk,bhkv->bhv", k, S)
        w = beta[..., None] * error
    S = S + k[..., :, None] * w[..., None, :]  # the rank-one write k_t w_t^T
    if low_rank is not None:
        S = S + low_rank
    return torch.einsum("bhk,bhkv->bhv", q, S), S


def sequence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    S0: Tensor | None,
    scale: float,
    a: Tensor | None = None,
    b: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Equal-length sequences [B, T, H, D]: o [B, T, H, V] and the final state [B, H, K, V]."""
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if S0 is None else S0
    outputs = []
    for t in range(T):
        o_t, S = token_step(
            S,
            scale * q[:, t],
            k[:, t],
            v[:, t],
            None if beta is None else beta[:, t],
            None if g is None else g[:, t],
            None if a is None else a[:, t],
            None if b is None else b[:, t],
        )
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(B, 0, H, v.shape[-1])
    return o, S


def l2norm(x: Tensor) -> Tensor:
    """x / sqrt(|x|^2 + 1e-6) along the last dimension (``use_qk_l2norm``, as documented)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    g: Tensor | None = None,
    S0: Tensor | None = None,
    *,
    scale: float | None = None,
    normalize: bool = False,
    use_qk_l2norm: bool = False,
    cu_seqlens: list[int] | None = None,
    a: Tensor | None = None,
    b: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The documented contract of ``linear_attention`` / ``delta_rule``, token by token in float64.

    normalize: the normaliser z_t is the same recurrence on a column of ones appended to v, and
    o = (S^T q)[:V] / (z^T q) (the state then has V + 1 columns). cu_seqlens: a list of bounds
    [0, ..., T] (B = 1); each packed sequence runs alone from its own row of S0. a, b: the
    generalized rule's [B, T, H, K] (beta None).
    Returns o [B, T, H, V] and the final state [N, H, K, V(+1)].
    """
    q, k, v = q.double(), k.double(), v.double()
    beta = None if beta is None else beta.double()
    g = None if g is None else g.double()
    a = None if a is None else a.double()
    b = None if b is None else b.double()
    S0 = None if S0 is None else S0.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    V = v.shape[-1]
    if normalize:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    bounds = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens
    outputs, states = [], []
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        part = [None if x is None else x[:, start:end] for x in (q, k, v, beta, g)]
        low_rank = [None if x is None else x[:, start:end] for x in (a, b)]
        first = S0 if (S0 is None or cu_seqlens is None) else S0[n : n + 1]
        o, S = sequence(*part, first, scale, *low_rank)
        outputs.append(o)
        states.append(S)
    o, S = torch.cat(outputs, dim=1), torch.cat(states, dim=0)
    if normalize:
        o = o[..., :V] / o[..., V:]
    return o, S
