"""fla's ReBased (``parallel_rebased``, ``fla.ops.rebased`` only; Aksenov et al. 2024): causal
attention with the squared kernel, normalised as fla's kernel does,

    o_t = sum_{s <= t} a_ts^2 v_s / (sum_{s <= t} a_ts^2 + eps),    a_ts = scale q_t^T k_s

(scale = 1 / sqrt(K) with ``use_scale``, else 1; ``use_normalize=False``: the numerator alone;
``return_both``: the numerator [B, H, T, V] and the denominator [B, H, T], fla's layout there).
With phi(x) = vec(y y^T), y = sqrt(scale) x, phi(q)^T phi(k) = a^2: linear attention (spec
sections 3 and 4) run by ``linear_attention`` (``linattn.compat.based.kernel_attention``);
the chunk form by ``linattn.compat.based.polynomial_attention`` (f(a) = a^2 from the K-wide
scores inside a chunk, the features used only for the state).
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.compat.based import _check, kernel_attention, polynomial_attention
from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks

SQUARE = (0.0, 0.0, 1.0)  # f(a) = a^2, ReBased's kernel (``polynomial_attention``)


def squared_features(x: Tensor, scale: float) -> Tensor:
    """ReBased's feature map: vec(y y^T) with y = sqrt(scale) x, [..., K] -> [..., K * K]."""
    y = x * scale**0.5
    return (y.unsqueeze(-1) * y.unsqueeze(-2)).flatten(-2)


def rebased(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eps: float = 1e-5,
    use_scale: bool = True,
    use_normalize: bool = True,
    return_both: bool = False,
    mode: str = "parallel",
    chunk_size: int = _core.CHUNK,
) -> Tensor | tuple[Tensor, Tensor]:
    """ReBased (the module docstring) in the form ``mode``; q, k [B, T, H, K], v [B, T, H, V];
    computed in float32 (float64 for float64 inputs), returned in q's dtype."""
    _check(q, k, v, "use_normalize", use_normalize)
    _checks.flag("use_scale", use_scale)
    _checks.flag("return_both", return_both)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a real number >= 0, got {eps!r}")
    scale = q.shape[-1] ** -0.5 if use_scale else 1.0
    dtype = compute_dtype(_core.promote(q, k, v))
    out_dtype = q.dtype
    q, k, v = (x.to(dtype) for x in (q, k, v))
    normalize = use_normalize and not return_both
    if mode == "chunk":
        o, z = polynomial_attention(q, k, v, SQUARE, scale, eps, normalize, chunk_size)
    else:
        o, z = kernel_attention(
            squared_features(q, scale), squared_features(k, scale), v, eps, normalize, mode,
            chunk_size,
        )  # fmt: skip
    if return_both:
        return o.transpose(1, 2).to(out_dtype), z.transpose(1, 2).to(out_dtype)
    return o.to(out_dtype)


def parallel_rebased(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    eps: float = 1e-5,
    use_scale: bool = True,
    use_normalize: bool = True,
    return_both: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """fla's ``parallel_rebased``: ReBased by linattn's parallel (masked T x T) form."""
    return rebased(q, k, v, eps, use_scale, use_normalize, return_both, mode="parallel")
