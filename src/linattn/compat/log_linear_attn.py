"""fla's log-linear attention (``fla.ops.log_linear_attn``): log-linear Mamba-2.

    O = (scale Q K^T (.) M^S (.) M^H) V,   M^S[t, s] = exp(g_{s+1} + ... + g_t),
    M^H[t, s] = lambda_t^(l(t, s)),  l(t, s) = bit_length(t XOR s)  (0 on the diagonal)

(Guo, Yang et al. 2025, "Log-Linear Attention"; ``linattn.ops.log_linear``, which computes it).
fla's conventions: q, k [B, T, G, K] shared by H / G consecutive value heads, v [B, T, H, V],
g [B, T, H], level_scales [B, T, H, L], ``scale=1.0`` by default (None: 1 / sqrt(K)).

fla's state, ``LogLinearAttentionState``, is its kernel's: chunks of 64 tokens, so it holds

- ``ht`` [N, MAX_LEVEL + 2, H, K, V]: the chunk-level Fenwick states at the last chunk boundary
  of the sequence (``ht[:, j]`` is token level j + 7; the tokens of the last, partial chunk are
  not in it), float32 (float64 for float64 inputs here);
- ``offsets`` [N] (int32): the tokens seen;
- ``q_prev``, ``k_prev``, ``v_prev``, ``g_prev``, ``level_scales_prev`` [N, 64, ...]: the raw
  tokens of that partial chunk, at rows 0 .. offsets % 64 - 1 (zeros after), which a continued
  call runs again before its own tokens.

Here a continued sequence is its partial chunk's tokens, then its own, from the level states of
``ht`` at position ``offsets - offsets % 64``; their first outputs are dropped. fla's own
``LogLinearAttentionState`` is accepted too. fla's kernel reads level l >= L as weight 0 across
chunks, but inside a chunk it reads ``level_scales`` past the L given when a pair's level is
>= L (L < 7 with T > 2^(L - 1)): here every level >= L weighs 0, as its naive reference would
have it. fla's limits of its kernel (K a multiple of 64, V a power of two, sequences shorter than
2^17) are not copied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import checks
from linattn.ops.log_linear import LogLinearState, log_linear_attention, log_linear_state

BT = 64  # fla's chunk: its state's unit
INTRA = 6  # log2 BT: ht[:, j] is token level j + 7, linattn's level-state slot j + 6


@dataclass
class LogLinearAttentionState:
    """fla's ``LogLinearAttentionState`` (the module docstring): ``ht`` the chunk-level states,
    ``offsets`` the tokens seen, the ``*_prev`` the tokens of the last, partial chunk."""

    ht: Tensor
    offsets: Tensor
    q_prev: Tensor
    k_prev: Tensor
    v_prev: Tensor
    g_prev: Tensor
    level_scales_prev: Tensor


_FIELDS = ("ht", "offsets", "q_prev", "k_prev", "v_prev", "g_prev", "level_scales_prev")


def _check_state(state: object, N: int, G: int, H: int, K: int, V: int, L: int) -> None:
    missing = [f for f in _FIELDS if not isinstance(getattr(state, f, None), Tensor)]
    if missing:
        raise TypeError(
            f"initial_state must be a LogLinearAttentionState (tensors {_FIELDS}), got "
            f"{type(state).__name__} without {missing}"
        )
    want = {
        "offsets": (N,), "q_prev": (N, BT, G, K), "k_prev": (N, BT, G, K),
        "v_prev": (N, BT, H, V), "g_prev": (N, BT, H), "level_scales_prev": (N, BT, H, L),
    }  # fmt: skip
    for name, shape in want.items():
        if tuple(getattr(state, name).shape) != shape:
            raise ValueError(
                f"initial_state.{name} must have shape {shape}, got "
                f"{tuple(getattr(state, name).shape)}"
            )
    ht = state.ht
    if ht.dim() != 5 or ht.shape[0] != N or tuple(ht.shape[2:]) != (H, K, V):
        raise ValueError(
            f"initial_state.ht must have shape [N, levels, H, K, V] with N, H, K, V = "
            f"{(N, H, K, V)}, got {tuple(ht.shape)}"
        )
    if state.offsets.dtype.is_floating_point or bool((state.offsets < 0).any()):
        raise ValueError("initial_state.offsets must be integers >= 0")


def _max_level(lengths: list[int], offsets: list[int], output_final_state: bool) -> int:
    """fla's MAX_LEVEL: the chunk levels its kernel keeps (its ``ht`` has MAX_LEVEL + 2)."""
    totals = [n + p for n, p in zip(lengths, offsets, strict=True)]
    NT = max(-(-t // BT) for t in totals)
    level = math.ceil(math.log(NT, 2)) - 1 if NT > 0 else -1
    if output_final_state and max(totals) // BT > 0:
        level = max(level, math.floor(math.log2(max(totals) // BT)))
    return level


def chunk_log_linear_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    level_scales: Tensor,
    initial_state: LogLinearAttentionState | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    scale: float | None = 1.0,
) -> tuple[Tensor, LogLinearAttentionState | None]:
    """fla's ``chunk_log_linear_attn``: O = (scale Q K^T (.) M^S (.) M^H) V (the module
    docstring; Guo, Yang et al. 2025, section 3). Returns (o [B, T, H, V], the final
    ``LogLinearAttentionState`` or None)."""
    B, T, G, H, K, V = checks.grouped_qkv(q, k, v)
    if cu_seqlens is not None and B != 1:
        raise ValueError(
            f"The batch size is expected to be 1 rather than {B} when using `cu_seqlens`."
            f"Please flatten variable-length inputs before processing."
        )
    checks.tensor("g", g, 3)
    if tuple(g.shape) != (B, T, H):
        raise ValueError(f"g must have shape [B, T, H] = {(B, T, H)}, got {tuple(g.shape)}")
    checks.gate(g, B, T, H, K)
    checks.tensor("level_scales", level_scales, 4)
    L = level_scales.shape[3]
    if tuple(level_scales.shape[:3]) != (B, T, H) or L < 1:
        raise ValueError(f"level_scales must have shape [B, T, H, L] with B, T, H = {(B, T, H)}, "
                         f"got {tuple(level_scales.shape)}")  # fmt: skip
    N = checks.seqlens(cu_seqlens, B, T)
    output_final_state = checks.flag("output_final_state", output_final_state)
    checks.scale(scale)
    if initial_state is not None:
        _check_state(initial_state, N, G, H, K, V, L)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        bounds = cu_seqlens.tolist()
        spans = [(0, bounds[n], bounds[n + 1]) for n in range(N)]
    offsets = [0] * N if initial_state is None else initial_state.offsets.tolist()
    # Each sequence: its partial chunk's tokens (from the state), then its own.
    parts = {"q": [], "k": [], "v": [], "g": [], "lam": []}
    given = {"q": q, "k": k, "v": v, "g": g, "lam": level_scales}
    prev = dict.fromkeys(parts)
    if initial_state is not None:
        prev = {"q": initial_state.q_prev, "k": initial_state.k_prev, "v": initial_state.v_prev,
                "g": initial_state.g_prev, "lam": initial_state.level_scales_prev}  # fmt: skip
    lengths, firsts = [], []
    for n, (row, bos, eos) in enumerate(spans):
        r = offsets[n] % BT
        for name, x in given.items():
            own = x[row, bos:eos]
            if r:
                own = torch.cat([prev[name][n, :r].to(own.dtype), own])
            parts[name].append(own)
        lengths.append(r + eos - bos)
        firsts.append(r)
    packed = {name: torch.cat(xs)[None] for name, xs in parts.items()}
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=q.device)
    start = None
    if initial_state is not None:
        S = initial_state.ht.new_zeros(N, initial_state.ht.shape[1] + INTRA, H, K, V)
        S[:, INTRA:] = initial_state.ht
        p = torch.tensor([o - o % BT for o in offsets], dtype=torch.int64, device=q.device)
        start = LogLinearState(S.double() if v.dtype == torch.float64 else S, p)
    o, _ = log_linear_attention(
        packed["q"], packed["k"], packed["v"], packed["g"], packed["lam"],
        scale=scale, mode="chunk", chunk_size=BT, initial_state=start, cu_seqlens=cu,
    )  # fmt: skip
    outs = [
        o[0, a + r : b] for a, b, r in zip(cu[:-1].tolist(), cu[1:].tolist(), firsts, strict=True)
    ]
    o = torch.stack(outs) if cu_seqlens is None else torch.cat(outs)[None]
    if not output_final_state:
        return o, None
    return o, _final_state(packed, cu, start, lengths, offsets, spans, H, K, V, L, v.dtype)


def _final_state(packed, cu, start, lengths, offsets, spans, H, K, V, L, dtype):
    """fla's final state: the level states at each sequence's last chunk boundary, and the
    tokens after it."""
    N = len(lengths)
    G = packed["q"].shape[2]
    bounds = cu.tolist()
    ends = [o - o % BT + n for o, n in zip(offsets, lengths, strict=True)]  # the positions reached
    keep = [e // BT * BT - (o - o % BT) for e, o in zip(ends, offsets, strict=True)]
    head = [torch.arange(a, a + n) for a, n in zip(bounds, keep, strict=False)]
    index = torch.cat(head) if head else torch.zeros(0, dtype=torch.int64)
    cu_head = torch.tensor([0, *torch.tensor(keep).cumsum(0).tolist()], device=cu.device)
    kv = packed["k"][:, index].repeat_interleave(H // G, dim=2)
    S = log_linear_state(kv, packed["v"][:, index], packed["g"][:, index], initial_state=start,
                         cu_seqlens=cu_head).S  # fmt: skip
    given_lengths = [e - b for _, b, e in spans]
    levels = _max_level(given_lengths, offsets, True) + 2
    state_dtype = compute_dtype(dtype)
    ht = S.new_zeros(N, levels, H, K, V, dtype=state_dtype)
    m = min(levels, max(S.shape[1] - INTRA, 0))
    ht[:, :m] = S[:, INTRA : INTRA + m].to(state_dtype)
    tails = {}
    shapes = {"q": (G, K), "k": (G, K), "v": (H, V), "g": (H,), "lam": (H, L)}
    for name, shape in shapes.items():
        x = packed[name][0]
        buf = x.new_zeros(N, BT, *shape)
        for n in range(N):
            a = bounds[n] + keep[n]
            buf[n, : bounds[n + 1] - a] = x[a : bounds[n + 1]]
        tails[name] = buf
    return LogLinearAttentionState(
        ht=ht, offsets=torch.tensor([o + n for o, n in zip(offsets, given_lengths, strict=True)],
                                    dtype=torch.int32, device=cu.device),
        q_prev=tails["q"], k_prev=tails["k"], v_prev=tails["v"], g_prev=tails["g"],
        level_scales_prev=tails["lam"],
    )  # fmt: skip
