"""Mixture of block attention (MoBA; Lu et al., 2025, "MoBA: Mixture of Block Attention for
Long-Context LLMs"), as fla 0.6.0's ``parallel_moba`` computes it.

Each sequence is cut into blocks of ``chunk_size`` tokens (the last one may be shorter). Query t
(head h) scores every block of its sequence that ends before t's own block starts, by the
product of q_t with the block's mean key (unscaled), and keeps the ``topk - 1`` best; it then
attends, in one softmax (scale 1 / sqrt(K)), to the tokens of the kept blocks and to the tokens
s <= t of its own block:

    gate_tc = q_t^T mean_{s in c} k_s,   C_t = top_{topk - 1} {c : c ends before t's block},
    o_t = sum_s softmax_s(scale q_t^T k_s) v_s
          over the tokens s of the blocks in C_t, and those of t's own block with s <= t.

With topk = 1 it is causal softmax attention over the whole sequence (fla's shortcut: not the
own block alone).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks


def _one(q: Tensor, k: Tensor, v: Tensor, C: int, n_sel: int, scale: float) -> Tensor:
    """One sequence: q, k [T, H, K], v [T, H, V] -> o [T, H, V]."""
    T, H, K = q.shape
    NC = -(-T // C)
    t = torch.arange(T, device=q.device)
    block = t // C
    mask = t[None, :] <= t[:, None]  # [T, T]: causal
    if n_sel > 0:  # fla: topk <= 1 is full causal attention; else the own block's past
        mask = mask & (block[None, :] == block[:, None])
    mask = mask[None].expand(H, T, T)  # [H, T, S]
    if n_sel > 0 and NC > 1:
        pad = NC * C - T
        means = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(NC, C, H, K).mean(1)
        gate = torch.einsum("thk,chk->htc", q, means[: NC - 1])  # [H, T, NC - 1], full blocks
        c = torch.arange(NC - 1, device=q.device)
        past = c[None, :] < block[:, None]  # block c ends before t's block starts
        gate = gate.masked_fill(~past[None], float("-inf"))
        top = torch.topk(gate, k=min(n_sel, NC - 1), dim=-1).indices  # [H, T, n]
        kept = torch.zeros(H, T, NC, dtype=torch.bool, device=q.device)
        kept.scatter_(-1, top, True)
        kept[..., : NC - 1] &= past[None]
        kept[..., NC - 1] = False
        mask = mask | kept.repeat_interleave(C, dim=-1)[..., :T]
    logits = scale * torch.einsum("thk,shk->hts", q, k).masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shv->thv", torch.softmax(logits, dim=-1), v)


def mixture_of_block_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    chunk_size: int,
    topk: int,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """MoBA (the module docstring): each query attends to its own block's past and to the
    ``topk - 1`` earlier blocks whose mean key best matches it.

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; one floating dtype.
        chunk_size: tokens per block (>= 1). topk: blocks per query, its own included (>= 1).
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1), none of them empty.

    Returns:
        o: [B, T, H, V] in the input dtype (computed in float32, float64 for float64).
    """
    B, T, H, K, V = _checks.qkv(q, k, v)
    chunk_size = _checks.integer("chunk_size", chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    topk = _checks.integer("topk", topk)
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    _checks.seqlens(cu_seqlens, B, T)
    if cu_seqlens is not None and bool((cu_seqlens[1:] == cu_seqlens[:-1]).any()):
        raise ValueError(f"cu_seqlens: MoBA takes no empty sequence, got {cu_seqlens.tolist()}")
    scale = 1.0 / math.sqrt(K)
    if B == 0 or T == 0:
        return v.new_zeros(B, T, H, V)
    dtype = compute_dtype(q.dtype)
    qc, kc, vc = (x.to(dtype) for x in (q, k, v))
    if cu_seqlens is None:
        o = torch.stack([_one(qc[n], kc[n], vc[n], chunk_size, topk - 1, scale) for n in range(B)])
    else:
        bounds = cu_seqlens.tolist()
        parts = [_one(qc[0, a:b], kc[0, a:b], vc[0, a:b], chunk_size, topk - 1, scale)
                 for a, b in zip(bounds[:-1], bounds[1:], strict=True)]  # fmt: skip
        o = torch.cat(parts)[None]
    return o.to(v.dtype)
