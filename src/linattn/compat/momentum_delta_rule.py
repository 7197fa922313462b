"""fla's momentum delta rule: ``chunk_momentum_delta_rule`` and
``fused_recurrent_momentum_delta_rule`` (Momentum DeltaNet, arXiv:2605.05838).

    w_t = v_t - S_{t-1}^T p'_t,   M_t = mu_t M_{t-1} - eta_t k_t w_t^T,
    S_t = alpha_t S_{t-1} - beta_t M_t,   o_t = S_t^T (scale q_t)

(alpha = exp(log_alpha), mu = exp(log_mu); p'_t = alpha_t p_t with ``use_p_times_alpha``, else
p_t; p defaults to k, beta and eta to ones) on ``linattn.ops.momentum_delta_rule``, its own op
(a second state, M). fla's state layout: ``initial_state`` and the final state stack the memory
and the momentum, [2, N, H, K, V]. ``use_qk_l2norm_in_kernel`` (default True) normalises q, k
and p as ``x / sqrt(|x|^2 + 1e-6)``.

fla 0.6.0 computes both entry points with PyTorch reference code (no Triton kernel of its own);
its chunk path (``chunk_momentum_delta_rule_ref``) takes log(beta + 1e-6) where the recurrence
has beta, so it differs from its own recurrent path by about 1e-6 relative; both entry points
here compute the recurrence exactly (the chunk form as linattn's chunk form). fla refuses
``cu_seqlens`` (NotImplementedError) and float32 in the chunk entry point; linattn computes both.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.ops.momentum_delta_rule import momentum_delta_rule


def _run(
    q, k, v, log_alpha, log_mu, p, beta, eta, scale, initial_state, output_final_state,
    cu_seqlens, use_qk_l2norm_in_kernel, use_p_times_alpha, mode, chunk_size,
):  # fmt: skip
    _core.check(
        q, k, v, log_alpha=(log_alpha, ("[B, T, H]",)), log_mu=(log_mu, ("[B, T, H]",)),
        p=(p, ("[B, T, H, K]",)), beta=(beta, ("[B, T, H]",)), eta=(eta, ("[B, T, H]",)),
    )  # fmt: skip
    for name, t in (("log_alpha", log_alpha), ("log_mu", log_mu)):
        if t is None:
            raise ValueError(f"{name} must be given")
    if v.shape[2] != q.shape[2]:
        raise ValueError(f"v must have q's H = {q.shape[2]} heads, got {tuple(v.shape)}")
    if initial_state is not None:
        _core.check_tensor("initial_state", initial_state)
    _core.check_varlen(q, None, cu_seqlens)
    dtype = _core.promote(q, k, v, p, log_alpha, log_mu, beta, eta)
    out_dtype = q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    p = k if p is None else p.to(dtype)
    log_alpha, log_mu = log_alpha.to(dtype), log_mu.to(dtype)
    beta = torch.ones_like(q[..., 0]) if beta is None else beta.to(dtype)
    eta = torch.ones_like(q[..., 0]) if eta is None else eta.to(dtype)
    o, state = momentum_delta_rule(
        q, k, v, p, log_alpha, log_mu, beta, eta, scale=scale, mode=mode, chunk_size=chunk_size,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm_in_kernel,
        use_p_times_alpha=use_p_times_alpha,
    )  # fmt: skip
    return o.to(out_dtype), state


def chunk_momentum_delta_rule(
    q,
    k,
    v,
    log_alpha,
    log_mu,
    p=None,
    beta=None,
    eta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=True,
    use_p_times_alpha=True,
    chunk_size=64,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_momentum_delta_rule`` (the module docstring): q, k, p [B, T, H, K],
    v [B, T, H, V], log_alpha, log_mu, beta, eta [B, T, H]; chunk_size 16, 32 or 64;
    returns (o, final state [2, N, H, K, V] or None)."""
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"`chunk_size` must be 16, 32, or 64, got {chunk_size}.")
    return _run(
        q, k, v, log_alpha, log_mu, p, beta, eta, scale, initial_state, output_final_state,
        cu_seqlens, use_qk_l2norm_in_kernel, use_p_times_alpha, "chunk", chunk_size,
    )  # fmt: skip


def fused_recurrent_momentum_delta_rule(
    q,
    k,
    v,
    log_alpha,
    log_mu,
    p=None,
    beta=None,
    eta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=True,
    use_p_times_alpha=True,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_momentum_delta_rule`` (the module docstring), linattn's
    recurrent form; returns (o, final state [2, N, H, K, V] or None)."""
    return _run(
        q, k, v, log_alpha, log_mu, p, beta, eta, scale, initial_state, output_final_state,
        cu_seqlens, use_qk_l2norm_in_kernel, use_p_times_alpha, "recurrent", _core.CHUNK,
    )  # fmt: skip
