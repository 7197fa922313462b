"""fla's preconditioned gated delta rule: ``chunk_precond_gated_delta_rule`` and
``fused_recurrent_precond_gated_delta_rule`` (Preconditioned DeltaNet, arXiv:2604.21100).

    A_t = exp(g_atk_t) A_{t-1} + beta_atk_t k_t^2,   kp_t = x^(-s(A_t)) * k_t
    S_t = exp(g_t) S_{t-1} + beta_t kp_t (v_t - (exp(g_t) S_{t-1})^T k_t)^T
    o_t = S_t^T (scale q_t)

on ``linattn.ops.precond_delta_rule`` (the ATK state's scan, then the generalized delta rule;
no kernel of its own). Returns fla's triple (o, final state [N, HV, K, V], final ATK state
[N, H, K]). Grouped value heads share their key head's ATK state.

Where fla's naive loop (``naive_recurrent_precond_gated_delta_rule``) and its kernels differ,
this follows the kernels: q, k are normalised as ``x / sqrt(|x|^2 + 1e-6)`` (the naive loop uses
``F.normalize``, ``x / max(|x|, 1e-12)``) and only with ``use_qk_l2norm_in_kernel`` (the naive
loop always normalises). The recurrent form also takes ``gk`` [B, T, HV, K], ``gv``
[B, T, HV, V] and a per-value-channel beta [B, T, HV, V], as fla's kernel does: each value
channel then runs as a head of its own (``_core.split_columns``; exact, the columns of S evolve
independently).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.ops.precond_delta_rule import precond_delta_rule


def run_precond(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    g_atk: Tensor,
    beta_atk: Tensor,
    beta: Tensor,
    g: Tensor | None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    mode: str,
    scale: float | None,
    initial_state: Tensor | None,
    initial_A_state: Tensor | None,
    output_final_state: bool,
    cu_seqlens: Tensor | None,
    l2norm_qk: bool,
    state_v_first: bool,
    x: float,
    eps: float,
    log_atk_scale: Tensor | float | None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One call of ``precond_delta_rule`` with fla's conventions (``_core``): dtypes promoted,
    o in v's dtype, states float32 (float64 for float64 inputs), the V-first layout, q and k
    normalised in-kernel, and gv / per-value-channel beta as one head per value channel.
    Shapes are checked by the caller (``_core.check``)."""
    for name, t in (("g_atk", g_atk), ("beta_atk", beta_atk)):
        if t is None:
            raise ValueError(f"{name} must be given (the ATK preconditioner's {name})")
        _core.check_tensor(name, t)
    layout = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
    _core.check_varlen(q, initial_state, cu_seqlens, layout)
    if initial_A_state is not None:
        _core.check_tensor("initial_A_state", initial_A_state)
    dtype = _core.promote(q, k, v, beta, g, gk, gv)
    out_dtype = v.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    beta = beta.to(dtype)
    g, gk, gv = (None if t is None else t.to(dtype) for t in (g, gk, gv))
    HV, V = v.shape[2], v.shape[3]
    S0 = _core.state_in(initial_state, dtype, state_v_first)
    gate, split = _core.total_gate(g, gk, gv, V)
    split = split or beta.dim() == 4
    if split:
        v, beta, gate, S0 = _core.split_columns(v, beta, gate, S0, V)
    o, S, A = precond_delta_rule(
        q, k, v, g_atk.to(dtype), beta_atk.to(dtype), beta, gate, x=x, eps=eps,
        log_atk_scale=log_atk_scale, scale=scale, mode=mode, chunk_size=_core.CHUNK,
        initial_state=S0, initial_A_state=initial_A_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, use_qk_l2norm=l2norm_qk,
    )  # fmt: skip
    if split:
        o, S = _core.join_columns(o, S, HV, V)
    return o.to(out_dtype), _core.state_out(S, dtype, state_v_first), A


def chunk_precond_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g_atk: Tensor,
    g: Tensor,
    beta_atk: Tensor,
    beta: Tensor,
    scale: float = None,
    initial_state: Tensor = None,
    initial_A_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: object | None = None,
    transpose_state_layout: bool = False,
    x: float = 1.5,
    eps: float = 1e-6,
    log_atk_scale: Tensor = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """fla's ``chunk_precond_gated_delta_rule`` (the module docstring): g_atk, beta_atk [B, T, H];
    g, beta [B, T, HV]; log_atk_scale None (-0.2), a float or [H]; linattn's chunk form."""
    _core.check(
        q, k, v, g_atk=(g_atk, ("[B, T, H]",)), g=(g, ("[B, T, HV]",)),
        beta_atk=(beta_atk, ("[B, T, H]",)), beta=(beta, ("[B, T, HV]",)),
    )  # fmt: skip
    for name, t in (("g", g), ("beta", beta)):
        if t is None:
            raise ValueError(f"{name} must be given")
    _core.check_cp(cp_context)
    return run_precond(
        q, k, v, g_atk=g_atk, beta_atk=beta_atk, beta=beta, g=g, mode="chunk", scale=scale,
        initial_state=initial_state, initial_A_state=initial_A_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        l2norm_qk=use_qk_l2norm_in_kernel, state_v_first=transpose_state_layout, x=x, eps=eps,
        log_atk_scale=log_atk_scale,
    )  # fmt: skip


def fused_recurrent_precond_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    beta: Tensor | None = None,
    g_atk: Tensor = None,
    beta_atk: Tensor = None,
    scale: float = None,
    initial_state: Tensor = None,
    initial_A_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    cu_seqlens: torch.LongTensor | None = None,
    transpose_state_layout: bool = False,
    x: float = 1.5,
    eps: float = 1e-6,
    log_atk_scale: Tensor = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """fla's ``fused_recurrent_precond_gated_delta_rule`` (the module docstring), linattn's
    recurrent form: g [B, T, HV], gk [B, T, HV, K], gv [B, T, HV, V] (each optional), beta
    [B, T, HV] or [B, T, HV, V] (None: ones), g_atk and beta_atk [B, T, H] (required)."""
    _core.check(
        q, k, v, g=(g, ("[B, T, HV]",)), gk=(gk, ("[B, T, HV, K]",)),
        gv=(gv, ("[B, T, HV, V]",)), beta=(beta, ("[B, T, HV]", "[B, T, HV, V]")),
        g_atk=(g_atk, ("[B, T, H]",)), beta_atk=(beta_atk, ("[B, T, H]",)),
    )  # fmt: skip
    if beta is None:
        beta = torch.ones_like(v[..., 0])
    return run_precond(
        q, k, v, g_atk=g_atk, beta_atk=beta_atk, beta=beta, g=g, gk=gk, gv=gv,
        mode="recurrent", scale=scale, initial_state=initial_state,
        initial_A_state=initial_A_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, l2norm_qk=use_qk_l2norm_in_kernel,
        state_v_first=transpose_state_layout, x=x, eps=eps, log_atk_scale=log_atk_scale,
    )  # fmt: skip
