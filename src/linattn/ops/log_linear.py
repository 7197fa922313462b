"""Log-linear attention over Mamba-2's memory (Guo, Yang et al. 2025, "Log-Linear Attention").

The prefix of a token is partitioned by a Fenwick tree into O(log T) levels; level l of token t
holds the tokens s whose position differs from t's first at bit l - 1 (l(t, s) = bit_length(t XOR
s), 0 on the diagonal), and has its own weight lambda_t^(l) (``level_scales[..., l]``; a level
l >= L weighs 0). Over Mamba-2's memory (a log-decay g_t per head, the additive rule):

    O = (scale Q K^T (.) M^S (.) M^H) V,   M^S[t, s] = exp(g_{s+1} + ... + g_t),
                                            M^H[t, s] = lambda_t^(l(t, s))          (s <= t)

(paper, section 3.2; ``linattn.reference.log_linear``). Three forms, which agree to rounding:

- ``parallel``: that masked T x T product, O(T^2).
- ``chunk`` (paper, section 3.3): chunks of C tokens (C a power of two, aligned to absolute
  positions, so that a chunk's levels 0 .. log2 C are its own). Inside a chunk, the masked
  product; across chunks, the chunk states of Mamba-2's chunk form (H_c = sum_s exp(G_C - G_s)
  k_s v_s^T, the decay exp(G_C)) merged by the same Fenwick tree over chunk indices: chunk c
  reads level log2 C + 1 + j from the state of its chunk-level bucket j, which is occupied when
  bit j of c is set. O(T C) inside the chunks, O(T log T) across them.
- ``recurrent``: one token at a time over the level states (``log_linear_step``, which is also
  the decoding step): decay every level, read the occupied ones, then merge levels 1 .. z and
  the token into level z + 1, z the trailing ones of the position (the Fenwick carry).

A state is a ``LogLinearState``: the level states ``S`` [N, n, HV, K, V] (``S[:, j]`` is level
j + 1, decayed to the token before the next) and the positions ``offset`` [N] of the next token,
so a sequence can be continued (prefill, then decoding). The final state has
n = max(n0, L - 1, bit_length(offset + T)) levels: every level the sequence has occupied, or its
weights can still read.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import backends as _backends
from linattn.ops import checks

MODES = ("parallel", "recurrent", "chunk")


class LogLinearState(NamedTuple):
    """The level states of log-linear attention: ``S`` [N, n, HV, K, V] (``S[:, j]`` is Fenwick
    level j + 1, occupied when bit j of ``offset`` is set) and ``offset`` [N] (int64), the
    position of each sequence's next token."""

    S: Tensor
    offset: Tensor


def _bit_length(x: Tensor) -> Tensor:
    """bit_length of every entry of a non-negative integer tensor."""
    out = torch.zeros_like(x)
    bits = int(x.max()).bit_length() if x.numel() else 0
    for b in range(bits):
        out += (x >> b) > 0
    return out


def _weights(lam: Tensor, lvl: Tensor) -> Tensor:
    """lambda at the levels ``lvl`` [T, S] (clamped to L, a zero column): [b, HV, T, S] from
    lam [b, T, HV, L]."""
    b, T, HV, L = lam.shape
    ext = F.pad(lam, (0, 1)).permute(0, 2, 1, 3)  # [b, HV, T, L + 1]
    index = lvl.clamp(max=L).to(torch.int64)
    return torch.gather(ext, 3, index.expand(b, HV, T, index.shape[-1]))


def _occupied(p: int, first: int, n: int) -> list[int]:
    """The slots j in [first, n) occupied at position p (bit j of p set)."""
    return [j for j in range(first, n) if (p >> j) & 1]


def _initial_read(q, G, lam, S0, p, start, slots, scale):
    """scale lambda_t^(l(t, bucket j)) exp(G_t) q_t^T S0_j summed over ``slots``: the read of the
    initial level states (the buckets of position p) by the tokens at positions start + t (G
    inclusive, from position p)."""
    if not slots:
        return None
    T = q.shape[1]
    pos = start + torch.arange(T, device=q.device)
    reps = torch.tensor([(p >> (j + 1)) << (j + 1) for j in slots], device=q.device)
    W = _weights(lam, _bit_length(pos[:, None] ^ reps[None, :]))  # [b, HV, T, m]
    read = torch.einsum("bthk,bjhkv,bhtj->bthv", q, S0[:, slots], W)
    return scale * torch.exp(G)[..., None] * read


