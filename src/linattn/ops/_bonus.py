"""RWKV-6's bonus, the token's own term of its read: scale (q_t^T Diag(u) k_t) v_t (``ops.rwkv6``).

Apart from ``ops.rwkv6`` so that the generation step (``ops.step``, which the engine imports) can
use it without importing the op, which runs on the engine.
"""

from __future__ import annotations

import torch
from torch import Tensor

BONUS_BLOCK = 256  # tokens a block of ``bonus``: its temporaries stay small (reused memory)


def bonus(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    u: Tensor,
    scale: float,
    dtype: torch.dtype,
    reads: Tensor | None = None,
    first: Tensor | None = None,
) -> Tensor:
    """reads + scale (sum_c q_tc u_c k_tc) v_t [B, T, HV, V] in ``dtype``: the token's own term.

    q, k [B, T, H, K] (or [B, H, K], one token, no reads); v [B, T, HV, V] ([B, HV, V]); u [HV,
    K]. reads: None, [B, T, HV, V], or [B, T - 1, HV, V] for tokens 1 .. T - 1 with ``first``
    [B, 1, HV, V] for token 0. Computed in blocks of ``BONUS_BLOCK`` tokens (split, then one
    concatenation): whole-sequence temporaries (k u, q k u, and their gradients) would each be
    fresh memory, whose page faults cost more than the arithmetic (measured at T = 16,384, one
    thread: the forward 15 ms in blocks, about 75 ms not; GLA's 115 ms).
    """
    u = u.to(dtype) * scale
    if q.dim() == 3 or q.shape[1] == 0:
        return _bonus_block(q, k, v, u, dtype)
    T = q.shape[1]
    sizes = [min(BONUS_BLOCK, T - s) for s in range(0, T, BONUS_BLOCK)]
    blocks = [x.split(sizes, dim=1) for x in (q, k, v)]
    read_blocks = [None] * len(sizes)
    if reads is not None and first is None:
        read_blocks = reads.split(sizes, dim=1)
    elif reads is not None:  # token 0's read is ``first``: one row less of ``reads`` in block 0
        read_blocks = list(reads.split([sizes[0] - 1, *sizes[1:]], dim=1))
        read_blocks[0] = torch.cat([first.to(dtype), read_blocks[0]], dim=1)
    pieces = zip(*blocks, read_blocks, strict=True)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, u, reads, first)
                                       if x is not None):  # fmt: skip
        parts = [_bonus_block(qb, kb, vb, u, dtype, rb) for qb, kb, vb, rb in pieces]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    # nothing to differentiate: each block written into the output (no concatenation)
    o = v.new_empty(*v.shape[:-2], u.shape[0], v.shape[-1], dtype=dtype)
    for out, (qb, kb, vb, rb) in zip(o.split(sizes, dim=1), pieces, strict=True):
        out.copy_(_bonus_block(qb, kb, vb, u, dtype, rb))
    return o


def _bonus_block(q, k, v, u, dtype: torch.dtype, reads: Tensor | None = None) -> Tensor:
    """reads + (sum_c q_c u_c k_c) v for one block of tokens (u already scaled)."""
    H, HV = q.shape[-2], u.shape[0]
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if H != HV:  # grouped value heads: q and k of value head j are those of head j // G
        q, k = (x.repeat_interleave(HV // H, dim=-2) for x in (q, k))
    weight = torch.linalg.vecdot(q, k * u).unsqueeze(-1)
    return weight * v if reads is None else torch.addcmul(reads, weight, v)
