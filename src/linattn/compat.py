"""Drop-in entry points with flash-linear-attention's (fla's) names, argument order and defaults.

Swap ``from fla.ops.gated_delta_rule import chunk_gated_delta_rule`` for
``from linattn.compat import chunk_gated_delta_rule`` to run the same call on the CPU (or any
device) through linattn's ops, and cross-check. Signatures follow fla-org/flash-linear-attention
(checked against its ``fla/ops/*`` sources, 2025-2026): layout ``[B, T, H, D]``, states
``[N, H, K, V]`` in float32, ``scale=None`` meaning ``1 / sqrt(K)``, log-space gates (natural log,
g <= 0), ``cu_seqlens`` with B = 1. Every ``chunk_*`` function runs ``mode="chunk"`` with
chunk_size 64 and every ``fused_recurrent_*`` function ``mode="recurrent"``.

Conventions that differ from linattn's own ops, converted here explicitly:

- Argument order: fla's gated delta rule and KDA take ``g`` *before* ``beta``
  (``chunk_gated_delta_rule(q, k, v, g, beta)``); linattn's ``delta_rule(q, k, v, beta, g)``.
- ``fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, ...)``: ``g``
  is the per-head gate [B, T, H], ``gk`` the per-key-channel gate [B, T, H, K]; beta defaults to
  ones. Note that a positional call ``(q, k, v, g, beta)`` binds beta to ``gk`` in this signature
  (as in fla); pass ``beta=`` by keyword.
- KDA's gate options: ``use_gate_in_kernel=True`` takes the raw gate input and computes
  ``g = -exp(A_log) * softplus(g + dt_bias)`` (A_log [H], dt_bias [H * K]); with ``lower_bound``
  set, ``g = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (without A_log:
  ``lower_bound * sigmoid(g + dt_bias)``). ``use_beta_sigmoid_in_kernel=True`` takes beta logits
  and applies ``sigmoid`` (times 2 with ``allow_neg_eigval=True``).
- ``chunk_linear_attn``'s ``normalize`` defaults to True (fla's default); its normaliser, as in
  fla, is ``(scale q_t)^T sum_{s <= t} k_s`` over this call's keys only (it is not carried in the
  state). ``fused_recurrent_linear_attn``'s ``normalize`` defaults to False.
- Not supported (a ValueError says so): ``head_first=True``, ``reverse=True``, ``gv`` (decay of
  the value channels), ``state_v_first=True``, grouped value heads (HV != H). Flags that only
  change fla's kernels (``safe_gate``, ``disable_recompute``, ``cu_seqlens_cpu``) are accepted and
  have no effect.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import delta_rule, linear_attention

CHUNK = 64  # fla's chunk size


def _unsupported(**flags: object) -> None:
    """Raise ValueError for any fla option that linattn does not implement."""
    for name, value in flags.items():
        if value not in (None, False):
            raise ValueError(f"{name}={value!r} is not supported by linattn.compat")


def _linear(mode, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens):
    return linear_attention(
        q, k, v, g, scale=scale, mode=mode, chunk_size=CHUNK, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip


def _delta(mode, q, k, v, beta, g, scale, initial_state, output_final_state, l2norm, cu_seqlens):
    return delta_rule(
        q, k, v, beta, g, scale=scale, mode=mode, chunk_size=CHUNK, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, use_qk_l2norm=l2norm,
    )  # fmt: skip


def _normalized(mode, q, k, v, scale, initial_state, output_final_state, normalize):
    """fla's linear attention: with normalize, divide by (scale q_t)^T sum_{s <= t} k_s.

    linattn's normaliser is the column z of a [K, V + 1] state; fla's starts from zero in every
    call, so the given state gets a zero z column and the returned state loses it again.
    """
    if not normalize:
        return _linear(mode, q, k, v, None, scale, initial_state, output_final_state, None)
    if initial_state is not None:
        initial_state = torch.cat([initial_state, torch.zeros_like(initial_state[..., :1])], -1)
    o, S = linear_attention(
        q, k, v, normalize=True, scale=scale, mode=mode, chunk_size=CHUNK,
        initial_state=initial_state, output_final_state=output_final_state,
    )  # fmt: skip
    return o, None if S is None else S[..., :-1]


# ---- linear attention (additive rule) -----------------------------------------------------------


def chunk_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    normalize: bool = True,
    head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_linear_attn``: S_t = S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t), normalised
    by default (see the module docstring)."""
    _unsupported(head_first=head_first)
    return _normalized("chunk", q, k, v, scale, initial_state, output_final_state, normalize)


def fused_recurrent_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    normalize: bool = False,
    head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_linear_attn``: the token loop; normalize defaults to False."""
    _unsupported(head_first=head_first)
    return _normalized("recurrent", q, k, v, scale, initial_state, output_final_state, normalize)


def _head_gate(q: Tensor, g: Tensor | None, g_gamma: Tensor | None) -> Tensor | None:
    """Simple GLA's gate: g [B, T, H], or the data-independent g_gamma [H] broadcast to it."""
    if g is not None and g_gamma is not None:
        raise ValueError("pass only one of g and g_gamma")
    if g_gamma is None:
        return g
    if not isinstance(g_gamma, Tensor) or tuple(g_gamma.shape) != (q.shape[2],):
        raise ValueError(f"g_gamma must be a tensor of shape [H] = [{q.shape[2]}]")
    return g_gamma.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2])


