"""Bounded-memory slots: gated slot attention (GSA) and ABC, two passes of the additive rule.

Both keep m memory slots per head, a key memory S_k (K x m) and a value memory S_v (m x V), and
read them with a softmax over the slots between the two passes (Peng et al. 2022, "ABC:
Attention with Bounded-memory Control", section 3; Zhang et al. 2024, "Gated Slot Attention for
Efficient Linear-Time Sequence Modeling", section 3):

    S_k,t = S_k,t-1 Diag(alpha_t) + k_t s_t^T        (pass 1: keys written into the slots)
    p_t   = softmax(S_k,t^T (scale q_t))             (the slot scores, a softmax over m)
    S_v,t = Diag(alpha_t) S_v,t-1 + s_t v_t^T        (pass 2: values written into the slots)
    o_t   = S_v,t^T p_t

with alpha_t = exp(g_t), g_t [m] a log-decay per slot shared by both passes, s_t [m] the slot
write weights. Each pass is one call of ``linear_attention`` (spec sections 4, 5, 10) in the
chosen form, so every form, packed sequences and the gradients come from it:

- pass 2 is GLA with q = p, k = s, v = v and the per-key-channel gate g (scale 1);
- pass 1 decays the *value* dimension (the slots) of its memory: its m columns evolve
  independently, so slot j runs as a value head of its own (V = 1) with the per-head gate
  g[..., j] (linear attention's grouped value heads: H m value heads read the H q/k heads).
  The chunk form runs it with the gate factored out of each chunk instead (``slot_scores``):
  one product of a chunk's ungated scores tril(Q K^T) for all m slots, on the fused kernel
  ``csrc/slots.cpp`` (forward and backward) in float32 on the CPU, in PyTorch otherwise.

ABC (``g=None``): the slots are controlled by a cumulative softmax of s over time,

    z_t = log sum_{i <= t} exp(s_i),   s'_t = exp(s_t - z_t),   g_t = z_{t-1} - z_t  (g_1 = 0),

so that S_k,t = sum_{i <= t} k_i exp(s_i - z_t)^T is the paper's running sum normalised over
the prefix (and S_v,t = sum_{i <= t} exp(s_i - z_t) v_i^T). The sums restart at each sequence
of ``cu_seqlens`` and at each call: an initial state enters undecayed at the first token, as
fla 0.6.0's ``chunk_gsa`` / ``chunk_abc`` kernels do. ``slot_step`` and ``abc_step`` are the
decoding steps (``abc_step`` carries z, so that decoding continues the prompt's normaliser).

Accuracy (tests/ops/test_slots.py): every form agrees with the float64 references
(``linattn.reference.gsa`` / ``.abc``) to about 2e-15 in float64; in float32 the outputs are
within about 1.5e-7 relative RMS of them (T = 64 and 1000, K = V = m = 16), the final states
within 1e-6.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import _native, logsumexp_gate
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops.linear_attention import linear_attention
from linattn.ops.step import recurrent_step

SlotState = tuple[Tensor | None, Tensor | None]


def _check(q, k, v, s, g, mode, chunk_size, scale, output_final_state, cu_seqlens, state):
    """The checks of ``gated_slot_attention``, before any work; returns (N, chunk_size, flag)."""
    B, T, H, K, V = _checks.qkv(q, k, v)
    _checks.tensor("s", s, 4)
    if tuple(s.shape[:3]) != (B, T, H) or s.shape[3] < 1:
        raise ValueError(
            f"s must have shape [B, T, H, M] with B, T, H = {(B, T, H)} and M >= 1 slots, got "
            f"{tuple(s.shape)}"
        )
    if s.dtype != q.dtype:
        raise TypeError(f"s must have the dtype of q, k, v ({q.dtype}), got {s.dtype}")
    M = s.shape[3]
    if g is not None:
        ndim = g.dim() if isinstance(g, Tensor) else 4
        if ndim != 4 or tuple(g.shape) != (B, T, H, M):
            shape = tuple(g.shape) if isinstance(g, Tensor) else type(g).__name__
            raise ValueError(
                f"g must be None or have shape [B, T, H, M] = {(B, T, H, M)}, got {shape}"
            )
        _checks.gate(g, B, T, H, M, channel_only=True)
    chunk_size = _checks.options(mode, chunk_size)
    _checks.scale(scale)
    output_final_state = _checks.flag("output_final_state", output_final_state)
    N = _checks.seqlens(cu_seqlens, B, T)
    check_state(state, N, H, K, M, V)
    return N, chunk_size, output_final_state


def check_state(state: object, N: int, H: int, K: int, M: int, V: int) -> None:
    """initial_state: None or a pair (S_k [N, H, K, M] or None, S_v [N, H, M, V] or None)."""
    if state is None:
        return
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(
            "initial_state must be None or a pair (S_k [N, H, K, M], S_v [N, H, M, V]), got "
            f"{type(state).__name__}"
            + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
        )
    for name, S, shape in (("S_k", state[0], (N, H, K, M)), ("S_v", state[1], (N, H, M, V))):
        if S is None:
            continue
        _checks.tensor(f"initial_state's {name}", S, 4)
        if tuple(S.shape) != shape:
            layout = "[N, H, K, M]" if name == "S_k" else "[N, H, M, V]"
            raise ValueError(
                f"initial_state's {name} must have shape {layout} = {shape} (N = batch size or "
                f"number of sequences in cu_seqlens), got {tuple(S.shape)}"
            )


def additive_gate(s: Tensor, cu_seqlens: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """ABC's slot control from the slot logits s [B, T, H, M]: (exp(s_t - z_t), z_{t-1} - z_t).

    z_t = log sum_{i <= t} exp(s_i) over each sequence (of ``cu_seqlens``), and the log-decay of
    each sequence's first token is 0. Returned in s's compute dtype (float32 for half inputs):
    in float32 on the CPU with the fused kernels, by the running log-sum-exp of
    ``linattn.ops.logsumexp_gate`` (LightNet's gate: each step in float32 from z carried in
    float64, its backward fused too); otherwise summed in float64 by PyTorch.
    """
    dtype = compute_dtype(s.dtype)
    if cu_seqlens is None:
        pieces = [s]
    else:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        pieces = list(s.split(lengths, dim=1))
    if dtype == torch.float32 and logsumexp_gate.fused(s.to(dtype)[:0]):
        found = [_Control.apply(x) if x.shape[1] else (x, x) for x in (p.to(dtype) for p in pieces)]
        if len(found) == 1:
            return found[0]
        return torch.cat([w for w, _ in found], dim=1), torch.cat([g for _, g in found], dim=1)
    weights, gates = [], []
    for piece in pieces:
        x = piece.double()
        if x.shape[1] == 0:
            weights.append(x.to(dtype))
            gates.append(x.to(dtype))
            continue
        # z_t = top + log c_t, c_t = sum_{i <= t} exp(s_i - top), top the sequence's largest s
        # (per slot): each term <= 1 and c_t >= exp(s_1 - top), normal in float64 wherever the
        # logits span less than ``_LOGIT_SPAN``; else the running log-sum-exp of PyTorch.
        top = x.detach().amax(dim=1, keepdim=True)
        if float((top - x.detach().amin(dim=1, keepdim=True)).max()) < _LOGIT_SPAN:
            log_c = torch.log(torch.cumsum(torch.exp(x - top), dim=1))
            z = top + log_c
        else:
            z = torch.logcumsumexp(x, dim=1)
            log_c = z
        before = torch.cat([log_c[:, :1], log_c[:, :-1]], dim=1)  # z_{t-1}, and z_1 first
        weights.append(torch.exp(x - z).to(dtype))
        gates.append((before - log_c).to(dtype))
    return torch.cat(weights, dim=1), torch.cat(gates, dim=1)


_LOGIT_SPAN = 600.0  # exp(-600) is a normal float64: the fast running sum of ``additive_gate``


class _Control(torch.autograd.Function):
    """``additive_gate`` of one sequence (or a batch of equal ones), s [B, T, H, M] float32 with
    T >= 1, on the fused running log-sum-exp (``csrc/logsumexp.cpp``: no prior mass, so the
    first token's log-decay is the constant 0): (weights, log-decays), and its fused backward."""

    @staticmethod
    def forward(ctx, s: Tensor) -> tuple[Tensor, Tensor]:
        B, T, H, M = s.shape
        weights, g, _ = logsumexp_gate.forward(s.reshape(B, T, H * M).contiguous(), None)
        ctx.save_for_backward(weights, g)
        ctx.shape = (B, T, H, M)
        return weights.view(B, T, H, M), g.view(B, T, H, M)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_weights: Tensor | None, d_g: Tensor | None) -> Tensor:
        weights, g = ctx.saved_tensors
        B, T, D = weights.shape
        rows = [None if d is None else d.reshape(B, T, D) for d in (d_weights, d_g)]
        no_mass = torch.ones(B, D, dtype=torch.bool)  # g_0 the constant 0: no gradient
        ds, _ = logsumexp_gate.backward(weights, g, *rows, None, no_mass)
        return ds.view(ctx.shape)


