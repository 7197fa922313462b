"""fla's scalar-decay linear attention: simple GLA, retention and lightning attention.

S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t) (spec section 10: one decay per
head, Mamba-2's / RetNet's). ``g`` [B, T, H] is data dependent, ``g_gamma`` [H] a constant per
head (both together multiply). Retention is g_gamma = log(1 - 2^(-5 - h)); lightning attention
g_gamma = -(8 / H) (1 - layer_idx / num_layers) h, for heads h = 0 .. H - 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype


def _gamma_gate(q: Tensor, g: Tensor | None, g_gamma: Tensor | None) -> Tensor | None:
    """g [B, T, H] and the constant g_gamma [H] as one gate [B, T, H]."""
    if g_gamma is None:
        return g
    H = q.shape[2]
    if not isinstance(g_gamma, Tensor) or tuple(g_gamma.shape) != (H,):
        raise ValueError(f"g_gamma must be a tensor of shape [H] = [{H}]")
    const = g_gamma.to(_core.promote(q, g_gamma)).expand(q.shape[0], q.shape[1], H)
    return const if g is None else g + const


def retention_gamma(H: int, device: torch.device | None = None) -> Tensor:
    """RetNet's decays: g_gamma_h = log(1 - 2^(-5 - h)), in float32 as fla computes them."""
    return (1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float, device=device))).log()


def lightning_gamma(H: int, layer_idx: int, num_layers: int, device=None) -> Tensor:
    """Lightning attention's decays: -(8 / H) (1 - layer_idx / num_layers) h, float32."""
    slope = -(8 / H * (1 - layer_idx / num_layers))
    return slope * torch.arange(H, dtype=torch.float, device=device)


def _simple(mode, q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens,
            reverse=False, state_v_first=False, chunk_size=None):  # fmt: skip
    _core.check(q, k, v, g=(g, ("[B, T, HV]",)))
    return _core.run(
        q, k, v, delta=False, mode=mode, g=_gamma_gate(q, g, g_gamma), scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, chunk_size=_core.check_chunk_size(chunk_size, None, "simple GLA"),
        reverse=reverse, state_v_first=state_v_first, out="q",
    )  # fmt: skip


def chunk_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    g_gamma: Tensor | None = None,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_simple_gla``: S_t = exp(g_t + g_gamma) S_{t-1} + k_t v_t^T (per head)."""
    _core.no_head_first(kwargs)
    return _simple(
        "chunk", q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens,
        state_v_first=state_v_first, chunk_size=kwargs.pop("chunk_size", None),
    )  # fmt: skip


def fused_chunk_simple_gla(
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
    """fla's ``fused_chunk_simple_gla``: ``chunk_simple_gla`` (another kernel)."""
    return _simple(
        "chunk", q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens
    )


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
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_simple_gla``: the token loop (last to first with reverse)."""
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    return _simple(
        "recurrent", q, k, v, g, g_gamma, scale, initial_state, output_final_state, cu_seqlens,
        reverse=reverse, state_v_first=state_v_first,
    )  # fmt: skip


def _attention_matrix(q: Tensor, k: Tensor, g: Tensor | None, scale: float | None) -> Tensor:
    """fla's ``output_attentions``: A[b, h, t, s] = scale q_t^T k_s exp(G_t - G_s), s <= t."""
    dtype = compute_dtype(_core.promote(q, k))
    K = q.shape[-1]
    scale = K**-0.5 if scale is None else scale
    A = torch.einsum("bthk,bshk->bhts", q.to(dtype), k.to(dtype)) * scale
    T = q.shape[1]
    if g is not None:
        G = g.to(dtype).cumsum(1).transpose(1, 2)  # [B, H, T]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        decay = (G[..., :, None] - G[..., None, :]).masked_fill(~mask, float("-inf")).exp()
        A = A * decay
    return A.tril().to(q.dtype)


def parallel_simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    output_attentions: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``parallel_simple_gla``: the masked T x T form (no states); with
    output_attentions, also the decayed scores [B, H, T, T] (not with cu_seqlens)."""
    _core.check(q, k, v, g=(g, ("[B, T, HV]",)))
    _core.check_varlen(q, None, cu_seqlens)
    if output_attentions and cu_seqlens is not None:
        raise ValueError("output_attentions=True is not supported with variable-length sequences")
    o, _ = _simple("parallel", q, k, v, g, None, scale, None, False, cu_seqlens)
    return o, _attention_matrix(q, k, g, scale) if output_attentions else None


# ---- retention: g_gamma = log(1 - 2^(-5 - h)) ---------------------------------------------------


def chunk_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_retention``: simple GLA with RetNet's constant decays per head."""
    _core.no_head_first(kwargs)
    _core.check(q, k, v)
    gamma = retention_gamma(q.shape[2], q.device)
    return _simple(
        "chunk", q, k, v, None, gamma, scale, initial_state, output_final_state, cu_seqlens,
        chunk_size=kwargs.pop("chunk_size", None),
    )  # fmt: skip


def fused_chunk_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_chunk_retention``: ``chunk_retention`` (another kernel)."""
    _core.check(q, k, v)
    gamma = retention_gamma(q.shape[2], q.device)
    return _simple(
        "chunk", q, k, v, None, gamma, scale, initial_state, output_final_state, cu_seqlens
    )


def fused_recurrent_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_retention``: the token loop of ``chunk_retention``."""
    state_v_first = _core.renamed_layout(kwargs, state_v_first)
    _core.check(q, k, v)
    gamma = retention_gamma(q.shape[2], q.device)
    return _simple(
        "recurrent", q, k, v, None, gamma, scale, initial_state, output_final_state, cu_seqlens,
        reverse=reverse, state_v_first=state_v_first,
    )  # fmt: skip


def parallel_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    output_attentions: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``parallel_retention``: ``parallel_simple_gla`` with RetNet's decays as g."""
    _core.check_varlen(q, None, cu_seqlens)
    _core.check(q, k, v)
    gamma = retention_gamma(q.shape[2], q.device)
    g = gamma[None, None, :].expand(q.shape[0], q.shape[1], q.shape[2])
    return parallel_simple_gla(q, k, v, g, scale, output_attentions, cu_seqlens)


# ---- lightning attention: g_gamma = -(8 / H) (1 - layer_idx / num_layers) h -------------------


def chunk_lightning_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layer_idx: int,
    num_layers: int,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_lightning_attn``: simple GLA with lightning attention's slopes."""
    _core.no_head_first(kwargs)
    _core.check(q, k, v)
    gamma = lightning_gamma(q.shape[2], layer_idx, num_layers, q.device)
    return _simple(
        "chunk", q, k, v, None, gamma, scale, initial_state, output_final_state, cu_seqlens,
        chunk_size=kwargs.pop("chunk_size", None),
    )  # fmt: skip


def fused_recurrent_lightning_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layer_idx: int,
    num_layers: int,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_lightning_attn``: the token loop of ``chunk_lightning_attn``."""
    _core.check(q, k, v)
    gamma = lightning_gamma(q.shape[2], layer_idx, num_layers, q.device)
    return _simple(
        "recurrent", q, k, v, None, gamma, scale, initial_state, output_final_state, cu_seqlens,
        reverse=reverse,
    )  # fmt: skip
