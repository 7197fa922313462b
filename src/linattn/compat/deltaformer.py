"""fla's DeltaFormer: ``deltaformer_attn`` (``fla.ops.deltaformer`` only), on
``linattn.ops.deltaformer`` (Zhong et al. 2025).

    u_t = v_t - beta_t sum_{s < t} softmax_{s < t}(q_t . k_s / sqrt(D)) u_s
    o   = causal softmax attention of q over (k, u), scale 1/sqrt(D)

fla 0.6.0's conventions, from its naive.py and its kernel (which agree): the write stage's
weights use q (not k), beta is taken as given (fla's layer feeds b_proj x, unbounded; None:
ones), the pseudo-values are computed in blocks of ``C`` = 512 rows. fla reads o with
flash-attention (not needed here). With ``attention_mask`` ([B, T], 1 = token, 0 = padding) fla
computes u over the whole padded rows, then attends over each row's tokens only, and pads o with
zeros: followed. ``cu_seqlens``: packed sequences, B = 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.ops import checks, softmax_attention
from linattn.ops.deltaformer import deltaformer

BLOCK_SIZE_C = 512  # fla's default block of the pseudo-values' solve


def deltaformer_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    attention_mask: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    C: int = BLOCK_SIZE_C,
) -> Tensor:
    """fla's ``deltaformer_attn`` (module docstring): q, k, v [B, T, H, D], beta [B, T, H] or
    None; returns o [B, T, H, D]."""
    _core.check(q, k, v, beta=(beta, ("[B, T, H]",)))
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(
            f"cu_seqlens: the batch size is expected to be 1 rather than {q.shape[0]} when using "
            "cu_seqlens (flatten variable-length inputs first)"
        )
    B, T = q.shape[:2]
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != (B, T):
            shape = getattr(attention_mask, "shape", type(attention_mask).__name__)
            raise ValueError(f"attention_mask must have shape [B, T] = {(B, T)}, got {shape}")
        if cu_seqlens is not None:
            raise ValueError("attention_mask and cu_seqlens: pass one of them, not both")
    C = checks.integer("C", C)
    if C < 1:
        raise ValueError(f"C must be >= 1 (the pseudo-values' block), got {C}")
    dtype = _core.promote(q, k, v)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    block = min(C, max(T, 1))
    _, u = deltaformer(q, k, v, beta, mode="chunk", chunk_size=block, cu_seqlens=cu_seqlens,
                       return_u=True)  # fmt: skip
    if attention_mask is None:
        return softmax_attention(q, k, u, cu_seqlens=cu_seqlens)
    o = torch.zeros_like(u)
    for b in range(B):
        keep = attention_mask[b].bool()
        if bool(keep.any()):
            rows = softmax_attention(q[b : b + 1, keep], k[b : b + 1, keep], u[b : b + 1, keep])
            o[b, keep] = rows[0]
    return o