def gated_slot_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: SlotState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """Gated slot attention (Zhang et al. 2024, section 3; ABC with ``g=None``), any form.

        S_k,t = S_k,t-1 Diag(exp g_t) + k_t s_t^T,   p_t = softmax(S_k,t^T (scale q_t))
        S_v,t = Diag(exp g_t) S_v,t-1 + s_t v_t^T,   o_t = S_v,t^T p_t

    (the module docstring; ``g=None`` is ABC's cumulative-softmax control of the slots).

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; s: [B, T, H, M] the slot write weights (with g
            None: the slot logits); one floating dtype.
        g: None or [B, T, H, M], a log-decay per slot (every entry <= 0, -inf a reset).
        scale: multiplies q in pass 1; None means 1 / sqrt(K). Pass 2 has scale 1.
        mode, chunk_size: linear attention's form ("parallel", "recurrent", "chunk").
        initial_state: None or (S_k [N, H, K, M], S_v [N, H, M, V]) (either may be None: zeros).
        output_final_state: return (S_k, S_v) after the last token (else None).
        cu_seqlens: None or cumulative sequence lengths [N + 1] (B = 1): independent sequences.

    Returns:
        o [B, T, H, V] in the input dtype; the final (S_k, S_v) in float32 (float64 for float64
        inputs), or None.
    """
    N, chunk_size, output_final_state = _check(
        q, k, v, s, g, mode, chunk_size, scale, output_final_state, cu_seqlens, initial_state
    )
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("gated_slot_attention", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, q.dtype)
    dtype = q.dtype
    B, T, H, K = q.shape
    M = s.shape[3]
    if g is None:  # the control's log-decays stay in the compute dtype (float32 for half)
        s, g = additive_gate(s, cu_seqlens)
        s = s.to(dtype)
    Sk0, Sv0 = (None, None) if initial_state is None else initial_state
    common = dict(mode=mode, chunk_size=chunk_size, output_final_state=output_final_state,
                  cu_seqlens=cu_seqlens)  # fmt: skip
    scale = K**-0.5 if scale is None else float(scale)
    found = None
    if mode == "chunk":
        found = slot_scores(q, k, s, g, scale, chunk_size, Sk0, cu_seqlens)
    if found is not None:
        scores, Sk = found
    else:  # slot j as value head h M + j: S_k [N, H, K, M] -> [N, H M, K, 1]
        S0 = None if Sk0 is None else Sk0.transpose(-1, -2).reshape(N, H * M, K, 1)
        scores, Sk = linear_attention(
            q, k, s.reshape(B, T, H * M, 1), g.reshape(B, T, H * M), scale=scale,
            initial_state=S0, **common,
        )  # fmt: skip
        scores = scores.reshape(B, T, H, M)
        if Sk is not None:
            Sk = Sk.reshape(N, H, M, K).transpose(-1, -2).contiguous()
    p = torch.softmax(scores.to(compute_dtype(dtype)), dim=-1).to(dtype)
    o, Sv = linear_attention(p, s, v, g, scale=1.0, initial_state=Sv0, **common)
    if not output_final_state:
        return o, None
    return o, (Sk, Sv)


