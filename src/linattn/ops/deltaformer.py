"""DeltaFormer (Zhong et al. 2025, "Understanding Transformer from the Perspective of Associative
Memory"): the delta rule's pseudo-values with a softmax kernel, then softmax attention over them.

    u_t = v_t - beta_t sum_{s < t} kappa_t(s) u_s       kappa_t = softmax_{s < t}(c q'_t . k_s)
    o_t = sum_{s <= t} softmax_{s <= t}(c q_t . k_s) u_s

(``linattn.reference.deltaformer``, whose docstring gives the conventions: q' = q as fla, or
``u_queries``; ``kernel="linear"`` for the bare product.) With L = diag(beta) P, P the strictly
lower T x T matrix of kappa, the first line is the unit lower triangular system (I + L) U = V:

- ``parallel``: one triangular solve of (I + L) U = V (spec section 8's UT form, whole);
- ``chunk``: block forward substitution, chunk by chunk: U_c = (I + L_cc)^{-1} (V_c - L_c,<c U_<c)
  (fla's kernel: its ``C``, 512 by default, is the block);
- ``recurrent``: token by token, u_t = v_t - L_t,<t U_<t.

Every form then reads o = A U with A the causal softmax (or bare) scores. Gradients: autograd
(through ``torch.linalg.solve_triangular``). The memory is not a fixed-size state (the u of
every token is kept, as a KV cache), so the registry's rule is None, like softmax attention's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import backends as _backends
from linattn.ops import checks

MODES = ("parallel", "chunk", "recurrent")
KERNELS = ("softmax", "linear")


def _scores(qh: Tensor, kh: Tensor, c: float, kernel: str, strict: bool) -> Tensor:
    """The causal weights [B, H, T, T]: softmax rows over s < t (strict) or s <= t, or the bare
    product c q.k masked; a row with no s (t = 0, strict) is zero."""
    T = qh.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=qh.device).tril(-1 if strict else 0)
    scores = c * (qh @ kh.transpose(-1, -2))
    if kernel == "linear":
        return scores * mask
    filled = scores.masked_fill(~mask, float("-inf"))
    empty = ~mask.any(-1, keepdim=True)  # row 0 when strict: a softmax over nothing
    filled = torch.where(empty, torch.zeros_like(filled), filled)
    return torch.softmax(filled, dim=-1) * mask


def _pseudo_values(L: Tensor, vh: Tensor, mode: str, C: int) -> Tensor:
    T = vh.shape[-2]
    eye = torch.eye(T, dtype=vh.dtype, device=vh.device)
    if mode == "parallel":
        return torch.linalg.solve_triangular(eye + L, vh, upper=False, unitriangular=True)
    rows: list[Tensor] = []
    step = 1 if mode == "recurrent" else C
    for a in range(0, T, step):
        b = min(a + step, T)
        rhs = vh[..., a:b, :]
        if a:
            rhs = rhs - L[..., a:b, :a] @ torch.cat(rows, dim=-2)
        if b - a > 1:
            block = eye[a:b, a:b] + L[..., a:b, a:b]
            rhs = torch.linalg.solve_triangular(block, rhs, upper=False, unitriangular=True)
        rows.append(rhs)
    return torch.cat(rows, dim=-2) if rows else vh


def _one(q, k, v, beta, qu, c, kernel, mode, C):
    qh, kh, vh, quh = (x.transpose(1, 2) for x in (q, k, v, qu))
    L = beta.transpose(1, 2).unsqueeze(-1) * _scores(quh, kh, c, kernel, strict=True)
    U = _pseudo_values(L, vh, mode, C)
    O = _scores(qh, kh, c, kernel, strict=False) @ U
    return O.transpose(1, 2), U.transpose(1, 2)


def deltaformer(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None = None,
    *,
    scale: float | None = None,
    kernel: str = "softmax",
    u_queries: Tensor | None = None,
    mode: str = "parallel",
    chunk_size: int = 512,
    cu_seqlens: Tensor | None = None,
    return_u: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """DeltaFormer (module docstring): q, k [B, T, H, D], v [B, T, H, V], beta [B, T, H] (any
    real numbers, as fla's layer feeds them; None: ones), u_queries [B, T, H, D] (None: q, fla's
    convention), ``scale`` c (None: 1/sqrt(D)), ``kernel`` "softmax" or "linear", ``mode``
    "parallel", "chunk" (blocks of ``chunk_size``) or "recurrent", ``cu_seqlens`` packed
    sequences (B = 1). Returns o [B, T, H, V], and the pseudo-values u too with ``return_u``.
    Computed in the inputs' dtype (float32 at least)."""
    B, T, H, D, V = checks.qkv(q, k, v)
    if beta is not None:
        checks.tensor("beta", beta, 3)
        if tuple(beta.shape) != (B, T, H):
            raise ValueError(
                f"beta must have shape [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}"
            )
    if u_queries is not None:
        checks.tensor("u_queries", u_queries, 4)
        if u_queries.shape != q.shape:
            raise ValueError(
                f"u_queries must have q's shape {tuple(q.shape)}, got {tuple(u_queries.shape)}"
            )
    checks.scale(scale)
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    C = checks.integer("chunk_size", chunk_size)
    if C < 1:
        raise ValueError(f"chunk_size must be >= 1, got {C}")
    checks.seqlens(cu_seqlens, B, T)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("deltaformer", q, None, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    dtype = torch.promote_types(q.dtype, torch.float32)
    c = D**-0.5 if scale is None else float(scale)
    beta = q.new_ones(B, T, H, dtype=dtype) if beta is None else beta.to(dtype)
    qu = q if u_queries is None else u_queries
    args = [x.to(dtype) for x in (q, k, v)]
    qu = qu.to(dtype)
    if cu_seqlens is None:
        o, u = _one(*args, beta, qu, c, kernel, mode, C)
    else:
        bounds = cu_seqlens.tolist()
        pieces = [
            _one(*(x[:, a:b] for x in args), beta[:, a:b], qu[:, a:b], c, kernel, mode, C)
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        o = torch.cat([p[0] for p in pieces], dim=1)
        u = torch.cat([p[1] for p in pieces], dim=1)
    o = o.to(v.dtype)
    return (o, u.to(v.dtype)) if return_u else o
