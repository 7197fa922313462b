"""fla's Parallax decoding kernels on the CPU (part of ``linattn.integrations.fla.enable()``).

fla's ``Parallax`` layer (``fla.layers.parallax``) attends over its KV cache with two Triton-only
functions of ``fla.ops.parallax.decode``: ``parallax_decode`` (the prefill with a cache and
chunked decoding: Sq queries, the last Sq positions of Skv cached keys) and
``parallax_decode_one_step`` (one query per sequence). ``enable()`` binds these CPU versions in
the layer's module and in fla's, for CPU tensors (other devices keep fla's kernels).

The output is Parallax's (Zuo et al. 2026, "parameterized local linear attention"; the formula
of ``linattn.ops.softmax_variants.parallax_attention``) over the keys a query sees:

    P_ts = softmax_s(scale q_t^T k_s),   c_t = sum_s P_ts r_t^T k_s,
    o_t = sum_s P_ts (1 + c_t - r_t^T k_s) v_s,

query t at absolute position ``Skv - Sq + t`` seeing the keys s with
``max(cache_start_b, Skv - Sq + t - window_size + 1) <= s <= Skv - Sq + t`` (``cache_start``: each
sequence's first valid key, past its left padding); a query that sees no key outputs 0, as fla's
kernels do. The explicit masked product, in float32 (float64 for float64), returned in q's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype


def _check(q: Tensor, r: Tensor, k: Tensor, v: Tensor, window_size, cache_start) -> None:
    for name, x in (("q", q), ("r", r), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or not x.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point torch.Tensor")
        if x.dim() != 4:
            raise ValueError(f"{name} must be [B, T, H, D], got {tuple(x.shape)}")
    B, Sq, HQ, K = q.shape
    Skv, H = k.shape[1], k.shape[2]
    if r.shape != q.shape:
        raise ValueError(f"r must have q's shape {tuple(q.shape)}, got {tuple(r.shape)}")
    if k.shape[0] != B or k.shape[3] != K or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"k must be [B, Skv, H, {K}] and v [B, Skv, H, V] with q's B = {B}, got "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    if Skv < Sq:
        raise ValueError(f"k: the cached keys ({Skv}) must cover the queries ({Sq})")
    if H == 0 or HQ % H != 0:
        raise ValueError(f"q: the query heads ({HQ}) must be a multiple of the key heads ({H})")
    if window_size is not None and window_size < 1:
        raise ValueError(f"window_size must be None or >= 1, got {window_size}")
    if cache_start is not None and tuple(cache_start.shape) != (B,):
        raise ValueError(f"cache_start must be [B] = [{B}], got {tuple(cache_start.shape)}")


def parallax_decode(
    q: Tensor,
    r: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    window_size: int | None = None,
    cache_start: Tensor | None = None,
) -> Tensor:
    """fla's ``parallax_decode`` on the CPU: Parallax attention (the module docstring) of the
    Sq new queries q, r [B, Sq, HQ, K] over the cache k [B, Skv, H, K], v [B, Skv, H, V]
    (Skv >= Sq, HQ a multiple of H), the queries being the last Sq positions; ``scale`` None is
    1 / sqrt(K); ``cache_start`` [B] the first valid key of each sequence. Returns o
    [B, Sq, HQ, V] in q's dtype. No autograd graph is kept (fla's is forward-only)."""
    _check(q, r, k, v, window_size, cache_start)
    B, Sq, HQ, K = q.shape
    Skv, H = k.shape[1], k.shape[2]
    scale = K**-0.5 if scale is None else float(scale)
    dtype = compute_dtype(q.dtype)
    with torch.no_grad():
        qh, rh = (x.to(dtype).transpose(1, 2) for x in (q, r))  # [B, HQ, Sq, K]
        kh, vh = (x.to(dtype).transpose(1, 2).repeat_interleave(HQ // H, dim=1) for x in (k, v))
        pos = torch.arange(Sq, device=q.device)[:, None] + (Skv - Sq)  # [Sq, 1]
        key = torch.arange(Skv, device=q.device)[None, :]  # [1, Skv]
        lo = torch.zeros(B, 1, 1, dtype=torch.long, device=q.device)
        if cache_start is not None:
            lo = cache_start.to(device=q.device, dtype=torch.long).view(B, 1, 1)
        if window_size is not None:
            lo = torch.maximum(lo, pos - window_size + 1)  # [B, Sq, 1]
        seen = (key <= pos) & (key >= lo)  # [B, Sq, Skv]
        s = (scale * (qh @ kh.transpose(-1, -2))).masked_fill(~seen[:, None], float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)  # 0 on the keys not seen
        d = p.sum(-1, keepdim=True)
        p = p / torch.where(d > 0, d, torch.ones_like(d))  # a query without keys keeps p = 0
        rk = rh @ kh.transpose(-1, -2)  # r^T k, not scaled
        c = (p * rk).sum(-1, keepdim=True)
        o = (p * (1 + c - rk)) @ vh  # [B, HQ, Sq, V]
    return o.transpose(1, 2).to(q.dtype)


def parallax_decode_one_step(
    q: Tensor,
    r: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    window_size: int | None = None,
    cache_start: Tensor | None = None,
) -> Tensor:
    """fla's ``parallax_decode_one_step`` on the CPU: ``parallax_decode`` with one query per
    sequence (q, r [B, 1, HQ, K]), at its sequence's last position."""
    if isinstance(q, Tensor) and q.dim() == 4 and q.shape[1] != 1:
        raise ValueError(f"q: parallax_decode_one_step takes one query (Sq = 1), got {q.shape[1]}")
    return parallax_decode(q, r, k, v, scale, window_size, cache_start)
