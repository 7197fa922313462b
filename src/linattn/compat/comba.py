"""fla's Comba: ``chunk_comba`` and ``fused_recurrent_comba``.

    u_t = beta_t (v_t - S_{t-1}^T p_t),    S_t = exp(g_t) S_{t-1} + k_t u_t^T

and o_t = S_t^T (scale q_t) (``linattn.ops.comba``): the correction reads the state entering the
token, before its decay, as fla's kernels and ``naive_chunk_comba`` do (fla's
``naive_recurrent_comba`` reads the decayed state and disagrees with its own kernels). q, k, p
[B, T, H, K]; v [B, T, HV, V], g and beta [B, T, HV] (grouped value heads). p None means k and
beta None means ones; the recurrent form also takes beta [B, T, HV, V] (one per value channel).
``use_qk_l2norm_in_kernel`` normalises q, k and p. Note fla's positional orders:
``chunk_comba(q, k, v, p, g, beta)`` but ``fused_recurrent_comba(q, k, p, v, g, beta)``.
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops.dplr_family import comba
from linattn.ops.functional import l2norm


def _comba_columns(q, k, v, p, beta, g, *, initial_state, **common):
    """``linattn.ops.comba``, and with beta [B, T, HV, V] each value channel as a head of its
    own (the columns of S evolve independently: ``_core.split_columns``, exact)."""
    if beta.dim() != 4:
        return comba(q, k, v, p, beta, g, initial_state=initial_state, **common)
    HV, V = v.shape[2], v.shape[3]
    v, beta, g, S0 = _core.split_columns(v, beta, g, initial_state, V)
    o, S = comba(q, k, v, p, beta, g, initial_state=S0, **common)
    return _core.join_columns(o, S, HV, V)


def _check(q: object, k: object, v: object, p: object, g: object, beta: object) -> None:
    """fla's shapes of Comba's tensors (``_core.check``), before p or beta is read."""
    _core.check(
        q, k, v, p=(p, ("[B, T, H, K]",)), g=(g, ("[B, T, HV]",)),
        beta=(beta, ("[B, T, HV]", "[B, T, HV, V]")),
    )  # fmt: skip


def _prepare(q, k, v, p, beta, use_l2norm):
    """p None -> k, beta None -> ones [B, T, HV]; q, k, p l2-normalised in the compute dtype."""
    p = k if p is None else p
    beta = v.new_ones(v.shape[:3]) if beta is None else beta
    if use_l2norm:
        q, k, p = (l2norm(x.to(compute_dtype(x.dtype))) for x in (q, k, p))
    return q, k, p, beta


def _check_heads(q: Tensor, k: Tensor, p: Tensor) -> None:
    """fla's assert in ``chunk_comba`` on p's heads, with fla's message (v's: ``_core.check``)."""
    if q.shape[2] != k.shape[2] or q.shape[2] != p.shape[2]:
        raise ValueError(
            f"q, k and p must have the same number of heads, but got q.shape[2]={q.shape[2]}, "
            f"k.shape[2]={k.shape[2]} and p.shape[2]={p.shape[2]}"
        )


def chunk_comba(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    p: Tensor,
    g: Tensor,
    beta: Tensor = None,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_comba`` (the module docstring): the chunk form."""
    _core.floating_qkv(q, k, v)
    if isinstance(p, Tensor) and all(x.dim() == 4 for x in (q, k, p)):
        _check_heads(q, k, p)
    _check(q, k, v, p, g, beta)
    out = q.dtype
    q, k, p, beta = _prepare(q, k, v, p, beta, use_qk_l2norm_in_kernel)
    return _core.run_op(
        _comba_columns, q, k, v, {"p": p, "beta": beta, "g": g}, mode="chunk", scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, out=out,
    )  # fmt: skip


def fused_recurrent_comba(
    q: Tensor,
    k: Tensor,
    p: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor = None,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """fla's ``fused_recurrent_comba``: the token loop (decoding); beta may be [B, T, HV, V]."""
    _check(q, k, v, p, g, beta)
    out = q.dtype
    q, k, p, beta = _prepare(q, k, v, p, beta, use_qk_l2norm_in_kernel)
    return _core.run_op(
        _comba_columns, q, k, v, {"p": p, "beta": beta, "g": g}, mode="recurrent",
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, out=out,
    )  # fmt: skip
