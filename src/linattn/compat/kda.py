"""fla's Kimi Delta Attention (KDA): ``chunk_kda`` and ``fused_recurrent_kda``.

S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T (scale q_t)
(spec section 10), g [B, T, HV, K] before beta [B, T, HV]; grouped value heads. In-kernel
options: ``use_gate_in_kernel`` (``kda_gate``), ``use_beta_sigmoid_in_kernel`` (with
``allow_neg_eigval``), ``use_qk_l2norm_in_kernel``; ``safe_gate`` needs ``lower_bound`` in
[-5, 0). ``return_intermediate_states`` (inference only) also returns the state entering each
chunk, h [B, NT, HV, K, V] in k's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops.functional import decay_gate


def kda_gate(
    g: Tensor, A_log: Tensor | None, dt_bias: Tensor | None, lower_bound: float | None
) -> Tensor:
    """KDA's gate from its raw input g [B, T, HV, K], computed in float32 (float64 stays):

    ``-exp(A_log) * softplus(g + dt_bias)``, or ``lower_bound * sigmoid(exp(A_log) (g + dt_bias))``
    when lower_bound is set (without A_log, ``lower_bound * sigmoid(g + dt_bias)``).
    A_log: [HV]; dt_bias: [HV * K] or [HV, K].
    """
    H, K = g.shape[2], g.shape[3]
    for name, p, n in (("A_log", A_log, H), ("dt_bias", dt_bias, H * K)):
        if p is not None and (not isinstance(p, Tensor) or p.numel() != n):
            got = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"{name} must hold {n} values ({name}: [HV] or [HV * K]), got {got}")
    x = g.to(compute_dtype(g.dtype))
    bias = None if dt_bias is None else dt_bias.to(x.dtype).reshape(H, K)
    A_log = None if A_log is None else A_log.to(x.dtype).reshape(H, 1)  # per head
    if lower_bound is None:
        if A_log is None:
            raise ValueError("use_gate_in_kernel=True needs A_log (or lower_bound)")
        return decay_gate(x, A_log, bias)
    x = x if bias is None else x + bias
    return lower_bound * torch.sigmoid(x if A_log is None else torch.exp(A_log) * x)


def chunk_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    cp_context: object | None = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs: object,
) -> tuple[Tensor, ...]:
    """fla's ``chunk_kda`` (the module docstring); A_log [HV], dt_bias [HV * K] and chunk_size
    (32 or 64) by keyword; ``use_graph`` and ``max_num_seqs`` (Ascend graph capture) have no
    effect here, and other keywords are swallowed as in fla."""
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check(q, k, v)
    _core.check_cp(cp_context)
    _core.check_varlen(q, initial_state, cu_seqlens)
    _core.check_state_dtype(q, initial_state)
    A_log = dt_bias = None
    if use_gate_in_kernel:
        A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
        if A_log is None and lower_bound is None:
            raise ValueError(
                "`A_log` must be provided when `use_gate_in_kernel=True` and `lower_bound` is "
                "not set."
            )
    C = _core.check_chunk_size(kwargs.pop("chunk_size", 64), (32, 64), "KDA")
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(
                "`lower_bound` must be specified when `safe_gate=True` and "
                "`use_gate_in_kernel=True`."
            )
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    _core.check_neg_eigval(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    B, T, H, K = q.shape
    HV = v.shape[2]
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape, got q={q.shape} vs k={k.shape}")
    if H and HV % H != 0:
        raise ValueError(
            f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_qk_heads (H={H}), "
            f"but got HV % H = {HV % H}"
        )
    if tuple(g.shape) != (B, T, HV, K):
        raise ValueError(f"g must have shape [B, T, HV, K]={[B, T, HV, K]}, got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, HV):
        raise ValueError(f"beta must have shape [B, T, HV]={[B, T, HV]}, got {list(beta.shape)}")
    gate = (lambda x: kda_gate(x, A_log, dt_bias, lower_bound)) if use_gate_in_kernel else None
    g, beta = _core.in_kernel(g, beta, gate, use_beta_sigmoid_in_kernel, allow_neg_eigval)

    def run(q, k, v, g, beta, S0, final=output_final_state, varlen=cu_seqlens):
        return _core.run(
            q, k, v, delta=True, mode="chunk", beta=beta, g=g, scale=scale, initial_state=S0,
            output_final_state=final, cu_seqlens=varlen, chunk_size=C,
            l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first, out="q",
        )  # fmt: skip

    if not return_intermediate_states:
        return run(q, k, v, g, beta, initial_state)
    if not torch.is_inference_mode_enabled():
        raise ValueError("return_intermediate_states is only allowed in inference mode")
    if disable_recompute:
        raise ValueError("return_intermediate_states must be used with disable_recompute=False")
    o, S, h = _core.chunk_states(
        lambda *a: run(*a, final=True, varlen=None), q, k, v, (g, beta), initial_state,
        cu_seqlens, C, state_v_first,
    )  # fmt: skip
    return o, S if output_final_state else None, h


def fused_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_kda``: the token loop of ``chunk_kda`` (decoding)."""
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check(q, k, v, g=(g, ("[B, T, HV, K]",)), beta=(beta, ("[B, T, HV]",)))
    _core.check_neg_eigval(allow_neg_eigval, use_beta_sigmoid_in_kernel)
    gate = (lambda x: kda_gate(x, A_log, dt_bias, lower_bound)) if use_gate_in_kernel else None
    g, beta = _core.in_kernel(g, beta, gate, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return _core.run(
        q, k, v, delta=True, mode="recurrent", beta=beta, g=g, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first,
    )  # fmt: skip
