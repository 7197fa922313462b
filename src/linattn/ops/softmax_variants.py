"""Softmax attention with a forget gate (FoX), and stick-breaking attention: two forms each.

Forgetting attention (Lin et al., 2025, "Forgetting Transformer: Softmax Attention with a Forget
Gate"; fla's ``parallel_attn`` / ``parallel_forgetting_attn``) adds to the logit of query t and
key s the log forget gates between them,

    l_ts = scale q_t^T k_s + sum_{s < i <= t} g_i = scale q_t^T k_s + G_t - G_s,
    G_t = sum_{i <= t} g_i,

over the keys s <= t (and t - s < window_size with a window), and normalises with an optional
attention sink (GPT-OSS): o_t = sum_s exp(l_ts) v_s / (sum_s exp(l_ts) + exp(sink)). g = 0 is
softmax attention (spec section 2).

Stick-breaking attention (Tan et al., 2024, "Scaling Stick-Breaking Attention"; fla's
``parallel_stickbreaking_attn``) walks back from query t: key s takes the share
beta_ts = sigmoid(z_ts), z_ts = scale q_t^T k_s, of the stick the nearer keys left,

    A_ts = beta_ts prod_{s < i < t} (1 - beta_ti)   (i <= t with attend_current),
    o_t = sum_s A_ts v_s,   rem_t = 1 - sum_s A_ts = prod_s (1 - beta_ts).

Both have no fixed memory (their "state" is the KV cache, spec section 2); each has two forms:

- ``"parallel"``: the masked T x T product (scores, mask, the row's weights, one product with V);
- ``"chunk"``: blockwise, flash-style. Query blocks of C tokens meet key blocks one diagonal
  offset at a time (offset 0, the diagonal block, first), all query blocks at once. Forgetting
  attention keeps an online softmax (running maximum m, running sum l, the unnormalised output);
  stick-breaking carries the log of the stick left, so that a farther block's weights are its own
  in-block weights times what the nearer blocks left. Memory per step is O(T C), not O(T^2).

Grouped heads (GQA): q has HQ = G H heads, k and v H heads; query head j reads key/value head
j // G (fla's convention). Packed sequences (``cu_seqlens``, B = 1) run one by one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks

FORMS = ("parallel", "chunk")


def _check_common(q, k, v, scale, cu_seqlens, mode, chunk_size) -> tuple[int, ...]:
    """q [B, T, HQ, K], k [B, T, H, K], v [B, T, H, V] (HQ a multiple of H), one dtype."""
    _checks.tensor("q", q, 4)
    _checks.tensor("k", k, 4)
    _checks.tensor("v", v, 4)
    B, T, HQ, K = q.shape
    H = k.shape[2]
    if k.shape[:2] != (B, T) or k.shape[3] != K:
        raise ValueError(
            f"k must have shape [B, T, H, K] with B, T, K = {(B, T, K)}, got {tuple(k.shape)}"
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape [B, T, H, V] with B, T, H = {tuple(k.shape[:3])}, got "
            f"{tuple(v.shape)}"
        )
    if H == 0 or HQ % H != 0:
        raise ValueError(
            f"q: the number of query heads ({HQ}) must be a multiple of the number of key/value "
            f"heads ({H})"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    _checks.head_sizes("q, k, v", K, v.shape[3])
    _checks.scale(scale)
    _checks.seqlens(cu_seqlens, B, T)
    if not isinstance(mode, str) or mode not in FORMS:
        raise ValueError(f"mode must be one of {FORMS}, got {mode!r}")
    chunk_size = _checks.integer("chunk_size", chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return B, T, HQ, H, K, v.shape[3], chunk_size


def _per_sequence(fn, cu_seqlens: Tensor | None, *xs: Tensor | None):
    """fn on each packed sequence of [1, T, ...] tensors (all of them when cu_seqlens is None),
    the results concatenated along T (T >= 1: the callers return early for T = 0)."""
    if cu_seqlens is None:
        return fn(*xs)
    bounds = cu_seqlens.tolist()
    parts = [
        fn(*(None if x is None else x[:, a:b] for x in xs))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        if b > a  # an empty sequence has no rows
    ]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(p, dim=1) for p in zip(*parts, strict=True))
    return torch.cat(parts, dim=1)


def _grouped(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[B, T, HQ, K] q, [B, T, H, *] k, v as [B, H, G, T, K] and [B, H, 1, T, *]."""
    B, T, HQ, K = q.shape
    H = k.shape[2]
    qg = q.reshape(B, T, H, HQ // H, K).permute(0, 2, 3, 1, 4)
    return qg, k.permute(0, 2, 1, 3).unsqueeze(2), v.permute(0, 2, 1, 3).unsqueeze(2)


def _ungrouped(o: Tensor) -> Tensor:
    """[B, H, G, T, V] as [B, T, H G, V]."""
    B, H, G, T, V = o.shape
    return o.permute(0, 3, 1, 2, 4).reshape(B, T, H * G, V)


# ------------------------------------------------------------------------ forgetting attention


def _visible(t: Tensor, s: Tensor, window_size: int | None, T: int) -> Tensor:
    """Key s visible from query t: s <= t, t - s < window_size, s < T (the padding)."""
    mask = (s <= t) & (s < T)
    if window_size is not None:
        mask = mask & (t - s < window_size)
    return mask


def _fox_parallel(q, k, v, g, sink, scale, window_size):
    """The masked product of one batch of equal-length sequences (module docstring)."""
    B, T, HQ, _ = q.shape
    H = k.shape[2]
    qg, kg, vg = _grouped(q, k, v)
    logits = scale * (qg @ kg.transpose(-1, -2))  # [B, H, G, T, T]
    if g is not None:
        Gc = g.cumsum(1).reshape(B, T, H, HQ // H).permute(0, 2, 3, 1)  # [B, H, G, T]
        logits = logits + (Gc[..., :, None] - Gc[..., None, :])
    pos = torch.arange(T, device=q.device)
    mask = _visible(pos[:, None], pos[None, :], window_size, T)
    logits = logits.masked_fill(~mask, float("-inf"))
    m = logits.amax(-1)  # [B, H, G, T]
    if sink is not None:
        sink = sink.reshape(1, H, HQ // H, 1)
        m = torch.maximum(m, sink)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    p = torch.exp(logits - m[..., None])
    denom = p.sum(-1)
    if sink is not None:
        denom = denom + torch.exp(sink - m)
    o = (p @ vg) / torch.where(denom > 0, denom, torch.ones_like(denom))[..., None]
    return _ungrouped(o)


def _blocks(x: Tensor, C: int, NT: int) -> Tensor:
    """[B, H, G, T, D] padded to NT C tokens, as [B, H, G, NT, C, D]."""
    pad = NT * C - x.shape[3]
    if pad:
        x = F.pad(x, (0, 0, 0, pad))
    return x.reshape(*x.shape[:3], NT, C, x.shape[-1])


def _fox_chunk(q, k, v, g, sink, scale, window_size, C):
    """Blockwise (flash-style) forgetting attention with an online softmax (module docstring)."""
    B, T, HQ, _ = q.shape
    H, V = k.shape[2], v.shape[3]
    G = HQ // H
    NT = max(1, -(-T // C))
    qg, kg, vg = _grouped(q, k, v)
    Qb, Kb, Vb = _blocks(qg, C, NT), _blocks(kg, C, NT), _blocks(vg, C, NT)
    if g is None:
        Gb = None
    else:
        Gc = g.cumsum(1).reshape(B, T, H, G).permute(0, 2, 3, 1).unsqueeze(-1)
        Gb = _blocks(Gc, C, NT)[..., 0]  # [B, H, G, NT, C]
    pos = torch.arange(NT * C, device=q.device).reshape(NT, C)
    shape = (B, H, G, NT, C)
    if sink is None:
        m = q.new_full(shape, float("-inf"))
        l_sum = q.new_zeros(shape)
    else:  # the sink is a logit with no value: it starts the running maximum and sum
        m = sink.detach().reshape(1, H, G, 1, 1).expand(shape).clone()
        l_sum = torch.exp(sink.reshape(1, H, G, 1, 1) - m)  # ones, with the sink's gradient
    acc = q.new_zeros(*shape, V)
    for d in range(NT):
        if window_size is not None and d * C - (C - 1) >= window_size:
            break  # every key of this offset is outside every query's window
        n = NT - d  # query blocks d.., key blocks ..n
        s = scale * (Qb[:, :, :, d:] @ Kb[:, :, :, :n].transpose(-1, -2))  # [B, H, G, n, C, C]
        if Gb is not None:
            s = s + (Gb[..., d:, :, None] - Gb[..., :n, None, :])
        mask = _visible(pos[d:, :, None], pos[:n, None, :], window_size, T)  # [n, C, C]
        s = s.masked_fill(~mask, float("-inf"))
        # the running maximum is a constant of the computation (the result does not depend on
        # it), so no gradient flows through it
        m_new = torch.maximum(m[..., d:, :], s.amax(-1)).detach()
        m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        # rescale what the nearer offsets summed, then add this offset's keys
        r = torch.exp(m[..., d:, :] - m_safe)
        p = torch.exp(s - m_safe[..., None])
        l_new = l_sum[..., d:, :] * r + p.sum(-1)
        acc_new = acc[..., d:, :, :] * r[..., None] + p @ Vb[:, :, :, :n]
        m = torch.cat([m[..., :d, :], m_new], dim=-2)
        l_sum = torch.cat([l_sum[..., :d, :], l_new], dim=-2)
        acc = torch.cat([acc[..., :d, :, :], acc_new], dim=-3)
    o = acc / torch.where(l_sum > 0, l_sum, torch.ones_like(l_sum))[..., None]
    o = o.reshape(B, H, G, NT * C, V)[..., :T, :]
    return _ungrouped(o)


def forgetting_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    window_size: int | None = None,
    sink_bias: Tensor | None = None,
    cu_seqlens: Tensor | None = None,
    mode: str = "parallel",
    chunk_size: int = 64,
) -> Tensor:
    """Forgetting attention (FoX, Lin et al. 2025; the module docstring):

        o_t = sum_{s in W(t)} exp(l_ts) v_s / (sum_{s in W(t)} exp(l_ts) + exp(sink)),
        l_ts = scale q_t^T k_s + sum_{s < i <= t} g_i,   W(t) = {s <= t, t - s < window_size}.

    Causal softmax attention (spec section 2) with the forget gates' log-decays between query and
    key added to the logit; g = None (or 0) is softmax attention, sink_bias None no sink.

    Args:
        q: [B, T, HQ, K]; k: [B, T, H, K]; v: [B, T, H, V] (HQ a multiple of H; query head j
            reads key/value head j // (HQ / H)); one floating dtype.
        g: [B, T, HQ] log forget gates (log f_t, any finite value), or None.
        scale: None means 1 / sqrt(K).
        window_size: None (every earlier key) or an int >= 1: keys t - window_size < s <= t.
        sink_bias: [HQ] attention-sink logits (one per query head), or None.
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1).
        mode: "parallel" (the masked T x T product) or "chunk" (blockwise, online softmax).
        chunk_size: the block size of the chunk form.

    Returns:
        o: [B, T, HQ, V] in the input dtype (computed in float32, float64 for float64).
    """
    B, T, HQ, H, K, V, C = _check_common(q, k, v, scale, cu_seqlens, mode, chunk_size)
    if g is not None:
        _checks.tensor("g", g, 3)
        if tuple(g.shape) != (B, T, HQ):
            raise ValueError(f"g must have shape [B, T, HQ] = {(B, T, HQ)}, got {tuple(g.shape)}")
    if sink_bias is not None:
        _checks.tensor("sink_bias", sink_bias, 1)
        if tuple(sink_bias.shape) != (HQ,):
            raise ValueError(
                f"sink_bias must have shape [HQ] = {(HQ,)}, got {tuple(sink_bias.shape)}"
            )
    if window_size is not None:
        window_size = _checks.integer("window_size", window_size)
        if window_size < 1:
            raise ValueError(f"window_size must be None or >= 1, got {window_size}")
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("forgetting_attention", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    dtype = compute_dtype(q.dtype)
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    gc = None if g is None else g.to(dtype)
    sink = None if sink_bias is None else sink_bias.to(dtype)
    if T == 0 or B == 0:  # nothing to attend: an empty output on the graph (zero gradients)
        zero = sum(x.sum() for x in (qc, kc, vc) + (() if gc is None else (gc,))) * 0
        return (q.new_zeros(B, T, HQ, V, dtype=dtype) + zero).to(v.dtype)

    def one(qs, ks, vs, gs):
        if mode == "parallel":
            return _fox_parallel(qs, ks, vs, gs, sink, scale, window_size)
        return _fox_chunk(qs, ks, vs, gs, sink, scale, window_size, C)

    return _per_sequence(one, cu_seqlens, qc, kc, vc, gc).to(v.dtype)


# ---------------------------------------------------------------------- stick-breaking attention


def _sb_parallel(q, k, v, scale, attend_current):
    """The masked product of one batch of equal-length sequences, in log space."""
    T = q.shape[1]
    qg, kg, vg = _grouped(q, k, v)
    z = scale * (qg @ kg.transpose(-1, -2))  # [B, H, G, T, T]
    pos = torch.arange(T, device=q.device)
    mask = pos[None, :] <= pos[:, None] if attend_current else pos[None, :] < pos[:, None]
    log_keep = F.logsigmoid(-z).masked_fill(~mask, 0.0)  # log(1 - beta), 0 off the mask
    # sum over the visible keys after s: the reverse cumulative sum less s's own term
    after = log_keep.flip(-1).cumsum(-1).flip(-1) - log_keep
    A = torch.exp(F.logsigmoid(z) + after).masked_fill(~mask, 0.0)
    rem = torch.exp(log_keep.sum(-1))  # [B, H, G, T]
    B, H, G = rem.shape[:3]
    return _ungrouped(A @ vg), rem.permute(0, 3, 1, 2).reshape(B, T, H * G)


def _sb_chunk(q, k, v, scale, attend_current, C):
    """Blockwise stick-breaking: offsets from the diagonal block outwards, the log of the stick
    left carried from each nearer block to the next."""
    B, T, HQ, _ = q.shape
    H, V = k.shape[2], v.shape[3]
    G = HQ // H
    NT = max(1, -(-T // C))
    qg, kg, vg = _grouped(q, k, v)
    Qb, Kb, Vb = _blocks(qg, C, NT), _blocks(kg, C, NT), _blocks(vg, C, NT)
    pos = torch.arange(NT * C, device=q.device).reshape(NT, C)
    log_rem = q.new_zeros(B, H, G, NT, C)
    acc = q.new_zeros(B, H, G, NT, C, V)
    for d in range(NT):
        n = NT - d
        z = scale * (Qb[:, :, :, d:] @ Kb[:, :, :, :n].transpose(-1, -2))  # [B, H, G, n, C, C]
        t, s = pos[d:, :, None], pos[:n, None, :]
        mask = ((s <= t) if attend_current else (s < t)) & (s < T)
        log_keep = F.logsigmoid(-z).masked_fill(~mask, 0.0)
        after = log_keep.flip(-1).cumsum(-1).flip(-1) - log_keep
        w = torch.exp(F.logsigmoid(z) + after + log_rem[..., d:, :, None])
        w = w.masked_fill(~mask, 0.0)
        acc = torch.cat([acc[..., :d, :, :], acc[..., d:, :, :] + w @ Vb[:, :, :, :n]], dim=-3)
        log_rem = torch.cat([log_rem[..., :d, :], log_rem[..., d:, :] + log_keep.sum(-1)], -2)
    o = acc.reshape(B, H, G, NT * C, V)[..., :T, :]
    rem = torch.exp(log_rem).reshape(B, H, G, NT * C)[..., :T]
    return _ungrouped(o), rem.permute(0, 3, 1, 2).reshape(B, T, HQ)


def stickbreaking_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
    attend_current: bool = False,
    cu_seqlens: Tensor | None = None,
    mode: str = "parallel",
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Stick-breaking attention (Tan et al., 2024; the module docstring):

        beta_ts = sigmoid(scale q_t^T k_s),
        A_ts = beta_ts prod_{s < i < t} (1 - beta_ti)    (s < i <= t, s <= t with attend_current),
        o_t = sum_{s < t} A_ts v_s,   rem_t = prod_{s < t} (1 - beta_ts) = 1 - sum_s A_ts.

    The nearest key breaks the stick first; the weights are not normalised (rem_t is the stick
    left unused). Without ``attend_current`` the first query sees no key: o_0 = 0, rem_0 = 1.

    Args:
        q: [B, T, HQ, K]; k: [B, T, H, K]; v: [B, T, H, V] (HQ a multiple of H); one dtype.
        scale: None means 1 / sqrt(K).
        attend_current: whether query t also sees key t.
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1).
        mode: "parallel" (the masked T x T product) or "chunk" (blockwise, the stick carried).
        chunk_size: the block size of the chunk form.

    Returns:
        (o [B, T, HQ, V] in the input dtype, rem [B, T, HQ] in the input dtype).
    """
    B, T, HQ, H, K, V, C = _check_common(q, k, v, scale, cu_seqlens, mode, chunk_size)
    attend_current = _checks.flag("attend_current", attend_current)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("stickbreaking_attention", q, None, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    if T == 0 or B == 0:
        return q.new_zeros(B, T, HQ, V, dtype=v.dtype), q.new_ones(B, T, HQ)
    dtype = compute_dtype(q.dtype)

    def one(qs, ks, vs):
        if mode == "parallel":
            return _sb_parallel(qs, ks, vs, scale, attend_current)
        return _sb_chunk(qs, ks, vs, scale, attend_current, C)

    o, rem = _per_sequence(one, cu_seqlens, q.to(dtype), k.to(dtype), v.to(dtype))
    return o.to(v.dtype), rem.to(q.dtype)


# ------------------------------------------------------------------------------------ Parallax


def _parallax_one(q, r, k, v, scale, window_size):
    """The masked product of one batch of equal-length sequences."""
    T = q.shape[1]
    qg, kg, vg = _grouped(q, k, v)
    rg = _grouped(r, k, v)[0]
    s1 = scale * (qg @ kg.transpose(-1, -2))  # [B, H, G, T, T]
    s2 = rg @ kg.transpose(-1, -2)
    pos = torch.arange(T, device=q.device)
    mask = _visible(pos[:, None], pos[None, :], window_size, T)
    P = torch.softmax(s1.masked_fill(~mask, float("-inf")), dim=-1)
    c = (P * s2).sum(-1, keepdim=True)  # [B, H, G, T, 1]
    return _ungrouped((P * (1.0 + c - s2)) @ vg)


def parallax_attention(
    q: Tensor,
    r: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
    window_size: int | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Parallax attention (fla's ``parallel_parallax``; "parameterized local linear attention"):
    softmax attention with a first-order correction from a second query r,

        P_ts = softmax_s(scale q_t^T k_s),   c_t = sum_s P_ts (r_t^T k_s),
        o_t = sum_s P_ts (1 + c_t - r_t^T k_s) v_s,

    over the keys t - window_size < s <= t (r^T k is not scaled). The masked T x T product.

    Args:
        q, r: [B, T, HQ, K]; k: [B, T, H, K]; v: [B, T, H, V] (HQ a multiple of H); one dtype.
        scale: None means 1 / sqrt(K). window_size: None or an int >= 1.
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1).

    Returns:
        o: [B, T, HQ, V] in the input dtype (computed in float32, float64 for float64).
    """
    B, T, HQ, H, K, V, _ = _check_common(q, k, v, scale, cu_seqlens, "parallel", 1)
    _checks.tensor("r", r, 4)
    if r.shape != q.shape or r.dtype != q.dtype:
        raise ValueError(
            f"r must have q's shape {tuple(q.shape)} and dtype {q.dtype}, got {tuple(r.shape)} "
            f"{r.dtype}"
        )
    if window_size is not None:
        window_size = _checks.integer("window_size", window_size)
        if window_size < 1:
            raise ValueError(f"window_size must be None or >= 1, got {window_size}")
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("parallax_attention", q, None, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    if T == 0 or B == 0:
        return q.new_zeros(B, T, HQ, V)
    dtype = compute_dtype(q.dtype)
    o = _per_sequence(
        lambda qs, rs, ks, vs: _parallax_one(qs, rs, ks, vs, scale, window_size),
        cu_seqlens, *(x.to(dtype) for x in (q, r, k, v)),
    )  # fmt: skip
    return o.to(v.dtype)


# ---------------------------------------------------------------------------------- Wall attention


def _wall_one(q, k, v, g, gs, sink, scale, window_size):
    """The masked product of one batch of equal-length sequences: the T x T x K decays."""
    B, T, HQ, K = q.shape
    H = k.shape[2]
    G = HQ // H
    kq, vq = k.repeat_interleave(G, dim=2), v.repeat_interleave(G, dim=2)  # [B, T, HQ, *]
    Gc = g.cumsum(1)  # [B, T, HQ, K]
    pos = torch.arange(T, device=q.device)
    mask = _visible(pos[:, None], pos[None, :], window_size, T)  # [T, T]
    # exp(G_t - G_s) on the visible pairs only (the exponent is <= 0 there for gates <= 0)
    diff = (Gc[:, :, None] - Gc[:, None, :]).masked_fill(~mask[None, :, :, None, None], 0.0)
    logits = scale * torch.einsum("bthk,bshk,btshk->bhts", q, kq, torch.exp(diff))
    if gs is not None:
        Gs = gs.cumsum(1).transpose(1, 2)  # [B, HQ, T]
        logits = logits + (Gs[..., :, None] - Gs[..., None, :])
    logits = logits.masked_fill(~mask, float("-inf"))
    m = logits.amax(-1)
    if sink is not None:
        m = torch.maximum(m, sink.reshape(1, HQ, 1))
    m = m.detach()
    p = torch.exp(logits - m[..., None])
    denom = p.sum(-1)
    if sink is not None:
        denom = denom + torch.exp(sink.reshape(1, HQ, 1) - m)
    o = (p / denom[..., None]) @ vq.transpose(1, 2)  # [B, HQ, T, V]
    return o.transpose(1, 2)


def wall_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    g_scalar: Tensor | None = None,
    sink_bias: Tensor | None = None,
    scale: float | None = None,
    window_size: int | None = None,
    cu_seqlens: Tensor | None = None,
) -> Tensor:
    """Wall attention (fla's ``parallel_wall_attn``): softmax attention whose logits decay each
    key channel between key and query, plus an optional FoX scalar gate and a sink,

        l_ts = scale sum_n q_tn k_sn exp(G_tn - G_sn) + (g^s cumulative)_t - (g^s cumulative)_s,
        o_t = sum_s exp(l_ts) v_s / (sum_s exp(l_ts) + exp(sink)),

    G the cumulative sum of the per-channel log-decays g in each sequence, over the keys
    t - window_size < s <= t. The masked product (a T x T x K tensor of decays).

    Args:
        q: [B, T, HQ, K]; k: [B, T, H, K]; v: [B, T, H, V]; g: [B, T, HQ, K] log-decays;
            g_scalar: [B, T, HQ] or None; sink_bias: [HQ] or None; one floating dtype.
        scale: None means 1 / sqrt(K). window_size: None or an int >= 1.
        cu_seqlens: cumulative lengths [N + 1] of packed sequences (B = 1).

    Returns:
        o: [B, T, HQ, V] in the input dtype (computed in float32, float64 for float64).
    """
    B, T, HQ, H, K, V, _ = _check_common(q, k, v, scale, cu_seqlens, "parallel", 1)
    _checks.tensor("g", g, 4)
    if tuple(g.shape) != (B, T, HQ, K):
        raise ValueError(f"g must have shape [B, T, HQ, K] = {(B, T, HQ, K)}, got {tuple(g.shape)}")
    if g_scalar is not None:
        _checks.tensor("g_scalar", g_scalar, 3)
        if tuple(g_scalar.shape) != (B, T, HQ):
            raise ValueError(
                f"g_scalar must have shape [B, T, HQ] = {(B, T, HQ)}, got {tuple(g_scalar.shape)}"
            )
    if sink_bias is not None:
        _checks.tensor("sink_bias", sink_bias, 1)
        if tuple(sink_bias.shape) != (HQ,):
            raise ValueError(
                f"sink_bias must have shape [HQ] = {(HQ,)}, got {tuple(sink_bias.shape)}"
            )
    if window_size is not None:
        window_size = _checks.integer("window_size", window_size)
        if window_size < 1:
            raise ValueError(f"window_size must be None or >= 1, got {window_size}")
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("wall_attention", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    if T == 0 or B == 0:
        return q.new_zeros(B, T, HQ, V)
    dtype = compute_dtype(q.dtype)
    sink = None if sink_bias is None else sink_bias.to(dtype)
    gs = None if g_scalar is None else g_scalar.to(dtype)
    o = _per_sequence(
        lambda qs, ks, vs, gg, gss: _wall_one(qs, ks, vs, gg, gss, sink, scale, window_size),
        cu_seqlens, *(x.to(dtype) for x in (q, k, v, g)), gs,
    )  # fmt: skip
    return o.to(v.dtype)
