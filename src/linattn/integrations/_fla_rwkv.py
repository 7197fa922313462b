"""CPU versions of the Triton-only functions of fla 0.6.0's RWKV-6 and RWKV-7 layers and models.

Used by ``linattn.integrations.fla.enable()`` (which rebinds fla's names to them for CPU tensors):
the token shift of both (``fla.modules.token_shift.token_shift``: time mixing, ``LerpLinear``,
``DDLerpLinear`` and the channel mixing of the models), and RWKV-7's fused add-multiply
(``fused_addcmul_rwkv7``), key update (``fused_k_rwkv7``) and output correction
(``gate_output_correction``). PyTorch, autograd gives the backward; the formulas are those of
fla's kernels (and of its reference functions next to them), computed in float32 for
half-precision inputs where fla's kernels compute in float32.
"""

from __future__ import annotations

import torch

from linattn.dtypes import compute_dtype
from linattn.layers import modules


def token_shift(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
    output_cache: bool = False,
    chunk_indices: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RWKV's token shift: ``delta_t = x_{t-1} - x_t``, with ``x_{-1}`` the cache (else 0).

    x [B, T, D] (B = 1 with ``cu_seqlens``: each sequence starts from its own cache row, or 0);
    cache [N, D]: the last token of the previous call, one row per sequence. With
    ``output_cache`` also returns the new cache [N, D] (each sequence's last token; a sequence
    of length 0 keeps its cache, or 0). ``chunk_indices`` (fla's kernel tiling) is ignored.
    """
    N = x.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
    last = None if cache is None else cache.reshape(N, x.shape[-1])
    delta, last = modules.token_shift(x, last, cu_seqlens)  # the layers' own (RWKV7)
    return (delta, last) if output_cache else delta


def fused_addcmul_rwkv7(
    hidden_states: torch.Tensor,
    delta: torch.Tensor,
    xr: torch.Tensor,
    xw: torch.Tensor,
    xk: torch.Tensor,
    xv: torch.Tensor,
    xa: torch.Tensor,
    xg: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, ...]:
    """RWKV-7's six token-shift interpolations: ``x_c = h + delta * mu_c`` for c = r, w, k, v, a,
    g (None without xg), each [B, T, D]."""
    mixes = (xr, xw, xk, xv, xa, xg)
    return tuple(None if mu is None else torch.addcmul(hidden_states, delta, mu) for mu in mixes)


def fused_k_rwkv7(
    k: torch.Tensor,
    a: torch.Tensor,
    ka: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> torch.Tensor:
    """RWKV-7's key update ``k (1 + (a - 1) k_a)`` (float32 for half inputs), k, a [B, T, D],
    ka [D]; the sequence boundaries change nothing (elementwise)."""
    dtype = compute_dtype(k.dtype)
    kf, af = k.to(dtype), a.to(dtype)
    return (kf * (1 + (af - 1) * ka.to(dtype))).to(k.dtype)


def gate_output_correction(
    o: torch.Tensor,
    r: torch.Tensor,
    k: torch.Tensor,
    r_k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
) -> torch.Tensor:
    """RWKV-7's output correction and gate: ``(o_t + (sum_i r_ti k_ti rk_i) v_t) * g_t`` per head.

    o, g [B, T, H * V]; r, k [B, T, H, K]; r_k [H, K]; v [B, T, H, V]; float32 for half inputs,
    returned in o's dtype.
    """
    if r_k.shape != r.shape[-2:]:
        want, got = tuple(r.shape[-2:]), tuple(r_k.shape)
        raise ValueError(f"gate_output_correction: r_k must be {want} (H, K), got {got}")
    dtype = compute_dtype(o.dtype)
    bonus = (r.to(dtype) * k.to(dtype) * r_k.to(dtype)).sum(-1, keepdim=True)  # [B, T, H, 1]
    correction = (bonus * v.to(dtype)).reshape(o.shape)  # [B, T, H, V] -> [B, T, H * V]
    return ((o.to(dtype) + correction) * g.to(dtype)).to(o.dtype)
