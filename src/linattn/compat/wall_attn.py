"""fla's ``parallel_wall_attn`` (fla.ops.wall_attn): softmax attention whose logits decay each
key channel between key and query (``linattn.ops.softmax_variants.wall_attention``); o in v's
dtype, as fla's kernel returns it. ``parallel_wall_attn_decode`` (its decoding step over fla's
rescaled key cache) is not computed (``linattn.compat.unsupported``)."""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.attn import _heads, _varlen
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
