"""fla's RWKV-6 ops: ``chunk_rwkv6`` and ``fused_recurrent_rwkv6``.

    o_t = (S_{t-1} + Diag(u) k_t v_t^T)^T (scale r_t),    S_t = Diag(exp w_t) S_{t-1} + k_t v_t^T

as fla 0.6.0's ``naive_recurrent_rwkv6`` and its kernels compute it: r is the query, w the
log-decay per key channel [B, T, H, K] (applied after the token's read), u the bonus [H, K].
They run ``linattn.ops.rwkv6`` (its chunk and recurrent forms), with fla's conventions
(``_core.run_op``): o in v's dtype, final states float32 (float64 for float64 inputs).
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.ops import checks as _checks
from linattn.ops import rwkv6


def _run(r, k, v, w, u, *, mode: str, **options) -> tuple[Tensor, Tensor | None]:
    """fla's checks (r, k, v, w [B, T, H, K], u [H, K]), then ``rwkv6`` through ``run_op``;
    r and w under their own names (finite; a log-decay <= 0), which the op calls q and g."""
    _core.check(r, k, v, ("r", "k", "v"), w=(w, ("[B, T, HV, K]",)), u=(u, ("[HV, K]",)))
    if w is None or u is None:
        raise TypeError(f"{'w' if w is None else 'u'} must be a torch.Tensor, got NoneType")
    _checks.tensor("r", r, 4)
    _checks.gate(w, *w.shape[:3], k.shape[-1], name="w", channel_only=True)

    def op(q, k, v, g, **common):
        return rwkv6(q, k, v, g, u, **common)

    return _core.run_op(op, r, k, v, {"g": w}, mode=mode, out="v", **options)


def chunk_rwkv6(
    r: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    u: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_rwkv6``: RWKV-6 in chunks (``chunk_size`` a power of 2, default 64)."""
    if "head_first" in kwargs:
        raise DeprecationWarning(
            "head_first has been removed. Inputs must be in `[B, T, H, ...]` format."
        )
    chunk_size = _core.check_chunk_size(kwargs.pop("chunk_size", None), None, "chunk_rwkv6")
    return _run(
        r, k, v, w, u, mode="chunk", scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=chunk_size,
    )  # fmt: skip


def fused_recurrent_rwkv6(
    r: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    u: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_rwkv6``: the token loop (``reverse``: last token first)."""
    return _run(
        r, k, v, w, u, mode="recurrent", scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, reverse=reverse,
    )  # fmt: skip
