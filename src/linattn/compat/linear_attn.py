"""fla's linear attention: ``chunk_linear_attn``, ``fused_chunk_linear_attn``,
``fused_recurrent_linear_attn`` (spec sections 4, 5).

S_t = S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t). With ``normalize=True`` (fla's default in the
chunk forms) o_t is divided by ``(scale q_t)^T z_t + 1e-10`` with z_t = z_0 + sum_{s <= t} k_s,
and the state is the pair ``(kv, z)``: kv [N, H, K, V], z [N, 1, H, K] (fla 0.6.0). The pair is
returned, even without ``output_final_state`` (then ``(None, z)``), and accepted as
``initial_state`` so that a split sequence resumes exactly; a bare tensor there is kv, z_0 = 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core

EPS = 1e-10  # fla adds it to the normaliser's denominator


def _pair(initial_state: object, normalize: bool) -> tuple[Tensor | None, Tensor | None]:
    if normalize and isinstance(initial_state, tuple):
        if len(initial_state) != 2:
            raise ValueError(
                f"initial_state: with normalize=True, a pair (kv, z) is expected, got a tuple of "
                f"{len(initial_state)}"
            )
        return initial_state
    return initial_state, None


def _normalized(q, k, v, scale, kv0, z0, output_final_state, reverse, cu_seqlens, mode):
    """The normaliser as one more value column of ones: its state column is z (as [N, H, K])."""
    N, H, K = (q.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1), q.shape[2], q.shape[3]
    dtype = _core.promote(q, k, v)
    v1 = torch.cat([v.to(dtype), torch.ones_like(v[..., :1], dtype=dtype)], dim=-1)
    S0 = None
    if kv0 is not None or z0 is not None:
        V = v.shape[-1]
        kv = kv0 if kv0 is not None else q.new_zeros(N, H, K, V, dtype=dtype)
        z = z0.reshape(N, H, K, 1) if z0 is not None else kv.new_zeros(N, H, K, 1)
        S0 = torch.cat([kv.to(dtype), z.to(dtype)], dim=-1)  # [N, H, K, V + 1]
    o, S = _core.run(
        q, k, v1, delta=False, mode=mode, scale=scale, initial_state=S0, output_final_state=True,
        cu_seqlens=cu_seqlens, reverse=reverse,
    )  # fmt: skip
    o = o.to(dtype)
    o = o[..., :-1] / (o[..., -1:] + EPS)
    z_dtype = k.dtype if z0 is None else torch.promote_types(k.dtype, z0.dtype)
    z = S[..., -1].reshape(N, 1, H, K).to(z_dtype)  # [N, H, K] -> fla's [N, 1, H, K]
    kv = S[..., :-1] if output_final_state else None
    return o.to(v.dtype), (kv, z)


def _linear_attn(mode, q, k, v, scale, initial_state, output_final_state, normalize, reverse,
                 cu_seqlens):  # fmt: skip
    _core.check(q, k, v)
    kv0, z0 = _pair(initial_state, normalize)
    _core.check_varlen(q, kv0, cu_seqlens)
    if normalize:
        return _normalized(q, k, v, scale, kv0, z0, output_final_state, reverse, cu_seqlens, mode)
    return _core.run(
        q, k, v, delta=False, mode=mode, scale=scale, initial_state=kv0,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, reverse=reverse,
    )  # fmt: skip


def chunk_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | tuple | None = None,
    output_final_state: bool = False,
    normalize: bool = True,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | tuple | None]:
    """fla's ``chunk_linear_attn``: S_t = S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t), divided by
    (scale q_t)^T z_t + 1e-10 with normalize (the module docstring: the (kv, z) state)."""
    return _linear_attn(
        "chunk", q, k, v, scale, initial_state, output_final_state, normalize, False, cu_seqlens
    )


# fla's ``fused_chunk_linear_attn``: the same signature and computation as ``chunk_linear_attn``
# (another kernel in fla), so the same function here.
fused_chunk_linear_attn = chunk_linear_attn


def fused_recurrent_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: Tensor | tuple | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    normalize: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | tuple | None]:
    """fla's ``fused_recurrent_linear_attn``: the token loop (last to first with reverse);
    normalize defaults to False here."""
    return _linear_attn(
        "recurrent", q, k, v, scale, initial_state, output_final_state, normalize, reverse,
        cu_seqlens,
    )  # fmt: skip
