"""The affine map of a slice of tokens, S_out = M S_in + N, and how maps compose (spec section 8).

Every mechanism of the mechanism table (docs/design.md) updates its state as
S_t = A_t S_{t-1} + k_t w_t^T, so a whole slice of tokens acts on the state it receives as an
affine map. Its size, [B, H, K, K] and
[B, H, K, V], does not depend on the slice length: this is what context parallelism exchanges.
The map is ``linattn.ops.affine.affine_map``'s, from the chunk terms, linear in the slice length.

The transition part M is stored in the cheapest form the mechanism allows:

| mechanism                         | M                                   | stored as          |
|-----------------------------------|-------------------------------------|--------------------|
| linear attention                  | I                                   | None               |
| scalar decay (Mamba-2)            | exp(sum_t g_t) I                    | [B, H, 1, 1]       |
| per-channel decay (GLA)           | Diag(exp(sum_t g_t))                | [B, H, K, 1]       |
| delta rule, Gated DeltaNet, KDA   | prod_t A_t (compact WY form, sec 8) | [B, H, K, K]       |
| generalized delta rule (DPLR)     | prod_t (Diag(exp g_t) + a_t b_t^T)  | [B, H, K, K]       |
"""

from __future__ import annotations

from torch import Tensor

from linattn.ops import affine
from linattn.ops.delta_rule import l2norm
from linattn.ops.mechanism import Mechanism


def apply(M: Tensor | None, N: Tensor, S: Tensor) -> Tensor:
    """M S + N for a stored M (None, a diagonal [B, H, 1|K, 1], or a full [B, H, K, K])."""
    if M is None:
        return S + N
    if M.shape[-1] == 1:
        return M * S + N  # the diagonal scales the rows of S
    return M @ S + N


def slice_map(
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    mech: Mechanism,
    *,
    chunk_size: int,
    use_qk_l2norm: bool = False,
) -> tuple[Tensor | None, Tensor]:
    """(M in its stored form, N [B, H, K, V]) of a slice, for checked compute-dtype inputs.

    k: [B, T, H, K]; v: [B, T, H, V]; beta: [B, T, H] or None (additive rule), [B, T, H, 2K]
    = [a | b] for the generalized rule (``mech``); g: None,
    [B, T, H] or [B, T, H, K] (log-decay <= 0); ``use_qk_l2norm``: the keys normalised first,
    as the delta rule's op does.
    """
    if use_qk_l2norm:
        k = l2norm(k)
    return affine.affine_map(*affine.to_internal(k, v, beta=beta, g=g), mech, chunk_size)
