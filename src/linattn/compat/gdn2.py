"""fla's Gated DeltaNet-2 (``fla.ops.gdn2``): ``chunk_gdn2`` and ``fused_recurrent_gdn2``.

    S_t = (I - k_t (b_t * k_t)^T) Diag(exp g_t) S_{t-1} + k_t (w_t * v_t)^T

and o_t = S_t^T (scale q_t) (``linattn.ops.gated_deltanet2``): g [B, T, HV, K] a per-channel
log-decay, b [B, T, HV, K] the per-channel erase gate, w [B, T, HV, V] the per-channel write gate;
grouped value heads in the recurrent form (fla's chunk form asserts HV = H). In-kernel options
as KDA's (``compat.kda.kda_gate``: ``use_gate_in_kernel`` with ``A_log`` [HV], ``dt_bias``
[HV * K], ``lower_bound``) and ``use_qk_l2norm_in_kernel``; states [N, HV, K, V] or, with
``state_v_first``, [N, HV, V, K]. fla exports these from ``fla.ops.gdn2`` only (not ``fla.ops``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.kda import kda_gate
from linattn.dtypes import compute_dtype
from linattn.ops.dplr_family import gated_deltanet2
from linattn.ops.functional import l2norm

CHUNK = 64  # fla's GDN-2 chunk kernels take 64 only


def _prepare(q, k, g, use_l2norm, use_gate, A_log, dt_bias, lower_bound):
    """The in-kernel gate and l2norm, in float32 (float64 stays). fla's recurrent kernel reads
    A_log as 1.0 when it is None (the gate -e softplus(g + dt_bias) without lower_bound)."""
    if use_gate:
        if A_log is None and lower_bound is None:
            A_log = g.new_ones(g.shape[2], dtype=torch.float32)
        g = kda_gate(g, A_log, dt_bias, lower_bound)
    if use_l2norm:
        q, k = (l2norm(x.to(compute_dtype(x.dtype))) for x in (q, k))
    return q, k, g


def _check_types(g: object, b: object, w: object) -> None:
    """g, b, w floating tensors, before their shapes are read."""
    for name, x in (("g", g), ("b", b), ("w", w)):
        _core.check_tensor(name, x)


def _check_chunk_shapes(q: Tensor, k: Tensor, v: Tensor, g: Tensor, b: Tensor, w: Tensor):
    """fla's asserts in ``chunk_gdn2``, as ValueError."""
    if not q.shape == k.shape == g.shape:
        raise ValueError("q, k, g must have the same shape.")
    if k.shape[-1] > 256:
        raise ValueError(f"GDN-2 only supports key headdim <= 256, got {k.shape[-1]}.")
    if b.shape != q.shape:
        raise ValueError(
            f"b (channel-wise erase gate) must have shape [B, T, H, K] matching q; "
            f"got {tuple(b.shape)} vs q {tuple(q.shape)}."
        )
    if w.shape != v.shape:
        raise ValueError(
            f"w (channel-wise write gate) must have shape [B, T, H, V] matching v; "
            f"got {tuple(w.shape)} vs v {tuple(v.shape)}."
        )
    if v.shape != (*q.shape[:3], v.shape[-1]):
        raise ValueError(
            f"v must have shape [B, T, H, V] matching q on (B, T, H); "
            f"got {tuple(v.shape)} vs q {tuple(q.shape)}."
        )


def _check_chunk_options(kwargs, use_gate_in_kernel, safe_gate, lower_bound):
    """fla's option checks in ``chunk_gdn2``; returns (A_log, dt_bias)."""
    A_log, dt_bias = None, None
    if use_gate_in_kernel:
        A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
        if A_log is None and lower_bound is None:
            raise ValueError(
                "`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is "
                "not set."
            )
    chunk_size = kwargs.pop("chunk_size", CHUNK)
    if chunk_size != CHUNK:
        raise ValueError(f"`chunk_size` must be 64 for GDN-2, got {chunk_size}.")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(
                "`lower_bound` must be specified when `safe_gate=True` and "
                "`use_gate_in_kernel=True`."
            )
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    return A_log, dt_bias


def chunk_gdn2(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    b: Tensor,
    w: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cp_context: object | None = None,
    **kwargs: object,
) -> tuple[Tensor, ...]:
    """fla's ``chunk_gdn2`` (the module docstring); A_log, dt_bias and chunk_size (64) by
    keyword. ``return_intermediate_states`` (inference only) also returns the state entering
    each chunk, h [B, NT, H, K, V] in k's dtype."""
    _core.floating_qkv(q, k, v)
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check_cp(cp_context)
    _core.check_varlen(q, initial_state, cu_seqlens)
    _core.check_state_dtype(q, initial_state)
    A_log, dt_bias = _check_chunk_options(kwargs, use_gate_in_kernel, safe_gate, lower_bound)
    _check_types(g, b, w)
    _check_chunk_shapes(q, k, v, g, b, w)
    out = q.dtype
    q, k, g = _prepare(q, k, g, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                       lower_bound)  # fmt: skip

    def run(q, k, v, g, b, w, S0, final=output_final_state, varlen=cu_seqlens):
        return _core.run_op(
            gated_deltanet2, q, k, v, {"g": g, "b": b, "w": w}, mode="chunk", scale=scale,
            initial_state=S0, output_final_state=final, cu_seqlens=varlen, chunk_size=CHUNK,
            state_v_first=state_v_first, out=out,
        )  # fmt: skip

    if not return_intermediate_states:
        return run(q, k, v, g, b, w, initial_state)
    if not torch.is_inference_mode_enabled():
        raise ValueError("return_intermediate_states is only allowed in inference mode")
    if disable_recompute:
        raise ValueError("return_intermediate_states must be used with disable_recompute=False")
    o, S, h = _core.chunk_states(
        lambda *a: run(*a, final=True, varlen=None), q, k, v, (g, b, w), initial_state,
        cu_seqlens, CHUNK, state_v_first,
    )  # fmt: skip
    return o, S if output_final_state else None, h


def fused_recurrent_gdn2(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    b: Tensor,
    w: Tensor,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor]:
    """fla's ``fused_recurrent_gdn2``: the token loop (decoding), grouped value heads."""
    _core.floating_qkv(q, k, v)
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check_varlen(q, initial_state, cu_seqlens)
    _check_types(g, b, w)
    if b.shape != (*v.shape[:3], k.shape[-1]):
        raise ValueError(
            f"b must have shape [B, T, HV, K]; got {tuple(b.shape)} "
            f"vs expected {(*v.shape[:3], k.shape[-1])}."
        )
    if w.shape != v.shape:
        raise ValueError(
            f"w must have shape [B, T, HV, V] matching v; got {tuple(w.shape)} "
            f"vs v {tuple(v.shape)}."
        )
    q, k, g = _prepare(q, k, g, use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                       lower_bound)  # fmt: skip
    return _core.run_op(
        gated_deltanet2, q, k, v, {"g": g, "b": b, "w": w}, mode="recurrent", scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, state_v_first=state_v_first,
    )  # fmt: skip
