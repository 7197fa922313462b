"""fla's gated linear attention (GLA): ``chunk_gla``, ``fused_chunk_gla``, ``fused_recurrent_gla``.

S_t = Diag(exp gk_t) S_{t-1} Diag(exp gv_t) + k_t v_t^T, o_t = S_t^T (scale q_t) (spec section
10: per-channel decay); gk [B, T, H, K] (``chunk_gla``'s ``g``), gv [B, T, H, V] (the recurrent
form only: each value channel then runs as a head of its own, ``_core.split_columns``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core


def chunk_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_gla``: S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, g [B, T, H, K]."""
    _core.check(q, k, v, g=(g, ("[B, T, H, K]",)))
    _core.check_varlen(q, initial_state, cu_seqlens)
    if initial_state is not None and initial_state.dtype not in (torch.float32, torch.float64):
        raise ValueError("initial_state must be in float32.")  # fla asserts float32
    if not (q.shape == k.shape == g.shape):
        raise ValueError(
            f"q, k, g must have the same shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(g.shape)}"
        )
    return _core.run(
        q, k, v, delta=False, mode="chunk", gk=g, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        state_v_first=state_v_first, out="q",
    )  # fmt: skip


def fused_chunk_gla(**kwargs: object) -> tuple[Tensor, Tensor | None]:
    """fla 0.6.0's ``fused_chunk_gla`` is deprecated and raises; so does this one."""
    raise NotImplementedError("`fused_chunk_gla` is deprecated. Please use `chunk_gla` instead.")


def fused_recurrent_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_gla``: the token loop, gk per key and gv per value channel."""
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check(q, k, v, gk=(gk, ("[B, T, HV, K]",)), gv=(gv, ("[B, T, HV, V]",)))
    return _core.run(
        q, k, v, delta=False, mode="recurrent", gk=gk, gv=gv, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, reverse=reverse, state_v_first=state_v_first,
    )  # fmt: skip