def _final_state(k, v, g, p, S0, n):
    """The level states at position p + T, n of them: token s goes to level
    bit_length((p + T) XOR (p + s)), decayed exp(G_T - G_s); the initial level j moves to the
    level of its bucket, decayed exp(G_T)."""
    b, T, HV, K = k.shape
    V = v.shape[-1]
    P = p + T
    G = torch.cumsum(g, dim=1)
    total = G[:, -1] if T else g.new_zeros(b, HV)
    pos = p + torch.arange(T, device=k.device)
    slot = _bit_length(P ^ pos) - 1
    onehot = (slot[:, None] == torch.arange(n, device=k.device)).to(k.dtype)  # [T, n]
    kd = k * torch.exp(total[:, None] - G)[..., None]
    S = torch.einsum("bshk,bshv,sj->bjhkv", kd, v, onehot)
    if S0 is not None:
        moved = [S.new_zeros(b, HV, K, V) for _ in range(n)]
        for j in _occupied(p, 0, S0.shape[1]):
            rep = (p >> (j + 1)) << (j + 1)
            moved[(P ^ rep).bit_length() - 1] = moved[(P ^ rep).bit_length() - 1] + S0[:, j]
        S = S + torch.exp(total)[:, None, :, None, None] * torch.stack(moved, 1)
    return S


def _whole(S0: Tensor | None, p: int, slots: list[int] | None = None) -> Tensor | None:
    """The sum of the occupied initial levels (all of them, or ``slots``): the whole state."""
    if S0 is None:
        return None
    slots = _occupied(p, 0, S0.shape[1]) if slots is None else slots
    return S0[:, slots].sum(1) if slots else None


def _pseudo_values(k, v, beta, decays, kd, S):
    """Gated DeltaNet's pseudo-values of a block: (I + tril(diag(beta) (K K^T (.) D), -1)) U =
    diag(beta) (V - Kd S); k, v [b, T, HV, *], decays exp(G_t - G_s) [b, HV, T, T] (0 above
    the diagonal), Kd = k exp(G) [b, T, HV, K] (G within the block), S the state entering it
    (None: zero)."""
    T = k.shape[1]
    strict = torch.ones(T, T, dtype=torch.bool, device=k.device).tril(-1)
    A = torch.einsum("bthk,bshk->bhts", k, k) * decays * strict
    A = A * beta.transpose(1, 2)[..., None]
    rhs = v if S is None else v - torch.einsum("bthk,bhkv->bthv", kd, S)
    rhs = (beta[..., None] * rhs).transpose(1, 2)  # [b, HV, T, V]
    eye = torch.eye(T, dtype=k.dtype, device=k.device)
    U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    return U.transpose(1, 2)


def _parallel(q, k, v, g, lam, p, S0, scale, beta=None):
    T = q.shape[1]
    pos = p + torch.arange(T, device=q.device)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    W = _weights(lam, _bit_length(pos[:, None] ^ pos[None, :]))
    G = torch.cumsum(g, dim=1).transpose(1, 2)  # [b, HV, T]
    diff = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, -math.inf)
    if beta is not None:  # Gated DeltaNet: its pseudo-values in place of v
        kd = k * torch.exp(G.transpose(1, 2))[..., None]
        v = _pseudo_values(k, v, beta, torch.exp(diff), kd, _whole(S0, p))
    A = scale * torch.einsum("bthk,bshk->bhts", q, k) * torch.exp(diff) * W
    o = torch.einsum("bhts,bshv->bthv", A, v)
    if S0 is not None:
        read = _initial_read(
            q, G.transpose(1, 2), lam, S0, p, p, _occupied(p, 0, S0.shape[1]), scale
        )
        o = o if read is None else o + read
    return o, v