def chunk_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    g_gamma: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_simple_gla``: S_t = exp(g_t) S_{t-1} + k_t v_t^T (one decay per head)."""
    g = _head_gate(q, g, g_gamma)
    return _linear("chunk", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


def fused_recurrent_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    g_gamma: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_simple_gla``: the token loop of ``chunk_simple_gla``."""
    _unsupported(reverse=reverse)
    g = _head_gate(q, g, g_gamma)
    return _linear("recurrent", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


def chunk_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_gla``: S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, g [B, T, H, K]."""
    _unsupported(head_first=head_first)
    return _linear("chunk", q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


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
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_gla``: the token loop of ``chunk_gla`` (gate ``gk``)."""
    _unsupported(gv=gv is not None, reverse=reverse)
    return _linear("recurrent", q, k, v, gk, scale, initial_state, output_final_state, cu_seqlens)


# ---- the delta rule and its gated forms ---------------------------------------------------------


def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_delta_rule``: S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T."""
    _unsupported(head_first=head_first)
    return _delta(
        "chunk",
        q,
        k,
        v,
        beta,
        None,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        cu_seqlens,
    )


def fused_recurrent_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_delta_rule``: the token loop; beta defaults to ones."""
    beta = torch.ones_like(q[..., 0]) if beta is None else beta
    return _delta(
        "recurrent",
        q,
        k,
        v,
        beta,
        None,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        cu_seqlens,
    )


def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_gated_delta_rule`` (g before beta): S_t = exp(g_t) (I - beta_t k_t k_t^T)
    S_{t-1} + beta_t k_t v_t^T, g [B, T, H]."""
    _unsupported(head_first=head_first)
    return _delta(
        "chunk",
        q,
        k,
        v,
        beta,
        g,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        cu_seqlens,
    )


def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    gk: Tensor | None = None,
    gv: Tensor | None = None,
    beta: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_gated_delta_rule``: g [B, T, H] (Gated DeltaNet) or gk [B, T, H, K]
    (the per-channel decay of KDA); beta defaults to ones."""
    _unsupported(gv=gv is not None)
    if g is not None and gk is not None:
        raise ValueError("pass only one of g (per head) and gk (per key channel)")
    beta = torch.ones_like(q[..., 0]) if beta is None else beta
    return _delta(
        "recurrent",
        q,
        k,
        v,
        beta,
        g if gk is None else gk,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        cu_seqlens,
    )


def kda_gate(
    g: Tensor, A_log: Tensor | None, dt_bias: Tensor | None, lower_bound: float | None
) -> Tensor:
    """KDA's gate from its raw input g [B, T, H, K], computed in float32 (float64 stays):

    ``-exp(A_log) * softplus(g + dt_bias)``, or ``lower_bound * sigmoid(exp(A_log) (g + dt_bias))``
    when lower_bound is set (without A_log, ``lower_bound * sigmoid(g + dt_bias)``).
    A_log: [H]; dt_bias: [H * K] or [H, K].
    """
    H, K = g.shape[2], g.shape[3]
    x = g.to(compute_dtype(g.dtype))
    if dt_bias is not None:
        x = x + dt_bias.to(x.dtype).reshape(H, K)
    rate = None if A_log is None else torch.exp(A_log.to(x.dtype)).reshape(H, 1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(x if rate is None else rate * x)
    if rate is None:
        raise ValueError("use_gate_in_kernel=True needs A_log (or lower_bound)")
    return -rate * F.softplus(x)


def _kda(mode, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, gate_in,
         beta_sigmoid, neg_eig, lower_bound, A_log, dt_bias, cu_seqlens):  # fmt: skip
    if gate_in:
        g = kda_gate(g, A_log, dt_bias, lower_bound)
    if beta_sigmoid:
        dtype = compute_dtype(beta.dtype)
        beta = torch.sigmoid(beta.to(dtype)) * (2.0 if neg_eig else 1.0)
    return _delta(
        mode, q, k, v, beta, g, scale, initial_state, output_final_state, l2norm, cu_seqlens
    )


def _kwargs(kwargs: dict) -> tuple[Tensor | None, Tensor | None]:
    """chunk_kda receives A_log and dt_bias through **kwargs in fla; anything else is an error."""
    unknown = set(kwargs) - {"A_log", "dt_bias", "cu_seqlens_cpu", "disable_recompute"}
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    return kwargs.get("A_log"), kwargs.get("dt_bias")


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
    cu_seqlens: Tensor | None = None,
    state_v_first: bool = False,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_kda`` (g before beta): S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1}
    + beta_t k_t v_t^T, g [B, T, H, K]; A_log and dt_bias by keyword (see ``kda_gate``)."""
    _unsupported(state_v_first=state_v_first)
    A_log, dt_bias = _kwargs(kwargs)
    return _kda(
        "chunk",
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        use_gate_in_kernel,
        use_beta_sigmoid_in_kernel,
        allow_neg_eigval,
        lower_bound,
        A_log,
        dt_bias,
        cu_seqlens,
    )


def fused_recurrent_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
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
    """fla's ``fused_recurrent_kda``: the token loop of ``chunk_kda`` (generation)."""
    _unsupported(state_v_first=state_v_first)
    _kwargs(kwargs)
    return _kda(
        "recurrent",
        q,
        k,
        v,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        use_qk_l2norm_in_kernel,
        use_gate_in_kernel,
        use_beta_sigmoid_in_kernel,
        allow_neg_eigval,
        lower_bound,
        A_log,
        dt_bias,
        cu_seqlens,
    )
