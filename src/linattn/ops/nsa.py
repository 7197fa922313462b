"""Native sparse attention (NSA; Yuan et al., 2025, "Native Sparse Attention: Hardware-Aligned
and Natively Trainable Sparse Attention"), as fla 0.6.0's ``parallel_nsa`` computes it.

Three softmax-attention branches per query t, mixed by gates (each [B, T, HQ]):

- compression: the keys and values mean-pooled over blocks of ``block_size`` tokens (the last,
  partial block over its own tokens); query t sees the blocks that lie wholly in its past,
  (c + 1) block_size - 1 <= t; o_cmp = softmax(scale q k_cmp^T) v_cmp (0 with no block seen);
- selection: each key/value head keeps ``block_counts`` blocks per query: the blocks ranked by
  their compression probabilities averaged over the head's G query heads, the first block, the
  query's own and the previous block always kept (score 1); blocks in the future and slots past
  the count are dropped. o_slc = softmax over the kept blocks' tokens s <= t;
- sliding window: causal softmax attention over the last ``window_size`` keys.

    o = g_slc o_slc + g_cmp o_cmp + g_swa o_swa

(g_slc None: o_slc unweighted; g_cmp None: no compression branch, and ``block_indices`` gives the
selection; window_size 0: no window branch). ``block_indices`` [B, T, H, S] (-1 for none)
overrides the computed selection. The selection is a set: which blocks, not their order.
With ``block_counts`` < 3 the always-kept blocks (score 1) tie, and which of them stay is
torch.topk's choice (as in fla's naive reference; the float64 loop keeps the lowest indices).
With T_q < T_k the queries are the last T_q positions (a decoding step).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks


def _pool(x: Tensor, BS: int) -> Tensor:
    """[T, H, D] mean-pooled over blocks of BS tokens (the last block over its own): [NC, H, D]."""
    T = x.shape[0]
    NC = -(-T // BS)
    pad = NC * BS - T
    summed = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)).reshape(NC, BS, *x.shape[1:]).sum(1)
    counts = torch.full((NC,), float(BS), dtype=x.dtype, device=x.device)
    counts[-1] = BS - pad
    return summed / counts[:, None, None]


def _softmax_rows(logits: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last dimension where ``mask``; rows with nothing visible are 0."""
    logits = logits.masked_fill(~mask, float("-inf"))
    m = logits.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(logits - m)
    denom = p.sum(-1, keepdim=True)
    return p / torch.where(denom > 0, denom, torch.ones_like(denom))


def _one(q, k, v, g_cmp, g_slc, g_swa, indices, counts, S, BS, W, scale):
    """One sequence: q [TQ, HQ, K], k [T, H, K], v [T, H, V], gates [TQ, HQ], indices
    [TQ, H, S] or None, counts [TQ, H]."""
    TQ, HQ, _ = q.shape
    T, H, _ = k.shape
    G = HQ // H
    NC = -(-T // BS)
    t = torch.arange(T - TQ, T, device=q.device)  # the queries' positions
    s = torch.arange(T, device=q.device)
    c = torch.arange(NC, device=q.device)
    qg = q.reshape(TQ, H, G, -1)
    o = None
    if g_cmp is not None:
        k_cmp, v_cmp = _pool(k, BS), _pool(v, BS)
        seen = (c[None, :] + 1) * BS - 1 <= t[:, None]  # [TQ, NC]
        logits = scale * torch.einsum("thgk,chk->thgc", qg, k_cmp)
        P = _softmax_rows(logits, seen[:, None, None, :])
        o = torch.einsum("thgc,chv->thgv", P, v_cmp).reshape(TQ, HQ, -1) * g_cmp[..., None]
        if indices is None:
            block = t // BS
            forced = (c[None, :] == block[:, None]) | (c[None, :] == 0)
            forced |= c[None, :] == block[:, None] - 1
            scores = torch.where(forced[:, None, :], 1.0, P.detach().mean(2))  # [TQ, H, NC]
            top = torch.topk(scores, k=min(S, NC), dim=-1).indices  # [TQ, H, min(S, NC)]
            allowed = (seen | forced)[:, None, :].expand(TQ, H, NC).gather(-1, top)
            slot = torch.arange(top.shape[-1], device=q.device)
            keep = allowed & (slot < counts[..., None])
            indices = torch.where(keep, top, torch.full_like(top, -1))
    chosen = torch.zeros(TQ, H, NC + 1, dtype=torch.bool, device=q.device)
    idx = torch.where((indices >= 0) & (indices < NC), indices, torch.full_like(indices, NC))
    chosen.scatter_(-1, idx.long(), True)
    token_mask = chosen[..., :NC].repeat_interleave(BS, dim=-1)[..., :T]  # [TQ, H, T]
    token_mask &= s[None, None, :] <= t[:, None, None]
    logits = scale * torch.einsum("thgk,shk->thgs", qg, k)
    P = _softmax_rows(logits, token_mask[:, :, None, :])
    o_slc = torch.einsum("thgs,shv->thgv", P, v).reshape(TQ, HQ, -1)
    o_slc = o_slc if g_slc is None else o_slc * g_slc[..., None]
    o = o_slc if o is None else o_slc + o
    if W > 0:
        window = (s[None, :] <= t[:, None]) & (t[:, None] - s[None, :] < W)
        P = _softmax_rows(logits, window[:, None, None, :])
        o_swa = torch.einsum("thgs,shv->thgv", P, v).reshape(TQ, HQ, -1)
        o = o + o_swa * g_swa[..., None]
    return o


def native_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g_cmp: Tensor | None = None,
    g_slc: Tensor | None = None,
    g_swa: Tensor | None = None,
    *,
    block_indices: Tensor | None = None,
    block_counts: Tensor | int = 16,
    block_size: int = 64,
    window_size: int = 0,
    scale: float | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Native sparse attention (the module docstring):
    o = g_slc o_slc + g_cmp o_cmp + g_swa o_swa, three softmax attentions over the selected
    blocks' tokens, the mean-pooled blocks, and the sliding window.

    Args:
        q: [B, TQ, HQ, K]; k: [B, T, H, K]; v: [B, T, H, V] (HQ a multiple of H, TQ <= T).
        g_cmp, g_slc, g_swa: [B, TQ, HQ] gates or None (g_swa required with window_size > 0).
        block_indices: [B, TQ, H, S] selected blocks (-1: none), or None (computed; needs g_cmp).
        block_counts: blocks kept per query: an int, or [B, TQ, H].
        block_size: tokens per block. window_size: 0 (no window) or the window's length.
        scale: None means 1 / sqrt(K). cu_seqlens: packed sequences (B = 1, TQ = T).

    Returns:
        o: [B, TQ, HQ, V] in v's dtype (computed in float32, float64 for float64).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.tensor(name, x, 4)
    B, TQ, HQ, K = q.shape
    T, H = k.shape[1], k.shape[2]
    if k.shape[0] != B or k.shape[3] != K or v.shape[:3] != k.shape[:3] or TQ > T:
        raise ValueError(
            f"q, k, v must have shapes [B, TQ, HQ, K], [B, T, H, K], [B, T, H, V] with TQ <= T, "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if H == 0 or HQ % H != 0:
        raise ValueError(f"q: the query heads ({HQ}) must be a multiple of the key heads ({H})")
    for name, x in (("g_cmp", g_cmp), ("g_slc", g_slc), ("g_swa", g_swa)):
        if x is not None:
            _checks.tensor(name, x, 3)
            if tuple(x.shape) != (B, TQ, HQ):
                raise ValueError(
                    f"{name} must have shape [B, TQ, HQ] = {(B, TQ, HQ)}, got {tuple(x.shape)}"
                )
    block_size = _checks.integer("block_size", block_size)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    window_size = _checks.integer("window_size", window_size)
    if window_size < 0:
        raise ValueError(f"window_size must be >= 0, got {window_size}")
    if window_size > 0 and g_swa is None:
        raise ValueError("g_swa: the sliding-window branch (window_size > 0) needs its gate")
    if isinstance(block_counts, Tensor):
        if tuple(block_counts.shape) != (B, TQ, H) or block_counts.dtype.is_floating_point:
            raise ValueError(
                f"block_counts must be an int or an integer [B, TQ, H] = {(B, TQ, H)} tensor"
            )
        S = int(block_counts.max()) if block_counts.numel() else 0
        counts = block_counts.long()
    else:
        S = _checks.integer("block_counts", block_counts)
        if S < 0:
            raise ValueError(f"block_counts must be >= 0, got {S}")
        counts = torch.full((B, TQ, H), S, dtype=torch.long, device=q.device)
    if block_indices is not None:
        if not isinstance(block_indices, Tensor) or block_indices.dim() != 4:
            raise ValueError("block_indices must be an integer tensor [B, TQ, H, S]")
        if tuple(block_indices.shape[:3]) != (B, TQ, H) or block_indices.dtype.is_floating_point:
            raise ValueError(
                f"block_indices must be an integer [B, TQ, H, S] tensor, B, TQ, H = {(B, TQ, H)}"
            )
    elif g_cmp is None:
        raise ValueError(
            "block_indices: without g_cmp (no compression branch) the selection must be given"
        )
    _checks.scale(scale)
    _checks.seqlens(cu_seqlens, B, T)
    if cu_seqlens is not None and TQ != T:
        raise ValueError("cu_seqlens needs q and k of the same length T")
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("native_sparse_attention", q, None, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    if B == 0 or TQ == 0:
        return v.new_zeros(B, TQ, HQ, v.shape[3])
    dtype = compute_dtype(q.dtype)
    qc, kc, vc = (x.to(dtype) for x in (q, k, v))
    gates = [None if x is None else x.to(dtype) for x in (g_cmp, g_slc, g_swa)]

    def part(n, a, b, qa, qb):
        own = [None if x is None else x[n, qa:qb] for x in gates]
        return _one(
            qc[n, qa:qb], kc[n, a:b], vc[n, a:b], *own,
            None if block_indices is None else block_indices[n, qa:qb], counts[n, qa:qb], S,
            block_size, window_size, scale,
        )  # fmt: skip

    if cu_seqlens is None:
        o = torch.stack([part(n, 0, T, 0, TQ) for n in range(B)])
    else:
        bounds = cu_seqlens.tolist()
        o = torch.cat(
            [part(0, a, b, a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
        )[None]
    return o.to(v.dtype)
