"""fla's PaTH attention: ``parallel_path_attn`` (``fla.ops``), on ``linattn.ops.path``
(Yang et al. 2025).

    o_t = sum_{s <= t} softmax_s(scale (q_t^T H_t ... H_{s+1} k_s + G_t - G_s)) v_s,
    H_i = I - beta_i w_i w_i^T,  G = cumsum(g)

fla 0.6.0's conventions (its naive.py and its kernel agree): q [B, T, HQ, K], k, w [B, T, H, K],
v [B, T, H, V], beta [B, T, H], g [B, T, HQ] or None (inside the scale, as fla), grouped query
heads (HQ a multiple of H), ``scale=None`` 1/sqrt(K), ``cu_seqlens`` with B = 1. Returns
``(o, k_cache)``: k_cache [B, T, H, K] the keys carried to the last token of their sequence,
H_T ... H_{s+1} k_s (what fla's decoding keeps), with ``use_cache``; None otherwise. fla's
kernel limits (head sizes 16 to 128, float32 w, beta, g) are not copied.
"""

from __future__ import annotations

from torch import Tensor

from linattn.compat import _core
from linattn.ops.path import path_attention


def _as_op_returns(out: tuple, given: dict) -> Tensor | tuple:
    """fla's (o, k_cache or None) as linattn's op returns them: o, or (o, k_cache) with its
    ``return_k_cache``."""
    return tuple(out) if given["return_k_cache"] else out[0]


@_core.inverts(names={"return_k_cache": "use_cache"}, result=_as_op_returns)
def parallel_path_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    scale: float = None,
    cu_seqlens: Tensor | None = None,
    use_cache: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``parallel_path_attn`` (module docstring); returns (o, k_cache or None)."""
    for name, x in (("q", q), ("k", k), ("v", v), ("w", w), ("beta", beta)):
        _core.check_tensor(name, x)
    if g is not None:
        _core.check_tensor("g", g)
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(
            f"cu_seqlens: the batch size is expected to be 1 rather than {q.shape[0]} when using "
            "cu_seqlens (flatten variable-length inputs first)"
        )
    dtype = _core.promote(q, k, v)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    o, cache = path_attention(
        q, k, v, w.to(dtype), beta, g, scale=scale, mode="chunk", chunk_size=_core.CHUNK,
        cu_seqlens=cu_seqlens, return_k_cache=True,
    )  # fmt: skip
    return o, (cache if use_cache else None)
