"""fla's ``parallel_nsa`` (fla.ops.nsa): native sparse attention, its compression, selection and
sliding-window branches (``linattn.ops.nsa.native_sparse_attention``, whose docstring gives the
formulas). fla's kernel limits (a group of at least 16 query heads per key head, a power of 2)
are not copied; o is returned in q's dtype."""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.attn import _heads, _varlen
from linattn.ops.nsa import native_sparse_attention


def parallel_nsa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g_cmp: Tensor | None = None,
    g_slc: Tensor | None = None,
    g_swa: Tensor | None = None,
    block_indices: torch.LongTensor | None = None,
    block_counts: torch.LongTensor | int = 16,
    block_size: int = 64,
    window_size: int = 0,
    scale: float | None = None,
    cu_seqlens: torch.LongTensor | tuple[torch.LongTensor, torch.LongTensor] | None = None,
) -> Tensor:
    """fla's ``parallel_nsa``: o = g_slc o_slc + g_cmp o_cmp + g_swa o_swa (selected blocks,
    mean-pooled blocks, sliding window; ``linattn.ops.nsa``). ``cu_seqlens`` may be fla's pair
    ``(cu_seqlens_q, cu_seqlens_k)`` when the two are equal."""
    _heads(q, k, v)
    _varlen(q, cu_seqlens)
    if isinstance(cu_seqlens, tuple):
        if len(cu_seqlens) != 2 or not torch.equal(cu_seqlens[0], cu_seqlens[1]):
            raise NotImplementedError(
                "cu_seqlens: a pair (cu_seqlens_q, cu_seqlens_k) must hold one tensor twice here"
            )
        cu_seqlens = cu_seqlens[0]
    for name, x in (("g_cmp", g_cmp), ("g_slc", g_slc), ("g_swa", g_swa)):
        _core.floating_tensor(name, x)
    dtype = _core.promote(q, k, v, g_cmp, g_slc, g_swa)
    o = native_sparse_attention(
        *(None if x is None else x.to(dtype) for x in (q, k, v, g_cmp, g_slc, g_swa)),
        block_indices=block_indices, block_counts=block_counts, block_size=block_size,
        window_size=window_size, scale=scale, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return o.to(q.dtype)
