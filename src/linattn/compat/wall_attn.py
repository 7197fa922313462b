"""fla's ``parallel_wall_attn`` (fla.ops.wall_attn): softmax attention whose logits decay each
key channel between key and query (``linattn.ops.softmax_variants.wall_attention``); o in v's
dtype, as fla's kernel returns it; and ``parallel_wall_attn_decode``, its decoding step over the
key cache that fla's ``build_wall_kv_cache`` (PyTorch) rescales, written out as a masked
product."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.attn import _heads, _varlen
from linattn.dtypes import compute_dtype
from linattn.ops.softmax_variants import wall_attention


def parallel_wall_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    g_scalar: Tensor | None = None,
    sink_bias: Tensor | None = None,
    scale: float | None = None,
    window_size: int | None = None,
    cu_seqlens: torch.LongTensor | None = None,
) -> Tensor:
    """fla's ``parallel_wall_attn``: l_ts = scale sum_n q_tn k_sn exp(G_tn - G_sn) + C_t - C_s
    (G, C the cumulative sums of g [B, T, HQ, K] and g_scalar [B, T, HQ] in each sequence),
    o_t = sum_s exp(l_ts) v_s / (sum_s exp(l_ts) + exp(sink_bias)) over t - window_size < s <= t.
    """
    _heads(q, k, v)
    _core.check_tensor("g", g)
    _core.floating_tensor("g_scalar", g_scalar)
    _core.floating_tensor("sink_bias", sink_bias)
    _varlen(q, cu_seqlens)
    dtype = _core.promote(q, k, v, g, g_scalar, sink_bias)
    o = wall_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), g.to(dtype),
        g_scalar=None if g_scalar is None else g_scalar.to(dtype),
        sink_bias=None if sink_bias is None else sink_bias.to(dtype), scale=scale,
        window_size=window_size, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return o.to(v.dtype)


RCP_LN2 = 1.0 / math.log(2.0)  # fla's prefixes P and scalar-gate sums are in log2 units


def parallel_wall_attn_decode(
    q: Tensor,
    v: Tensor,
    p_curr: Tensor,
    k_tilde: Tensor,
    r_cache: Tensor,
    sink_bias: Tensor | None,
    scale: float,
    cache_chunk_size: int,
    g_scalar_cumsum: Tensor | None = None,
    window_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """fla's ``parallel_wall_attn_decode``: Wall attention of the last T_q positions against a
    cache whose keys fla's ``build_wall_kv_cache`` rescaled to their block's anchor
    (k~_j = k_j 2^(R_c(j) - P_j)), so that k~_j 2^(P_i - R_c(j)) = k_j 2^(P_i - P_j):

        l_ij = scale sum_n q_in k~_jn 2^(p_curr_in - R_c(j),n) + (C_i - C_j) ln 2,
        o_i = sum_j e^(l_ij) v_j / (sum_j e^(l_ij) + e^(sink)),   j <= T_kv - T_q + i,

    over the last ``window_size`` keys when given; C the scalar gate's cumulative sums (log2
    units, fla's ``g_scalar_cumsum``). q, p_curr [B, T_q, HQ, K], v [B, T_kv, H, V], k_tilde
    [B, T_kv, HQ, K], r_cache [B, NC, HQ, K]. Returns (o [B, T_q, HQ, V] in v's dtype, lse
    [B, T_q, HQ] float32: the log-sum-exp of the row's logits and the sink, in fla's units)."""
    for name, x in (("q", q), ("v", v), ("p_curr", p_curr), ("k_tilde", k_tilde),
                    ("r_cache", r_cache)):  # fmt: skip
        _core.check_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions, got {tuple(x.shape)}")
    B, T_q, HQ, K = q.shape
    T_kv, H = v.shape[1], v.shape[2]
    C = int(cache_chunk_size)
    if C < 1:
        raise ValueError(f"cache_chunk_size must be >= 1, got {cache_chunk_size}")
    NC = r_cache.shape[1]
    if H == 0 or HQ % H:
        raise ValueError(f"q: the query heads ({HQ}) must be a multiple of v's heads ({H})")
    if tuple(k_tilde.shape) != (B, T_kv, HQ, K):
        raise ValueError(f"k_tilde must have shape {(B, T_kv, HQ, K)}, got {tuple(k_tilde.shape)}")
    if tuple(r_cache.shape) != (B, NC, HQ, K) or T_kv > NC * C:
        raise ValueError(f"r_cache must have shape [B, NC, HQ, K] with NC * C >= {T_kv}")
    if tuple(p_curr.shape) != (B, T_q, HQ, K):
        raise ValueError(f"p_curr must have shape {(B, T_q, HQ, K)}, got {tuple(p_curr.shape)}")
    if T_q > T_kv:
        raise ValueError(f"q: T_q = {T_q} queries need at least as many cached keys ({T_kv})")
    _core.floating_tensor("g_scalar_cumsum", g_scalar_cumsum)
    _core.floating_tensor("sink_bias", sink_bias)
    dtype = compute_dtype(q.dtype)
    G = HQ // H
    j = torch.arange(T_kv, device=q.device)
    i = torch.arange(T_q, device=q.device) + (T_kv - T_q)
    R = r_cache.to(dtype)[:, j // C]  # [B, T_kv, HQ, K]: each key's anchor
    decay = torch.exp2(p_curr.to(dtype)[:, :, None] - R[:, None])  # [B, T_q, T_kv, HQ, K]
    logits = scale * torch.einsum("bihk,bjhk,bijhk->bhij", q.to(dtype), k_tilde.to(dtype), decay)
    if g_scalar_cumsum is not None:
        Cs = g_scalar_cumsum.to(dtype).transpose(1, 2)  # [B, HQ, T_kv]
        logits = logits + (Cs[..., i, None] - Cs[..., None, :]) / RCP_LN2
    mask = j[None, :] <= i[:, None]
    if window_size is not None:
        mask &= i[:, None] - j[None, :] < window_size
    logits = logits.masked_fill(~mask, float("-inf"))
    if sink_bias is not None:
        sink = sink_bias.to(dtype).reshape(1, HQ, 1, 1).expand(B, HQ, T_q, 1)
        logits = torch.cat([logits, sink], dim=-1)
    lse = torch.logsumexp(logits, dim=-1)  # [B, HQ, T_q]
    p = torch.exp(logits - lse[..., None])[..., :T_kv]
    o = torch.einsum("bhij,bjhv->bihv", p, v.to(dtype).repeat_interleave(G, dim=2))
    return o.to(v.dtype), (lse * RCP_LN2).transpose(1, 2).float()
