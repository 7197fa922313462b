"""fla's preconditioned Kimi Delta Attention: ``chunk_precond_kda`` and
``fused_recurrent_precond_kda`` (Preconditioned DeltaNet, arXiv:2604.21100, with KDA's gate).

    A_t = exp(g_atk_t) A_{t-1} + beta_atk_t k_t^2,   kp_t = x^(-s(A_t)) * k_t
    S_t = Diag(exp g_t) S_{t-1} + beta_t kp_t (v_t - (Diag(exp g_t) S_{t-1})^T k_t)^T
    o_t = S_t^T (scale q_t)

on ``linattn.ops.precond_delta_rule`` with a per-key-channel gate g [B, T, HV, K] (the
preconditioner's scan, then the generalized delta rule; no kernel of its own). Returns fla's
triple (o, final state [N, HV, K, V], final ATK state [N, H, K]); ``chunk_precond_kda`` with
``return_intermediate_states`` also returns h [B, NT, HV, K, V] (the memory entering each chunk
of 64, in k's dtype). KDA's in-kernel gate (``use_gate_in_kernel`` with A_log, dt_bias,
lower_bound) is ``linattn.compat.kda.kda_gate``.

Where fla's naive loop (``naive_recurrent_precond_kda``) and its kernels differ, this follows
the kernels: ``chunk_precond_kda`` always normalises q and k (fla passes
``use_qk_l2norm_in_kernel=True`` to its kernels unconditionally), ``fused_recurrent_precond_kda``
when ``use_qk_l2norm_in_kernel`` (default True), as ``x / sqrt(|x|^2 + 1e-6)``; the naive loop
never normalises. fla's chunk form takes no grouped value heads (q, k, g share one shape).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.kda import kda_gate
from linattn.compat.precond_gated_delta_rule import run_precond


def _gate(g: Tensor, use_gate_in_kernel: bool, A_log, dt_bias, lower_bound) -> Tensor:
    return kda_gate(g, A_log, dt_bias, lower_bound) if use_gate_in_kernel else g


def chunk_precond_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    g_atk: Tensor,
    beta_atk: Tensor,
    beta: Tensor,
    scale: float = None,
    initial_state: Tensor = None,
    initial_A_state: Tensor = None,
    output_final_state: bool = False,
    use_gate_in_kernel: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context: object | None = None,
    transpose_state_layout: bool = False,
    x: float = 1.5,
    eps: float = 1e-6,
    log_atk_scale: Tensor = None,
    solve_tril_precision: str | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    **kwargs: object,
) -> tuple[Tensor, ...]:
    """fla's ``chunk_precond_kda`` (the module docstring): g [B, T, H, K], g_atk, beta_atk, beta
    [B, T, H]; A_log [H] and dt_bias [H * K] by keyword with ``use_gate_in_kernel``;
    ``solve_tril_precision`` and ``disable_recompute`` (kernel choices) have no effect."""
    _core.check(
        q, k, v, g=(g, ("[B, T, H, K]",)), g_atk=(g_atk, ("[B, T, H]",)),
        beta_atk=(beta_atk, ("[B, T, H]",)), beta=(beta, ("[B, T, H]",)),
    )  # fmt: skip
    for name, t in (("g", g), ("g_atk", g_atk), ("beta_atk", beta_atk), ("beta", beta)):
        if t is None:
            raise ValueError(f"{name} must be given")
    if v.shape[2] != q.shape[2]:
        raise ValueError(
            f"v must be of shape (batch size, seq len, num of head, head dim) = "
            f"{(*q.shape[:3], v.shape[-1])}, got {tuple(v.shape)} (no grouped value heads)"
        )
    _core.check_cp(cp_context)
    _core.check_varlen(q, initial_state, cu_seqlens)
    _core.check_state_dtype(q, initial_state)
    if safe_gate and use_gate_in_kernel:
        if lower_bound is None:
            raise ValueError(
                "`lower_bound` must be specified when `safe_gate=True` and "
                "`use_gate_in_kernel=True`."
            )
        if not (-5 <= lower_bound < 0):
            raise ValueError(f"`lower_bound` must be in the safe range [-5, 0), got {lower_bound}.")
    A_log = dt_bias = None
    if use_gate_in_kernel:
        if "A_log" not in kwargs:
            raise ValueError("A_log must be provided when use_gate_in_kernel=True.")
        A_log, dt_bias = kwargs["A_log"], kwargs.get("dt_bias")
    g = _gate(g, use_gate_in_kernel, A_log, dt_bias, lower_bound)

    def run(q, k, v, g, g_atk, beta_atk, beta, S0, A0, final, varlen):
        return run_precond(
            q, k, v, g_atk=g_atk, beta_atk=beta_atk, beta=beta, g=g, mode="chunk", scale=scale,
            initial_state=S0, initial_A_state=A0, output_final_state=final, cu_seqlens=varlen,
            l2norm_qk=True, state_v_first=transpose_state_layout, x=x, eps=eps,
            log_atk_scale=log_atk_scale,
        )  # fmt: skip

    per_token = (q, k, v, g, g_atk, beta_atk, beta)
    if not return_intermediate_states:
        return run(*per_token, initial_state, initial_A_state, output_final_state, cu_seqlens)
    if not torch.is_inference_mode_enabled():
        raise ValueError("return_intermediate_states is only allowed in inference mode")
    if disable_recompute:
        raise ValueError("return_intermediate_states must be used with disable_recompute=False")
    # The memory entering each chunk of each sequence, chunk by chunk (both states carried).
    bounds = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    B, H, K, V = q.shape[0], v.shape[2], k.shape[3], v.shape[3]
    shape = (B, H, V, K) if transpose_state_layout else (B, H, K, V)
    outs, finals, finals_A, h = [], [], [], []
    for n in range(len(bounds) - 1):
        varlen = cu_seqlens is not None
        S = initial_state if not varlen or initial_state is None else initial_state[n : n + 1]
        A = initial_A_state if not varlen or initial_A_state is None else initial_A_state[n : n + 1]
        if S is None:
            S = q.new_zeros(shape, dtype=torch.float32)
        for s in range(bounds[n], bounds[n + 1], _core.CHUNK):
            e = min(s + _core.CHUNK, bounds[n + 1])
            h.append(S)
            o, S, A = run(*(t[:, s:e] for t in per_token), S, A, True, None)
            outs.append(o)
        finals.append(S)
        finals_A.append(q.new_zeros((1, q.shape[2], K), dtype=torch.float32) if A is None else A)
    h = torch.stack(h, dim=1).to(k.dtype)
    o, S, A = torch.cat(outs, 1), torch.cat(finals, 0), torch.cat(finals_A, 0)
    return o, *((S, A) if output_final_state else (None, None)), h


def fused_recurrent_precond_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    g_atk: Tensor,
    beta_atk: Tensor,
    beta: Tensor,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor = None,
    initial_A_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    use_gate_in_kernel: bool = False,
    lower_bound: float | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    transpose_state_layout: bool = False,
    x: float = 1.5,
    eps: float = 1e-6,
    log_atk_scale: Tensor = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """fla's ``fused_recurrent_precond_kda`` (the module docstring), linattn's recurrent form:
    g, g_atk, beta_atk, beta per value head (g [B, T, HV, K], the others [B, T, HV]), the ATK
    state [N, HV, K] and log_atk_scale [HV] too, as fla's kernel (unlike
    ``fused_recurrent_precond_gated_delta_rule``, whose ATK state is per key head); other
    keywords are swallowed as in fla."""
    _core.check(
        q, k, v, g=(g, ("[B, T, HV, K]",)), g_atk=(g_atk, ("[B, T, HV]",)),
        beta_atk=(beta_atk, ("[B, T, HV]",)), beta=(beta, ("[B, T, HV]",)),
    )  # fmt: skip
    for name, t in (("g", g), ("beta", beta)):
        if t is None:
            raise ValueError(f"{name} must be given")
    g = _gate(g, use_gate_in_kernel, A_log, dt_bias, lower_bound)
    # fla's recurrent kernel keeps one ATK state per value head (g_atk, beta_atk [B, T, HV],
    # initial_A_state [N, HV, K], log_atk_scale [HV]), of the key its head reads: q and k
    # repeated to the value heads make that the op's one state per key head.
    G = v.shape[2] // q.shape[2] if q.shape[2] else 1
    if G > 1:
        q, k = q.repeat_interleave(G, dim=2), k.repeat_interleave(G, dim=2)
    return run_precond(
        q, k, v, g_atk=g_atk, beta_atk=beta_atk, beta=beta, g=g, mode="recurrent", scale=scale,
        initial_state=initial_state, initial_A_state=initial_A_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        l2norm_qk=use_qk_l2norm_in_kernel, state_v_first=transpose_state_layout, x=x, eps=eps,
        log_atk_scale=log_atk_scale,
    )  # fmt: skip