# The largest decay a chunk of pass 1's factored form may span: exp(-G) grows to exp(LIMIT) and
# exp(G) shrinks to exp(-LIMIT), both far inside the compute dtype's range.
_FACTOR_LIMIT = {torch.float32: 60.0, torch.float64: 600.0}


def slot_scores(
    q: Tensor,
    k: Tensor,
    s: Tensor,
    g: Tensor,
    scale: float,
    chunk_size: int,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
) -> tuple[Tensor, Tensor] | None:
    """Pass 1's chunk form, the gate on the slots (the value side of S_k) factored out of each
    chunk: with G the cumulative log-gates of a chunk (summed in float64) and S_k entering it,

        scores_t = exp(G_t) * ((scale q_t)^T S_k + sum_{i <= t} (scale q_t . k_i) exp(-G_i) s_i)
        S_k <- S_k Diag(exp G_C) + sum_i k_i (exp(G_C - G_i) s_i)^T

    one product of every chunk's scores tril(Q K^T) by its slot writes, and a loop over the
    chunks that carries S_k alone (one scaled add a chunk). q, k [B, T, H, K], s, g [B, T, H, M];
    returns (scores [B, T, H, M], S_k [N, H, K, M]) in the compute dtype, or None where a chunk's
    decay spans more than ``_FACTOR_LIMIT`` (exp(-G) would leave the dtype's range: the caller
    then runs slot by slot) or the dtype is not float32 or float64. In float32 on the CPU with
    the fused kernels loaded it runs ``csrc/slots.cpp`` instead, which never returns None: there
    a slot whose decay over a chunk passes its limit is summed pair by pair in that chunk.
    """
    dtype = compute_dtype(q.dtype)
    if dtype == torch.float32 and _native.applies(q.new_empty(0, dtype=dtype)):
        return _fused_scores(q, k, s, g, scale, chunk_size, initial_state, cu_seqlens)
    limit = _FACTOR_LIMIT.get(dtype)
    B, T, H, K = q.shape
    M = s.shape[-1]
    bounds = [0, T] if cu_seqlens is None else cu_seqlens.tolist()
    N = len(bounds) - 1
    C = max(1, min(chunk_size, T))
    if limit is None or T == 0:
        return None
    # [B, T, H, D] -> [B, H, T, D]; the gates' sums in float64 (their differences keep float64's
    # accuracy however long the chunk), each exponential rounded once to the compute dtype
    qh, kh, sh = (x.to(dtype).transpose(1, 2) for x in (q * scale, k, s))
    gh = g.transpose(1, 2).double()
    pieces = [(qh, kh, sh, gh)] if cu_seqlens is None else [
        tuple(x[:, :, a:e] for x in (qh, kh, sh, gh)) for a, e in itertools.pairwise(bounds)
    ]  # fmt: skip
    if initial_state is None:
        Sk0 = q.new_zeros((N if cu_seqlens is not None else B, H, K, M), dtype=dtype)
    else:
        Sk0 = initial_state.to(dtype)
    outs, finals = [], []
    for i, (qi, ki, si, gi) in enumerate(pieces):
        S = Sk0 if cu_seqlens is None else Sk0[i : i + 1]
        found = _slot_scores(qi, ki, si, gi, S, C, limit, dtype)
        if found is None:
            return None
        outs.append(found[0])
        finals.append(found[1])
    scores = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return scores.transpose(1, 2), torch.cat(finals) if len(finals) > 1 else finals[0]


