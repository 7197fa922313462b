"""fla's Based (``fused_chunk_based``, ``parallel_based``; Arora et al. 2024, section 3.1): causal
attention with the second-order Taylor kernel of exp, normalised as fla's kernels do,

    o_t = sum_{s <= t} f(a_ts) v_s / (sum_{s <= t} f(a_ts) + 1e-6),
    f(a) = 1 + a + a^2 / 2,    a_ts = scale q_t^T k_s

(``use_norm=False``: the numerator alone). With the feature map phi = ``linattn.features.
taylor_exp`` (phi(q)^T phi(k) = f(scale q^T k)) it is linear attention (spec sections 3 and 4),
run by ``linear_attention`` on the values with a column of ones appended (the denominator); fla's
1e-6 is added after, as its kernels add it. No states, no packed sequences (fla has neither).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.features import taylor_exp
from linattn.ops import checks as _checks
from linattn.ops import linear_attention

EPS = 1e-6  # fla's Based kernels: o / (z + 1e-6)


def kernel_attention(
    phi_q: Tensor,
    phi_k: Tensor,
    v: Tensor,
    eps: float,
    normalize: bool,
    mode: str,
    chunk_size: int = _core.CHUNK,
) -> tuple[Tensor, Tensor]:
    """sum_{s <= t} (phi_q_t^T phi_k_s) [v_s, 1] by ``linear_attention`` in the form ``mode``;
    returns (o [B, T, H, V], the denominator z [B, T, H]): o is divided by z + eps if
    ``normalize``."""
    V = v.shape[-1]
    ones = torch.ones_like(v[..., :1])
    out, _ = linear_attention(
        phi_q, phi_k, torch.cat([v, ones], dim=-1), scale=1.0, mode=mode, chunk_size=chunk_size
    )
    o, z = out[..., :V], out[..., V]
    return (o / (z[..., None] + eps) if normalize else o), z


def _check(q, k, v, normalize_name: str, normalize: object) -> None:
    _core.check(q, k, v)
    if v.shape[2] != q.shape[2]:
        raise ValueError(f"v must have H = {q.shape[2]} heads as q, got {v.shape[2]}")
    _checks.flag(normalize_name, normalize)


def based(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    use_norm: bool = True,
    mode: str = "chunk",
    chunk_size: int = _core.CHUNK,
) -> Tensor:
    """Based (the module docstring) in the form ``mode``; q, k [B, T, H, K], v [B, T, H, V];
    o in q's dtype, computed in float32 (float64 for float64 inputs)."""
    _check(q, k, v, "use_norm", use_norm)
    _checks.scale(scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    dtype = compute_dtype(_core.promote(q, k, v))
    q, k, v = (x.to(dtype) for x in (q, k, v))
    o, _ = kernel_attention(
        taylor_exp(q, scale), taylor_exp(k, scale), v, EPS, use_norm, mode, chunk_size
    )
    return o.to(q.dtype)


def fused_chunk_based(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    use_norm: bool = True,
) -> Tensor:
    """fla's ``fused_chunk_based``: Based by linattn's chunk form; returns o [B, T, H, V]."""
    return based(q, k, v, scale, use_norm, mode="chunk", chunk_size=16)


def parallel_based(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    use_norm: bool = True,
) -> Tensor:
    """fla's ``parallel_based``: Based by linattn's parallel (masked T x T) form."""
    return based(q, k, v, scale, use_norm, mode="parallel")
