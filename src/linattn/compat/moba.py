"""fla's ``parallel_moba`` (fla.ops.moba, not exported by ``fla.ops``): mixture of block
attention (``linattn.ops.moba.mixture_of_block_attention``, whose docstring gives the formula).

fla's implementation is PyTorch around flash-attn's CUDA functions (``_flash_attn_varlen_forward``)
and has no naive reference: this follows fla's code (the blocks, the unscaled mean-key gate, the
topk - 1 earlier blocks of the query's own sequence, its own block causally, one softmax), is
pinned to the float64 loop of ``linattn.reference.moba``, and to fla's code run on the CPU with
flash-attn's three functions written out (tests/compat/test_moba.py). ``max_seqlen`` is accepted
and unused; o is returned in q's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.compat.attn import _varlen
from linattn.ops.moba import mixture_of_block_attention


def parallel_moba(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: torch.LongTensor,
    max_seqlen: int,
    chunk_size: int,
    topk: int,
) -> Tensor:
    """fla's ``parallel_moba``: each query attends to its own block's past and to the topk - 1
    earlier blocks of its sequence whose mean key best matches it; q, k [B, T, H, K] (B = 1 with
    cu_seqlens), v [B, T, H, V]."""
    _core.floating_qkv(q, k, v)
    _varlen(q, cu_seqlens)
    dtype = _core.promote(q, k, v)
    o = mixture_of_block_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), chunk_size=chunk_size, topk=topk,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return o.to(q.dtype)