def _fused_scores(q, k, s, g, scale, chunk_size, initial_state, cu_seqlens):
    """``slot_scores`` on the fused kernels (``csrc/slots.cpp``: the same factored chunks, a
    steep slot of a chunk summed pair by pair there), float32 on the CPU."""
    B, T, H, K = q.shape
    M = s.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    q, k, s, g = (x.to(torch.float32).contiguous() for x in (q, k, s, g))
    if initial_state is None:
        S0 = q.new_zeros(N, H, K, M)
    else:
        S0 = initial_state.to(torch.float32).contiguous()
    cu = None if cu_seqlens is None else cu_seqlens.to(torch.int64)
    return _FusedScores.apply(q, k, s, g, S0, float(scale), max(1, int(chunk_size)), cu)


class _FusedScores(torch.autograd.Function):
    """Pass 1's chunk form on ``linattn_native.slot_scores_forward`` / ``_backward``: (scores
    [B, T, H, M], S_k [N, H, K, M]) from contiguous float32 q, k [B, T, H, K], s, g [B, T, H, M]
    and S0 [N, H, K, M]; the backward recomputes each chunk from the state entering it and
    reads the scores the forward kept."""

    @staticmethod
    def forward(ctx, q, k, s, g, S0, scale, C, cu):
        keep = any(ctx.needs_input_grad[:5])
        scores, S, states = _native.kernel("slot_scores_forward")(q, k, s, g, S0, cu, scale, C,
                                                                   keep)  # fmt: skip
        ctx.save_for_backward(q, k, s, g, states, scores)
        ctx.setup = (scale, C, cu)
        return scores, S

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_scores, d_S):
        q, k, s, g, states, scores = ctx.saved_tensors
        scale, C, cu = ctx.setup
        B, T, H, K = q.shape
        N = B if cu is None else cu.numel() - 1
        d_scores = torch.zeros_like(s) if d_scores is None else d_scores.contiguous()
        d_S = s.new_zeros(N, H, K, s.shape[-1]) if d_S is None else d_S.contiguous()
        dq, dk, ds, dg, dS0 = _native.kernel("slot_scores_backward")(
            q, k, s, g, states, cu, scores, d_scores, d_S, scale, C
        )
        return dq, dk, ds, dg, dS0, None, None, None