def _chunk(q, k, v, g, lam, p, S0, scale, C, beta=None):
    b, T, HV, K = q.shape
    cb = C.bit_length() - 1  # log2 C: the levels 0 .. cb are inside a chunk
    r = p % C
    n = -(-(r + T) // C)
    pad = (r, n * C - r - T)
    q, k, v, g, lam = (F.pad(x, (0,) * (2 * x.dim() - 4) + pad) for x in (q, k, v, g, lam))
    if beta is not None:
        beta = F.pad(beta, (0, 0) + pad).unflatten(1, (n, C))  # [b, n, C, HV], 0 on the padding
    qc, kc, vc, lc = (x.unflatten(1, (n, C)) for x in (q, k, v, lam))  # [b, n, C, HV, ...]
    G = torch.cumsum(g.unflatten(1, (n, C)), dim=2)  # [b, n, C, HV], inclusive within a chunk
    # Inside the chunks: the masked product (the chunk's own levels, aligned positions).
    idx = torch.arange(C, device=q.device)
    causal = idx[:, None] >= idx[None, :]
    lvl = _bit_length(idx[:, None] ^ idx[None, :])
    W = _weights(lc.flatten(0, 1), lvl).unflatten(0, (b, n))  # [b, n, HV, C, C]
    Gh = G.permute(0, 1, 3, 2)  # [b, n, HV, C]
    diff = (Gh[..., :, None] - Gh[..., None, :]).masked_fill(~causal, -math.inf)
    A = scale * torch.einsum("bcthk,bcshk->bchts", qc, kc) * torch.exp(diff) * W
    # The base mechanism's chunk states (H_c = sum_s exp(G_C - G_s) k_s u_s^T) and decays.
    last = G[:, :, -1]  # [b, n, HV]
    Ke = kc * torch.exp(last[:, :, None] - G)[..., None]
    Dc = torch.exp(last)[..., None, None]  # [b, n, HV, 1, 1]
    if beta is None:  # Mamba-2: u = v, every chunk state at once
        Hc = torch.einsum("bcshk,bcshv->bchkv", Ke, vc)
    else:  # Gated DeltaNet: the pseudo-values read the state entering the chunk (below)
        Hc, U = [None] * n, [None] * n
        Kd = kc * torch.exp(G)[..., None]
    a0 = (p - r) // C
    F_: list[Tensor | None] = []  # the chunk-level level states: F_[j] is token slot j + cb
    reads = [None] * n
    if S0 is not None:
        low = _occupied(p, 0, min(cb, S0.shape[1]))
        reads[0] = _initial_read(qc[:, 0], G[:, 0], lc[:, 0], S0, p, p - r, low, scale)
        if reads[0] is not None:  # the initial tokens of the first chunk, read in place
            reads[0] = reads[0].clone()
            reads[0][:, :r] = 0
        F_ = [S0[:, j] if (p >> j) & 1 else None for j in range(cb, S0.shape[1])]
    for c in range(n):
        a = a0 + c
        if beta is not None:
            whole = [f for f in F_ if f is not None]
            if c == 0 and S0 is not None and low:
                whole.append(S0[:, low].sum(1))
            entering = torch.stack(whole).sum(0) if whole else None
            U[c] = _pseudo_values(kc[:, c], vc[:, c], beta[:, c], torch.exp(diff[:, c]),
                                  Kd[:, c], entering)  # fmt: skip
            Hc[c] = torch.einsum("bshk,bshv->bhkv", Ke[:, c], U[c])
        if c == 0 and S0 is not None and low:  # the initial low levels join the first chunk
            Hc0 = (Hc[c] if beta is not None else Hc[:, 0]) + Dc[:, 0] * S0[:, low].sum(1)
            if beta is None:
                Hc = torch.cat([Hc0[:, None], Hc[:, 1:]], 1)
            else:
                Hc[0] = Hc0
        occ = [j for j in range(len(F_)) if (a >> j) & 1 and F_[j] is not None]
        if occ:
            idx_l = torch.tensor([j + cb + 1 for j in occ], device=q.device)
            Wc = F.pad(lc[:, c], (0, 1)).index_select(-1, idx_l.clamp(max=lam.shape[-1]))
            read = torch.einsum(
                "bthk,bjhkv,bthj->bthv", qc[:, c], torch.stack([F_[j] for j in occ], 1), Wc
            )
            read = scale * torch.exp(G[:, c])[..., None] * read
            reads[c] = read if reads[c] is None else reads[c] + read
        if c == n - 1:
            break
        z = 0
        while (a >> z) & 1:  # the Fenwick carry over chunk indices
            z += 1
        merged = Hc[:, c] if beta is None else Hc[c]
        for j in range(min(z, len(F_))):
            if F_[j] is not None:
                merged = merged + Dc[:, c] * F_[j]
        F_ = [None if j < z else (f if f is None else Dc[:, c] * f) for j, f in enumerate(F_)]
        F_ += [None] * (z + 1 - len(F_))
        F_[z] = merged
    U = vc if beta is None else torch.stack(U, 1)  # [b, n, C, HV, V]
    o = torch.einsum("bchts,bcshv->bcthv", A, U)
    inter = torch.stack(
        [o.new_zeros(o.shape[0], C, *o.shape[3:]) if x is None else x for x in reads], 1
    )
    return (o + inter).flatten(1, 2)[:, r : r + T], U.flatten(1, 2)[:, r : r + T]


def _step(S, pos, q, k, v, g, lam, scale, beta=None):
    """One token for every row: S [b, n, HV, K, V] at positions ``pos`` [b]; q, k [b, HV, K],
    v [b, HV, V], g [b, HV], lam [b, HV, L], beta None (Mamba-2) or [b, HV] (Gated DeltaNet).
    Returns (o [b, HV, V], S at pos + 1, the token's write u [b, HV, V])."""
    b, n = S.shape[:2]
    need = int(_bit_length(pos + 1).max()) if b else 0
    if need > n:
        S = torch.cat([S, S.new_zeros(b, need - n, *S.shape[2:])], 1)
        n = need
    S = S * torch.exp(g)[:, None, :, None, None]
    slots = torch.arange(n, device=S.device)
    bits = ((pos[:, None] >> slots) & 1).to(S.dtype)  # [b, n]
    L = lam.shape[-1]
    ext = F.pad(lam, (0, 1))
    W = ext[..., (slots + 1).clamp(max=L)] * bits[:, None, :]  # [b, HV, n]
    if beta is not None:  # the delta rule reads the whole decayed state: every occupied level
        whole = torch.einsum("bjhkv,bj->bhkv", S, bits)
        v = beta[..., None] * (v - torch.einsum("bhk,bhkv->bhv", k, whole))
    o = ext[..., 0:1] * (q * k).sum(-1, keepdim=True) * v
    o = scale * (o + torch.einsum("bhk,bjhkv,bhj->bhv", q, S, W))
    z = _bit_length(pos ^ (pos + 1)) - 1  # the trailing ones of pos
    below = (slots[None, :] < z[:, None]).to(S.dtype)[..., None, None, None]
    at = (slots[None, :] == z[:, None]).to(S.dtype)[..., None, None, None]
    merged = torch.einsum("bhk,bhv->bhkv", k, v) + (below * S).sum(1)
    return o, S * (1 - below - at) + at * merged[:, None], v


def _recurrent(q, k, v, g, lam, p, S0, scale, n, beta=None):
    b, T, HV, K = q.shape
    S = q.new_zeros(b, max(n, 1), HV, K, v.shape[-1]) if S0 is None else S0
    pos = torch.full((b,), p, dtype=torch.int64, device=q.device)
    out, writes = [], []
    for t in range(T):
        bt = None if beta is None else beta[:, t]
        o, S, u = _step(S, pos + t, q[:, t], k[:, t], v[:, t], g[:, t], lam[:, t], scale, bt)
        out.append(o)
        writes.append(u)
    if not out:
        return v.new_zeros(b, 0, HV, v.shape[-1]), v
    return torch.stack(out, 1), torch.stack(writes, 1)


def _check(q, k, v, g, level_scales, scale, initial_state, cu_seqlens, mode, chunk_size):
    B, T, H, HV, K, V = checks.grouped_qkv(q, k, v)
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    chunk_size = checks.integer("chunk_size", chunk_size)
    if chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two (the levels of a chunk are its own), "
                         f"got {chunk_size}")  # fmt: skip
    checks.tensor("g", g, 3)
    checks.gate(g, B, T, HV, K)
    if g.dim() != 3:
        raise ValueError(f"g must have shape [B, T, HV] = {(B, T, HV)} (one log-decay per head)")
    checks.tensor("level_scales", level_scales, 4)
    if tuple(level_scales.shape[:3]) != (B, T, HV) or level_scales.shape[3] < 1:
        raise ValueError(f"level_scales must have shape [B, T, HV, L] with B, T, HV = {(B, T, HV)} "
                         f"and L >= 1, got {tuple(level_scales.shape)}")  # fmt: skip
    checks.scale(scale)
    N = checks.seqlens(cu_seqlens, B, T)
    if initial_state is not None:
        if not isinstance(initial_state, LogLinearState):
            raise TypeError(f"initial_state must be a LogLinearState, got "
                            f"{type(initial_state).__name__}")  # fmt: skip
        S0, off = initial_state
        checks.tensor("initial_state.S", S0, 5)
        if S0.shape[0] != N or tuple(S0.shape[2:]) != (HV, K, V):
            raise ValueError(f"initial_state.S must have shape [N, n, HV, K, V] with N, HV, K, V = "
                             f"{(N, HV, K, V)}, got {tuple(S0.shape)}")  # fmt: skip
        if not isinstance(off, Tensor) or off.dtype.is_floating_point or tuple(off.shape) != (N,):
            raise ValueError(f"initial_state.offset must be an integer tensor of shape [N] = "
                             f"{(N,)}")  # fmt: skip
        if bool((off < 0).any()):
            raise ValueError("initial_state.offset must be >= 0")
    return B, T, H, HV, K, V, N, chunk_size


