"""fla's ``parallel_parallax`` (fla.ops.parallax): softmax attention with a first-order
correction from a second query r (``linattn.ops.softmax_variants.parallax_attention``).

fla's kernel takes bfloat16 / float16 only; here any floating dtype runs (computed in float32,
float64 for float64), o returned in q's dtype (fla: v's, which its kernel requires equal)."""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.attn import _heads, _varlen
from linattn.ops.softmax_variants import parallax_attention


def parallel_parallax(
    q: Tensor,
    r: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    window_size: int | None = None,
    cu_seqlens: torch.LongTensor | None = None,
) -> Tensor:
    """fla's ``parallel_parallax``: P = softmax(scale q k^T) over t - window_size < s <= t,
    c_t = sum_s P_ts r_t^T k_s, o_t = sum_s P_ts (1 + c_t - r_t^T k_s) v_s; q, r [B, T, HQ, K],
    k [B, T, H, K], v [B, T, H, V]."""
    _heads(q, k, v)
    _core.check_tensor("r", r)
    _varlen(q, cu_seqlens)
    dtype = _core.promote(q, r, k, v)
    o = parallax_attention(
        q.to(dtype), r.to(dtype), k.to(dtype), v.to(dtype), scale=scale, window_size=window_size,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return o.to(q.dtype)