def _slot_scores(q, k, s, g, S, C: int, limit: float, dtype):
    """``slot_scores`` of one sequence (or a batch of equal ones), [B, H, T, .] (g float64)."""
    B, H, T, K = q.shape
    M = s.shape[-1]
    if T == 0:
        return q.new_zeros(B, H, 0, M), S
    n = -(-T // C)
    pad = n * C - T
    if pad:  # tokens that change nothing: no key, no write, no decay
        q, k, s, g = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, s, g))
    q, k, s, g = (x.unflatten(2, (n, C)) for x in (q, k, s, g))  # [B, H, n, C, .]
    G = g.clamp(min=-limit).cumsum(3)  # a reset (-inf) reaches the limit: refused below
    if bool((G[..., -1, :] <= -limit).any()):
        return None
    eG64 = torch.exp(G)  # float64: every factor from the exact sums, rounded once
    eG, e_G = eG64.to(dtype), torch.reciprocal(eG64).to(dtype)
    D = eG[..., -1, :]  # [B, H, n, M]: the chunk's decay of the slots
    kT = k.transpose(-1, -2)
    writes = kT @ (D.unsqueeze(-2) * e_G * s)  # [B, H, n, K, M]: k_i (exp(G_C - G_i) s_i)^T
    states = []
    for write, decay in zip(writes.unbind(2), D.unsqueeze(-2).unbind(2), strict=True):
        states.append(S)
        S = torch.addcmul(write, S, decay)
    S_all = torch.stack(states, 2)  # [B, H, n, K, M]: the state entering each chunk
    P = (q @ kT).tril_()  # [B, H, n, C, C]
    scores = eG * torch.baddbmm(
        (q @ S_all).flatten(0, 2), P.flatten(0, 2), (e_G * s).flatten(0, 2)
    ).view(B, H, n, C, M)
    return scores.flatten(2, 3)[:, :, :T], S


def abc_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s: Tensor,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: SlotState | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
    """ABC (Peng et al. 2022, section 3): attention over m bounded-memory slots.

        phi_i = exp(s_i - z_t) for i <= t, z_t = log sum_{i <= t} exp(s_i)
        K~_t = sum_{i <= t} k_i phi_i^T,   V~_t = sum_{i <= t} phi_i v_i^T
        o_t = V~_t^T softmax(K~_t^T (scale q_t))

    computed as ``gated_slot_attention`` with ``g=None`` (the running sums as a recurrence with
    the per-slot log-decay z_{t-1} - z_t); an initial state enters undecayed at the first token
    and is then decayed by exp(z_1 - z_t), as fla 0.6.0's ``chunk_abc`` kernel. Arguments and
    returns as ``gated_slot_attention``'s, s [B, T, H, M] the slot logits.
    """
    if _backends.wanted(q):  # checked by gated_slot_attention's checks first
        _check(q, k, v, s, None, mode, chunk_size, scale, output_final_state, cu_seqlens,
               initial_state)  # fmt: skip
        chosen = _backends.choose("abc_attention", q, None, locals())
        if chosen is not None:
            return _backends.run(chosen, q.dtype)
    return gated_slot_attention(
        q, k, v, s, None, scale=scale, mode=mode, chunk_size=chunk_size,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )  # fmt: skip


