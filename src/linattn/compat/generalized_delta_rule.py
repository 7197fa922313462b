"""fla's generalized delta rule: ``chunk_dplr_delta_rule`` / ``fused_recurrent_dplr_delta_rule``
(DPLR) and ``chunk_iplr_delta_rule`` / ``fused_recurrent_iplr_delta_rule`` (IPLR).

    S_t = Diag(exp gk_t) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,    o_t = S_t^T (scale q_t)

(fla's ``dplr_recurrence`` and its kernels; IPLR has gk = 0.) fla's ``a`` reads the state entering
the token and its ``b`` is the direction the read is written along: the reverse of
``linattn.ops.generalized_delta_rule``'s names, so these call it with a and b swapped. Every
tensor is [B, T, H, ...] with one head count (v may have HV = G * H heads, a, b and gk then HV);
states [N, H, K, V]. fla's IPLR chunk and DPLR recurrent kernels have no backward; linattn's
ops give the gradients of every form.
"""

from __future__ import annotations

import math

from torch import Tensor

from linattn.compat import _core
from linattn.ops import checks as _checks
from linattn.ops.generalized_delta_rule import generalized_delta_rule

RCP_LN2 = 1 / math.log(2)  # fla's gate_bound_is_safe works in log2 units


GATES = ("gk", "w")  # the log-decays' names (fla's DPLR gk, RWKV-7's w)
# linattn's op names a and b the other way round (the module docstring)
SWAPPED = _core.inverts(names={"a": "b", "b": "a"})


def check_vectors(k: Tensor, v: Tensor, **named: Tensor | None) -> None:
    """a, b (and the gate gk, or RWKV-7's w) [B, T, HV, K], checked under fla's names before a
    and b are swapped and the gate passed as the op's g: the gate's values too (<= 0, no NaN),
    which the op would report as g's."""
    if not all(isinstance(x, Tensor) and x.dim() == 4 for x in (k, v)):
        return  # the op names k or v
    sizes = (*v.shape[:3], k.shape[-1])
    for name, x in named.items():  # each required: None refused by name
        if name in GATES:
            _checks.gate(x, *sizes, name=name, channel_only=True)
            continue
        _checks.tensor(name, x, 4)
        if x.shape != sizes:
            raise ValueError(f"{name} must have shape [B, T, H, K] = {sizes}, got {tuple(x.shape)}")


def dplr_chunk_size(chunk_size: int | None, lower_bound: float | None) -> int:
    """fla's default: 64 when ``lower_bound`` keeps the exponents of a 64-token chunk inside
    float32 (``gate_bound_is_safe``), else 16. The chunk size changes rounding only here."""
    if chunk_size is not None:
        return chunk_size
    safe = lower_bound is not None and lower_bound < 0
    return 64 if safe and abs(lower_bound) * (64 // 2 + 1) * RCP_LN2 <= 124 else 16


@SWAPPED
def chunk_dplr_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    gk: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    safe_gate: bool = False,
    chunk_size: int | None = None,
    disable_recompute: bool = False,
    cp_context: object | None = None,
    lower_bound: float | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_dplr_delta_rule`` (the module docstring): the chunk form. ``safe_gate``,
    ``disable_recompute`` and ``cu_seqlens_cpu`` (kernel choices) have no effect here;
    ``lower_bound`` must be negative (fla then asserts lower_bound <= gk < 0)."""
    _core.no_head_first(kwargs)
    if lower_bound is not None and lower_bound >= 0:
        raise ValueError(
            f"`lower_bound` must be negative (gk is a log-decay < 0), got {lower_bound}."
        )
    _core.check_cp(cp_context)
    check_vectors(k, v, a=a, b=b, gk=gk)
    return _core.run_op(
        generalized_delta_rule, q, k, v, {"a": b, "b": a, "g": gk}, mode="chunk", scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, chunk_size=dplr_chunk_size(chunk_size, lower_bound),
    )  # fmt: skip


@SWAPPED
def fused_recurrent_dplr_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    gk: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """fla's ``fused_recurrent_dplr_delta_rule``: the token loop (decoding); ``reverse`` runs
    each sequence from its last token to its first."""
    check_vectors(k, v, a=a, b=b, gk=gk)
    return _core.run_op(
        generalized_delta_rule, q, k, v, {"a": b, "b": a, "g": gk}, mode="recurrent",
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, reverse=reverse,
    )  # fmt: skip


@SWAPPED
def chunk_iplr_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_iplr_delta_rule``: S_t = (I + b_t a_t^T) S_{t-1} + k_t v_t^T in chunks;
    ``chunk_size`` by keyword (a power of 2, 64 by default); other keywords are swallowed."""
    _core.no_head_first(kwargs)
    C = _core.check_chunk_size(kwargs.pop("chunk_size", None), None, "IPLR")
    check_vectors(k, v, a=a, b=b)
    return _core.run_op(
        generalized_delta_rule, q, k, v, {"a": b, "b": a, "g": None}, mode="chunk",
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, chunk_size=C, out="q",
    )  # fmt: skip


@SWAPPED
def fused_recurrent_iplr_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """fla's ``fused_recurrent_iplr_delta_rule``: the token loop; ``scale`` must be positive."""
    _checks.scale(scale)  # a number before it is compared
    if scale is not None and not scale > 0:
        raise ValueError("scale must be positive")
    check_vectors(k, v, a=a, b=b)
    return _core.run_op(
        generalized_delta_rule, q, k, v, {"a": b, "b": a, "g": None}, mode="recurrent",
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip
