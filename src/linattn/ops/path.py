"""PaTH attention (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations"): softmax attention whose scores carry each key through the
Householder-like transitions H_i = I - beta_i w_i w_i^T of the tokens after it.

    a_ts = q_t^T H_t ... H_{s+1} k_s,   o_t = sum_{s <= t} softmax_s(c (a_ts + G_t - G_s)) v_s

(``linattn.reference.path``: fla 0.6.0's conventions.) The forms of the scores:

- ``parallel``, the masked product with the UT (WY) representation: the product of a run of
  transitions is I - W^T T diag(beta) W with T = (I + L)^{-1}, L the strictly lower
  diag(beta) W W^T, so that A = tril(Q K^T) - tril(Q W^T) T M, M the strictly lower
  diag(beta) W K^T;
- ``chunk``, the paper's blockwise form: inside a block of C tokens the same; across blocks each
  key is carried to the end of its block (k - W^T T M), each query back to the start of its
  block (q - tril(Q W^T) T diag(beta) W), and the query then crosses the blocks between them, one
  block's product I - W^T T diag(beta) W at a time. The attention runs block by block with an
  online softmax (FlashAttention's running maximum and sum), so that no T x T matrix is formed:
  O(T C + T D) memory besides autograd's (``path_scores`` of this form does form them);
- ``recurrent``, decoding: the cache of carried keys, H_t applied to all of them at token t
  (a rank-one update), then the scores q_t . (cache).

Gradients: autograd. The scores are those of softmax attention (no fixed-size memory): the
registry's rule is None.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops import backends as _backends
from linattn.ops import checks

MODES = ("parallel", "chunk", "recurrent")


def _ut(w: Tensor, beta: Tensor) -> Tensor:
    """T = (I + strict_tril(diag(beta) W W^T))^{-1} for blocks w [..., C, D], beta [..., C]."""
    C = w.shape[-2]
    eye = torch.eye(C, dtype=w.dtype, device=w.device)
    L = (beta.unsqueeze(-1) * (w @ w.transpose(-1, -2))).tril(-1)
    return torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False)


def _block_terms(q, k, w, beta):
    """For blocks [..., C, D]: the local scores (s <= t in the block), the queries carried to
    the block's start, the keys carried to its end, and the block's product minus I."""
    Tm = _ut(w, beta)
    wb = beta.unsqueeze(-1) * w
    M = (wb @ k.transpose(-1, -2)).tril(-1)  # beta_j w_j . k_s, j > s
    TM = Tm @ M
    qw = (q @ w.transpose(-1, -2)).tril()  # q_t . w_i, i <= t
    local = (q @ k.transpose(-1, -2)).tril() - qw @ TM
    q_start = q - qw @ (Tm @ wb)
    k_end = k - TM.transpose(-1, -2) @ w
    block = w.transpose(-1, -2) @ (Tm @ wb)  # I - (the block's product), as a row-vector map
    return local, q_start, k_end, block


def _scores_chunk(q, k, w, beta, C):
    """Scores a [B, H, T, T] (s <= t; 0 above the diagonal), heads first, blocks of C."""
    B, H, T, D = q.shape
    N = -(-T // C)
    pad = N * C - T
    if pad:
        q, k, w = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, w))
        beta = F.pad(beta, (0, pad))
    blocks = [x.reshape(B, H, N, C, D) for x in (q, k, w)]
    local, q_start, k_end, block = _block_terms(*blocks, beta.reshape(B, H, N, C))
    rows = []
    for i in range(N):
        row = [None] * N
        row[i] = local[:, :, i]
        cur = q_start[:, :, i]
        for j in range(i - 1, -1, -1):
            row[j] = cur @ k_end[:, :, j].transpose(-1, -2)
            cur = cur - cur @ block[:, :, j]
        zeros = q.new_zeros(B, H, C, C)
        rows.append(torch.cat([r if r is not None else zeros for r in row], dim=-1))
    return torch.cat(rows, dim=-2)[:, :, :T, :T]


def _scores_recurrent(q, k, w, beta):
    """Scores and the final carried keys by the decoding recurrence (module docstring)."""
    B, H, T, D = q.shape
    cache = q.new_zeros(B, H, 0, D)
    rows = []
    for t in range(T):
        wt = w[:, :, t : t + 1]  # [B, H, 1, D]
        cache = cache - beta[:, :, t, None, None] * (cache @ wt.transpose(-1, -2)) * wt
        cache = torch.cat([cache, k[:, :, t : t + 1]], dim=-2)
        row = (q[:, :, t : t + 1] @ cache.transpose(-1, -2)).squeeze(-2)
        rows.append(F.pad(row, (0, T - t - 1)))
    return torch.stack(rows, dim=-2), cache


def _carried_keys(k, w, beta):
    """H_T ... H_{s+1} k_s for every s (what decoding caches), by the suffix recurrence."""
    T = k.shape[-2]
    out = [k[:, :, T - 1]] if T else []
    for s in range(T - 2, -1, -1):
        x = k[:, :, s]
        for i in range(s + 1, T):
            x = x - beta[:, :, i, None] * (x * w[:, :, i]).sum(-1, keepdim=True) * w[:, :, i]
        out.append(x)
    return torch.stack(out[::-1], dim=-2) if out else k


def path_scores(
    q: Tensor, k: Tensor, w: Tensor, beta: Tensor, *, mode: str = "chunk", chunk_size: int = 64
) -> Tensor:
    """The PaTH scores a_ts = q_t^T H_t ... H_{s+1} k_s (s <= t; 0 for s > t) of q, k, w
    [B, T, H, D] and beta [B, T, H] (one head each: no grouping), as [B, H, T, T], in the form
    ``mode`` (module docstring)."""
    qh, kh, wh = (x.transpose(1, 2) for x in (q, k, w))
    bh = beta.transpose(1, 2)
    if mode == "recurrent":
        return _scores_recurrent(qh, kh, wh, bh)[0]
    T = q.shape[1]
    return _scores_chunk(qh, kh, wh, bh, max(T, 1) if mode == "parallel" else chunk_size)


def _attend_chunk(q, k, v, w, beta, G, c, C):
    """softmax_s(c (a_ts + G_t - G_s)) v_s of heads-first q, k, w [B, H, T, D], v [B, H, T, V],
    beta [B, H, T] and G [B, H, T] (the gates' running sums, or None), block by block: query
    block i meets its own block (masked) and then the key blocks j < i, nearest first, its
    carried query crossing block j + 1 before block j; each block's scores join an online softmax
    (running maximum m, sum l and weighted values)."""
    B, H, T, D = q.shape
    N = -(-T // C)
    pad = N * C - T
    if pad:  # padded keys come after every real query: masked, or in no earlier block
        q, k, v, w = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, w))
        beta = F.pad(beta, (0, pad))
        G = None if G is None else F.pad(G, (0, pad))
    qb, kb, vb, wb = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v, w))
    local, q_start, k_end, block = _block_terms(qb, kb, wb, beta.reshape(B, H, N, C))
    Gb = None if G is None else G.reshape(B, H, N, C)
    future = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    outs = []
    for i in range(N):
        s = local[:, :, i]
        if Gb is not None:
            s = s + Gb[:, :, i, :, None] - Gb[:, :, i, None, :]
        s = (c * s).masked_fill(future, float("-inf"))
        m = s.amax(-1, keepdim=True).detach()  # the diagonal is never masked: finite
        p = torch.exp(s - m)
        total, acc = p.sum(-1, keepdim=True), p @ vb[:, :, i]
        cur = q_start[:, :, i]
        for j in range(i - 1, -1, -1):
            s = cur @ k_end[:, :, j].transpose(-1, -2)
            cur = cur - cur @ block[:, :, j]
            if Gb is not None:
                s = s + Gb[:, :, i, :, None] - Gb[:, :, j, None, :]
            s = c * s
            m_new = torch.maximum(m, s.amax(-1, keepdim=True).detach())
            shrink = torch.exp(m - m_new)
            p = torch.exp(s - m_new)
            total = total * shrink + p.sum(-1, keepdim=True)
            acc = acc * shrink + p @ vb[:, :, j]
            m = m_new
        outs.append(acc / total)
    return torch.cat(outs, dim=-2)[:, :, :T]


def _one(q, k, v, w, beta, g, c, mode, C, want_cache):
    HQ, H = q.shape[2], k.shape[2]
    cache = None
    if want_cache:
        heads = [x.transpose(1, 2) for x in (k, w, beta)]
        cache = _carried_keys(*heads).transpose(1, 2)
    if HQ != H:  # grouped heads: query head h reads key head h // (HQ / H), as fla
        k, v, w = (x.repeat_interleave(HQ // H, dim=2) for x in (k, v, w))
        beta = beta.repeat_interleave(HQ // H, dim=2)
    T = q.shape[1]
    if mode == "chunk" and T:
        heads = [x.transpose(1, 2) for x in (q, k, v, w, beta)]
        G = None if g is None else g.transpose(1, 2).cumsum(-1)
        return _attend_chunk(*heads, G, c, C).transpose(1, 2), cache
    a = path_scores(q, k, w, beta, mode=mode, chunk_size=C)
    if g is not None:
        G = g.transpose(1, 2).cumsum(-1)
        a = a + G.unsqueeze(-1) - G.unsqueeze(-2)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    p = torch.softmax((c * a).masked_fill(~mask, float("-inf")), dim=-1)
    o = (p @ v.transpose(1, 2)).transpose(1, 2)
    return o, cache


def path_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    cu_seqlens: Tensor | None = None,
    return_k_cache: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """PaTH attention (module docstring): q [B, T, HQ, D], k, w [B, T, H, D], v [B, T, H, V],
    beta [B, T, H] (any real: 0 gives the identity, 2 with unit w a reflection), g [B, T, HQ]
    log forget gates <= 0 or None, ``scale`` c (None: 1/sqrt(D)), ``mode`` "parallel", "chunk"
    (blocks of ``chunk_size``) or "recurrent", ``cu_seqlens`` packed sequences (B = 1). Returns
    o [B, T, HQ, V], and with ``return_k_cache`` the carried keys H_T ... H_{s+1} k_s
    [B, T, H, D] (per packed sequence)."""
    for name, x in (("q", q), ("k", k), ("v", v), ("w", w)):
        checks.tensor(name, x, 4)
    B, T, HQ, D = q.shape
    H = k.shape[2]
    if k.shape[:2] != (B, T) or k.shape[3] != D:
        raise ValueError(
            f"k must have shape [B, T, H, D] with B, T, D = {(B, T, D)}, got {tuple(k.shape)}"
        )
    if HQ % H:
        raise ValueError(f"q's heads ({HQ}) must be a multiple of k's ({H})")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape [B, T, H, V] = {tuple(k.shape[:3])} + (V,), got {tuple(v.shape)}"
        )
    if w.shape != k.shape:
        raise ValueError(f"w must have k's shape {tuple(k.shape)}, got {tuple(w.shape)}")
    checks.tensor("beta", beta, 3)
    if tuple(beta.shape) != (B, T, H):
        raise ValueError(f"beta must have shape [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    if g is not None:
        checks.gate(g, B, T, HQ, D)
        if g.dim() != 3:
            raise ValueError(f"g must have shape [B, T, HQ] = {(B, T, HQ)}, got {tuple(g.shape)}")
    checks.scale(scale)
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    C = checks.integer("chunk_size", chunk_size)
    if C < 1:
        raise ValueError(f"chunk_size must be >= 1, got {C}")
    checks.seqlens(cu_seqlens, B, T)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("path_attention", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    dtype = torch.promote_types(q.dtype, torch.float32)
    c = D**-0.5 if scale is None else float(scale)
    xs = [x.to(dtype) for x in (q, k, v, w, beta)]
    gd = None if g is None else g.to(dtype)
    if cu_seqlens is None:
        o, cache = _one(*xs, gd, c, mode, C, return_k_cache)
    else:
        bounds = cu_seqlens.tolist()
        pieces = [
            _one(*(x[:, a:b] for x in xs), None if gd is None else gd[:, a:b], c, mode, C,
                 return_k_cache)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]  # fmt: skip
        o = torch.cat([p[0] for p in pieces], dim=1)
        cache = torch.cat([p[1] for p in pieces], dim=1) if return_k_cache else None
    o = o.to(v.dtype)
    return (o, cache.to(k.dtype)) if return_k_cache else o