def slot_step(
    state: tuple[Tensor, Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s: Tensor,
    g: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    """One token of gated slot attention (the module docstring), the state updated in place.

        S_k <- S_k Diag(exp g_t) + k_t s_t^T,  p_t = softmax(S_k^T (scale q_t)),
        S_v <- Diag(exp g_t) S_v + s_t v_t^T,  o_t = S_v^T p_t

    Args:
        state: (S_k [B, H, K, M], S_v [B, H, M, V]), float32 or float64, overwritten.
        q, k: [B, H, K]; v: [B, H, V]; s, g: [B, H, M] (g <= 0).
        scale: multiplies q; None means 1 / sqrt(K).

    Returns:
        o_t [B, H, V] in v's dtype. Pass 2 is ``recurrent_step`` on S_v (the additive rule with
        a gate per key channel, the slots).
    """
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError("state must be a pair (S_k [B, H, K, M], S_v [B, H, M, V])")
    Sk, Sv = state
    _checks.tensor("state's S_k", Sk, 4)
    _checks.tensor("state's S_v", Sv, 4)
    B, H, K, M = Sk.shape
    V = Sv.shape[3]
    if tuple(Sv.shape) != (B, H, M, V):
        raise ValueError(
            f"state's S_v must have shape [B, H, M, V] = {(B, H, M, V)}, got {tuple(Sv.shape)}"
        )
    for name, x, shape in (("q", q, (B, H, K)), ("k", k, (B, H, K)), ("v", v, (B, H, V)),
                           ("s", s, (B, H, M)), ("g", g, (B, H, M))):  # fmt: skip
        _checks.tensor(name, x, 3, finite=name != "g")
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (the state's), got {tuple(x.shape)}")
    _checks.gate(g, B, H, M, layout="[B, H]", channel_only=True)
    _checks.scale(scale)
    scale = K**-0.5 if scale is None else float(scale)
    alpha = torch.exp(g.to(Sk.dtype))
    s_t = s.to(Sk.dtype)
    Sk.mul_(alpha.unsqueeze(-2)).add_(k.to(Sk.dtype).unsqueeze(-1) * s_t.unsqueeze(-2))
    scores = torch.einsum("bhkm,bhk->bhm", Sk, q.to(Sk.dtype) * scale)
    p = torch.softmax(scores, dim=-1)
    return recurrent_step(Sv, p, s_t, v.to(Sv.dtype), None, g.to(Sv.dtype), scale=1.0).to(v.dtype)


def abc_step(
    state: tuple[Tensor, Tensor, Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    """One token of ABC (``abc_attention``), the state (S_k, S_v, z) updated in place.

    z [B, H, M] is the running log-normaliser log sum_{i <= t} exp(s_i) (-inf before the first
    token): z_t = logaddexp(z_{t-1}, s_t), then ``slot_step`` with the slot weights
    exp(s_t - z_t) and the log-decay z_{t-1} - z_t (0 at the first token). Steps from zeros and
    z = -inf give ``abc_attention``'s outputs on the whole sequence.
    """
    if not isinstance(state, (tuple, list)) or len(state) != 3:
        raise TypeError("state must be a triple (S_k [B, H, K, M], S_v [B, H, M, V], z [B, H, M])")
    Sk, Sv, z = state
    _checks.tensor("state's z", z, 3, finite=False)
    _checks.tensor("s", s, 3)
    if z.shape != s.shape:
        raise ValueError(
            f"state's z must have the shape of s {tuple(s.shape)}, got {tuple(z.shape)}"
        )
    s_t = s.to(z.dtype)
    z_new = torch.logaddexp(z, s_t)
    g = torch.where(torch.isneginf(z), torch.zeros_like(z), z - z_new)
    weights = torch.exp(s_t - z_new)
    o = slot_step((Sk, Sv), q, k, v, weights.to(s.dtype), g.to(s.dtype), scale=scale)
    z.copy_(z_new)
    return o
