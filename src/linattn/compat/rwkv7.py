"""fla's RWKV-7 ops: ``chunk_rwkv7`` and ``fused_recurrent_rwkv7``.

    S_t = Diag(exp w_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,    o_t = S_t^T (scale r_t)

As in fla, they are the DPLR delta rule under RWKV-7's names (q = r, gk = w; a reads the state,
b is the direction: RWKV-7 passes a = -kappa_hat, b = kappa_hat * a_gate), with their own
defaults: ``chunk_rwkv7`` scales r by 1.0, ``fused_recurrent_rwkv7`` by 1 / sqrt(K) and returns
the final state unless told not to. ``fused_mul_recurrent_rwkv7(r, w, k, v, kk, a)`` (the decoding
call of fla's RWKV7 layer; exported by ``fla.ops.rwkv7`` only) takes RWKV-7's kk and in-context
learning rate a and forms the DPLR vectors itself: a_dplr = -kk, b_dplr = kk * a.
``linattn.ops.rwkv7`` is the same mechanism as a linattn op.
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.compat.generalized_delta_rule import (
    check_vectors,
    chunk_dplr_delta_rule,
    fused_recurrent_dplr_delta_rule,
)
from linattn.ops import checks as _checks


def _check(r: object, w: object, k: object, v: object, **vectors: object) -> None:
    """RWKV-7's tensors under RWKV-7's names (r, w, kk), before they are passed on under the
    DPLR rule's (q, gk, a): r [B, T, H, K] finite, w a log-decay [B, T, H, K] (<= 0)."""
    _core.check(r, k, v, ("r", "k", "v"))
    _checks.tensor("r", r, 4)
    check_vectors(k, v, w=w, **vectors)


def chunk_rwkv7(
    r: Tensor,
    w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    safe_gate: bool = False,
    chunk_size: int | None = None,
    disable_recompute: bool = False,
    cp_context: object | None = None,
    lower_bound: float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_rwkv7``: ``chunk_dplr_delta_rule(q=r, k, v, a, b, gk=w, ...)``."""
    _check(r, w, k, v, a=a, b=b)
    return chunk_dplr_delta_rule(
        q=r, k=k, v=v, a=a, b=b, gk=w, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu, safe_gate=safe_gate, chunk_size=chunk_size,
        disable_recompute=disable_recompute, cp_context=cp_context, lower_bound=lower_bound,
    )  # fmt: skip


def fused_recurrent_rwkv7(
    r: Tensor,
    w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = True,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_rwkv7``: ``fused_recurrent_dplr_delta_rule(q=r, ..., gk=w)``."""
    _check(r, w, k, v, a=a, b=b)
    return fused_recurrent_dplr_delta_rule(
        q=r, k=k, v=v, a=a, b=b, gk=w, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip


def fused_mul_recurrent_rwkv7(
    r: Tensor,
    w: Tensor,
    k: Tensor,
    v: Tensor,
    kk: Tensor,
    a: Tensor,
    scale: float = 1.0,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_mul_recurrent_rwkv7``: the DPLR token loop with a = -kk (it reads) and
    b = kk * a (the direction); scale 1.0 by default, None meaning 1 / sqrt(K)."""
    _check(r, w, k, v, kk=kk, a=a)
    return fused_recurrent_dplr_delta_rule(
        q=r, k=k, v=v, a=-kk, b=kk * a, gk=w, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, reverse=reverse, cu_seqlens=cu_seqlens,
    )  # fmt: skip