def log_linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    level_scales: Tensor,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: LogLinearState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    beta: Tensor | None = None,
) -> tuple[Tensor, LogLinearState | None]:
    """Log-linear Mamba-2: O = (scale Q K^T (.) M^S (.) M^H) V (the module docstring; Guo, Yang
    et al. 2025, sections 3.2-3.3).

    q, k: [B, T, H, K]; v: [B, T, HV, V] (HV a multiple of H: value head j reads q/k head
    j // (HV // H)); g: [B, T, HV] log-decays <= 0; level_scales: [B, T, HV, L], lambda_t^(l)
    (levels l >= L weigh 0); ``scale`` None is 1 / sqrt(K); ``mode`` "parallel", "recurrent" or
    "chunk" (``chunk_size`` a power of two); ``initial_state`` a ``LogLinearState`` (N = B, or
    the number of sequences of ``cu_seqlens``); returns (o [B, T, HV, V], the final
    ``LogLinearState`` or None).

    ``beta`` [B, T, HV] in [0, 2]: log-linear Gated DeltaNet (section 3.4) instead, V replaced by
    Gated DeltaNet's pseudo-values U, (I + tril(diag(beta) (K K^T (.) M^S), -1)) U = diag(beta) V,
    whose writes read the whole state (the sum of the levels).
    """
    B, T, H, HV, K, V, N, C = _check(q, k, v, g, level_scales, scale, initial_state, cu_seqlens,
                                      mode, chunk_size)  # fmt: skip
    if beta is not None:
        checks.beta(beta, B, T, HV, layout="[B, T, HV]")
    output_final_state = checks.flag("output_final_state", output_final_state)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("log_linear_attention", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    scale = K**-0.5 if scale is None else float(scale)
    dtype = compute_dtype(v.dtype)
    if HV != H:
        q, k = (x.repeat_interleave(HV // H, dim=2) for x in (q, k))
    q, k, v, g, lam = (x.to(dtype) for x in (q, k, v, g, level_scales))
    beta = None if beta is None else beta.to(dtype)
    L = lam.shape[-1]
    if initial_state is None:
        S0, offsets, n0 = None, [0] * N, 0
    else:
        S0, offsets, n0 = (
            initial_state.S.to(dtype),
            initial_state.offset.tolist(),
            initial_state.S.shape[1],
        )
    if cu_seqlens is None:
        pieces = [(slice(None), rows, 0, T) for rows in _rows_by_offset(offsets)]
        pieces = pieces or [(slice(None), [], 0, T)]  # an empty batch: one empty piece
    else:
        bounds = cu_seqlens.tolist()
        pieces = [(slice(n, n + 1), [n], bounds[n], bounds[n + 1]) for n in range(N)]
    lengths = (
        [T] * N if cu_seqlens is None else [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    )
    n_out = max([n0, L - 1] + [(o + t).bit_length() for o, t in zip(offsets, lengths, strict=True)])
    outs, states = [], {}
    for _, rows, bos, eos in pieces:
        p = offsets[rows[0]] if rows else 0
        if cu_seqlens is not None:
            x = [t[:, bos:eos] for t in (q, k, v, g, lam)]
            bx = None if beta is None else beta[:, bos:eos]
        else:
            x = [t if len(rows) == B else t[rows] for t in (q, k, v, g, lam)]
            bx = None if beta is None else (beta if len(rows) == B else beta[rows])
        S0r = None if S0 is None else S0[rows]
        if mode == "parallel" or x[0].shape[1] == 0:  # no token: the (empty) product
            o, U = _parallel(*x, p, S0r, scale, bx)
        elif mode == "chunk":
            o, U = _chunk(*x, p, S0r, scale, C, bx)
        else:
            o, U = _recurrent(*x, p, S0r, scale, n0, bx)
        outs.append((rows, o))
        if output_final_state:  # what the tokens wrote: v, or Gated DeltaNet's U
            Sf = _final_state(x[1], U, x[3], p, S0r, n_out)
            states.update({row: Sf[i] for i, row in enumerate(rows)})
    if cu_seqlens is None:
        o = torch.empty(B, T, HV, V, dtype=dtype, device=v.device)
        order = [row for rows, _ in outs for row in rows]
        o = torch.cat([x for _, x in outs], 0)[torch.argsort(torch.tensor(order))] if outs else o
    else:
        o = torch.cat([x for _, x in outs], 1) if outs else v.new_zeros(1, 0, HV, V, dtype=dtype)
    final = None
    if output_final_state:
        S = (
            torch.stack([states[n] for n in range(N)])
            if N
            else v.new_zeros(0, n_out, HV, K, V, dtype=dtype)
        )
        off = torch.tensor(
            [o_ + t for o_, t in zip(offsets, lengths, strict=True)],
            dtype=torch.int64,
            device=v.device,
        )
        final = LogLinearState(S, off)
    return o.to(v.dtype), final


def _rows_by_offset(offsets: list[int]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for row, p in enumerate(offsets):
        groups.setdefault(p, []).append(row)
    return list(groups.values())


def log_linear_step(
    state: LogLinearState,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    level_scales: Tensor,
    *,
    scale: float | None = None,
    beta: Tensor | None = None,
) -> tuple[Tensor, LogLinearState]:
    """One decoding step of log-linear Mamba-2 (the recurrent form's step; paper, section 3.2):

        S^(l) <- exp(g_t) S^(l)
        o_t = scale (lambda^(0) (q.k) v + sum_{l occupied} lambda^(l) S^(l)T q)
        S^(z+1) <- k v^T + S^(1) + ... + S^(z);  S^(1..z) <- 0   (z: the trailing ones of t)

    state: ``LogLinearState`` (S [B, n, HV, K, V], offset [B]); q, k: [B, H, K]; v: [B, HV, V];
    g: [B, HV]; level_scales: [B, HV, L]. Returns (o [B, HV, V], the state at offset + 1; n
    grows by one when the position needs a new level).
    """
    if not isinstance(state, LogLinearState):
        raise TypeError(f"state must be a LogLinearState, got {type(state).__name__}")
    checks.tensor("q", q, 3)
    checks.tensor("k", k, 3)
    checks.tensor("v", v, 3)
    B, H, K = q.shape
    if tuple(k.shape) != (B, H, K) or v.shape[0] != B or v.shape[1] % H:
        raise ValueError(f"k must have shape [B, H, K] = {(B, H, K)} and v [B, HV, V] with HV a "
                         f"multiple of H, got {tuple(k.shape)} and {tuple(v.shape)}")  # fmt: skip
    HV, V = v.shape[1:]
    checks.gate(g, B, HV, K, layout="[B, H]")
    if g is None or g.dim() != 2:
        raise ValueError(f"g must have shape [B, HV] = {(B, HV)}")
    checks.tensor("level_scales", level_scales, 3)
    if tuple(level_scales.shape[:2]) != (B, HV):
        raise ValueError(f"level_scales must have shape [B, HV, L] with B, HV = {(B, HV)}")
    S, pos = state
    checks.tensor("state.S", S, 5)
    if S.shape[0] != B or tuple(S.shape[2:]) != (HV, K, V):
        raise ValueError(f"state.S must have shape [B, n, HV, K, V] with B, HV, K, V = "
                         f"{(B, HV, K, V)}, got {tuple(S.shape)}")  # fmt: skip
    checks.scale(scale)
    if beta is not None:
        checks.beta(beta, B, HV, layout="[B, HV]")
    scale = K**-0.5 if scale is None else float(scale)
    if HV != H:
        q, k = (x.repeat_interleave(HV // H, dim=1) for x in (q, k))
    dtype = compute_dtype(v.dtype)
    inputs = (x.to(dtype) for x in (q, k, v, g, level_scales))
    bt = None if beta is None else beta.to(dtype)
    o, S, _ = _step(S.to(dtype), pos, *inputs, scale, bt)
    return o.to(v.dtype), LogLinearState(S, pos + 1)


def empty_state(B: int, HV: int, K: int, V: int, L: int = 1, *, dtype=torch.float32,
                device=None) -> LogLinearState:  # fmt: skip
    """The state of B sequences at position 0: L - 1 empty levels (at least one)."""
    S = torch.zeros(B, max(L - 1, 1), HV, K, V, dtype=dtype, device=device)
    return LogLinearState(S, torch.zeros(B, dtype=torch.int64, device=device))


def log_linear_state(
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    levels: int = 1,
    initial_state: LogLinearState | None = None,
    cu_seqlens: Tensor | None = None,
) -> LogLinearState:
    """The level states after the tokens (k, v, g) without the outputs: token s goes to level
    l(P, s) = bit_length(P XOR s) of the end position P, decayed exp(g_{s+1} + ... + g_P), and
    an initial level to the level of its bucket (paper, section 3.1; O(T K V)).

    k: [B, T, HV, K] (key heads already grouped to the value heads); v: [B, T, HV, V]; g:
    [B, T, HV]; ``levels``: the least number of level states returned (an op's L - 1).
    """
    B, T, HV, K, V = checks.kv(k, v)
    checks.tensor("g", g, 3)
    checks.gate(g, B, T, HV, K)
    levels = checks.integer("levels", levels)
    q = k.new_zeros(B, T, HV, K)
    lam = k.new_zeros(B, T, HV, max(levels + 1, 1))
    N = checks.seqlens(cu_seqlens, B, T)
    if initial_state is None:
        S0, offsets, n0 = None, [0] * N, 0
    else:
        _check(q, k, v, g, lam, None, initial_state, cu_seqlens, "chunk", 1)
        S0, offsets, n0 = initial_state.S, initial_state.offset.tolist(), initial_state.S.shape[1]
    if cu_seqlens is None:
        seqs = [(slice(r, r + 1), 0, T) for r in range(B)]
    else:
        bounds = cu_seqlens.tolist()
        seqs = [(slice(0, 1), bounds[i], bounds[i + 1]) for i in range(N)]
    ends = [p + e - b for (_, b, e), p in zip(seqs, offsets, strict=True)]
    n = max([n0, levels] + [end.bit_length() for end in ends])
    dtype = compute_dtype(v.dtype)
    k, v, g = (t.to(dtype) for t in (k, v, g))
    S = [
        _final_state(*(t[sel, b:e] for t in (k, v, g)), p,
                     None if S0 is None else S0[i : i + 1].to(dtype), n)[0]
        for i, ((sel, b, e), p) in enumerate(zip(seqs, offsets, strict=True))
    ]  # fmt: skip
    S = torch.stack(S) if N else k.new_zeros(0, n, HV, K, V)
    return LogLinearState(S, torch.tensor(ends, dtype=torch.int64, device=k.device))
