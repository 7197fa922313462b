"""The gated Oja rule (fla 0.6.0's ``fla.ops.gated_oja_rule``): Oja's Hebbian rule with a
per-value-channel decay, on one memory S [K, V]:

    S' = S_{t-1} Diag(exp gv_t)                       (the decay acts on the value channels)
    u_t = beta_t (k_t - S' v_t)                         (the key's error, read along v)
    S_t = S' + u_t v_t^T = S' (I - beta_t v_t v_t^T) + beta_t k_t v_t^T,   o_t = S_t^T (scale q_t)

(Oja 1982: the weight update dW = eta y (x - y W) with y the output; here the value v_t plays
the output and k_t the input.) The transition multiplies S from the right (the value side), where
every rule of ``linattn.ops.rules`` multiplies it from the left (the key side, with a gate per key
channel), so the rule interface cannot state it without a second orientation of gate, transition
and read; this module has its own forms instead. In the transposed memory X = S^T [V, K] it is
the delta rule with a per-channel gate (KDA's) with keys v and values k,

    X_t = (I - beta_t v_t v_t^T) Diag(exp gv_t) X_{t-1} + beta_t v_t k_t^T,   o_t = X_t q_t,

read along the other side (o_t = X_t q_t, not X_t^T q_t). The chunk form is that rule's WY form
(spec section 8) with this read: with G_t the cumulative log-gates of a chunk and X_0 its entering
state, the chunk's errors solve one unit-lower-triangular system

    u_t + beta_t sum_{s < t} (v_t . (exp(G_t - G_s) * v_s)) u_s
        = beta_t (k_t - X_0^T (exp(G_t) * v_t)),

and o_t = exp(G_t) * (X_0 q_t) + sum_{s <= t} (u_s . q_t) exp(G_t - G_s) * v_s, every exponent
<= 0. Packed sequences, initial and final states ([N, HV, K, V], fla's layout), grouped value
heads and gradients (autograd) in every form; ``gated_oja_rule_step`` is the decoding step.

On float32 CPU tensors with the compiled kernels loaded (``linattn.ops._native``; eager, not
under a trace) the chunk form runs fused in C++ (``csrc/oja.cpp``: the factored form below, chunk
by chunk, forward and a hand-written backward from the state entering every chunk). A call with
a chunk whose decay spans the factored form's limit runs the PyTorch forms instead (the kernel
reports it), as does a reset (the token loop).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops import _engine, _native
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops._arguments import check_op
from linattn.ops._blockmath import unit_lower_inverse_of_strict
from linattn.ops.library import eager_float32_cpu

CHUNK_SIZE = 64


def _recurrent(q, k, v, gv, beta, X):
    """The token loop on [B, H, T, .] tensors (q scaled, gv zeros without a gate) with the
    transposed state X [B, H, V, K]; returns (o [B, H, T, V], X)."""
    outs = []
    for t in range(q.shape[2]):
        X = torch.exp(gv[:, :, t]).unsqueeze(-1) * X
        u = beta[:, :, t, None] * (k[:, :, t] - torch.einsum("bhvk,bhv->bhk", X, v[:, :, t]))
        X = X + v[:, :, t].unsqueeze(-1) * u.unsqueeze(-2)
        outs.append(torch.einsum("bhvk,bhk->bhv", X, q[:, :, t]))
    o = torch.stack(outs, 2) if outs else v.new_zeros(v.shape)
    return o, X


def _chunk(q, k, v, gv, beta, X, C: int):
    """The chunk form (module docstring) on [B, H, T, .] tensors; returns (o, X)."""
    outs = []
    for s in range(0, q.shape[2], C):
        qc, kc, vc = q[:, :, s : s + C], k[:, :, s : s + C], v[:, :, s : s + C]
        bc = beta[:, :, s : s + C]
        G = gv[:, :, s : s + C].cumsum(2)  # [B, H, c, V]
        c = G.shape[2]
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        diff = G.unsqueeze(3) - G.unsqueeze(2)  # [B, H, t, s, V]
        E = torch.exp(diff.masked_fill(~causal[:, :, None], -math.inf))  # exp(G_t - G_s), s <= t
        A = torch.einsum("bhtj,bhtsj,bhsj->bhts", vc, E, vc).tril(-1)
        eye = torch.eye(c, dtype=q.dtype, device=q.device)
        decayed = torch.exp(G) * vc  # exp(G_t) * v_t
        rhs = bc.unsqueeze(-1) * (kc - decayed @ X)
        U = torch.linalg.solve_triangular(eye + bc.unsqueeze(-1) * A, rhs, upper=False)
        P = (qc @ U.transpose(-1, -2)).tril()  # (u_s . q_t), s <= t
        o = torch.exp(G) * (qc @ X.transpose(-1, -2)) + torch.einsum(
            "bhts,bhtsj,bhsj->bhtj", P, E, vc
        )
        outs.append(o)
        last = torch.exp(G[:, :, -1:] - G) * vc  # exp(G_c - G_s) * v_s
        X = torch.exp(G[:, :, -1]).unsqueeze(-1) * X + last.transpose(-1, -2) @ U
    o = torch.cat(outs, 2) if outs else v.new_zeros(v.shape)
    return o, X


# The largest decay a chunk of the factored form may span: exp(-G) grows to exp(LIMIT) and
# exp(G) shrinks to exp(-LIMIT), both far inside the compute dtype's range.
_FACTOR_LIMIT = {torch.float32: 60.0, torch.float64: 600.0}

# The factored form works a block of chunks at a time: a block's terms stay about this many
# numbers, so they stay in the cache, and no intermediate is large enough for the allocator to
# map fresh pages for it.
BLOCK_NUMBERS = 1 << 18


def _factored_chunks(q, k, v, gv, beta, X, C: int, limit: float):
    """The chunk form with the gate factored out of each chunk, the state-independent terms of
    a block of chunks at once ([B, H, nb, C, .]). With Vd = exp(G) * v and Vi = exp(-G) * v (G
    summed in float64, each exponential rounded once), the module docstring's system for the
    errors is the delta rule's UT transform,

        (I + diag(beta) tril(Vd Vi^T, -1)) U = diag(beta) (K - Vd X_0),   U = U0 - W X_0,
        [W | U0] = (I + L)^{-1} diag(beta) [Vd | K],

    the loop carries X alone (two products a chunk), X <- exp(G_C) * X + (exp(G_C) * Vi)^T U,
    and the block's O = exp(G) * (Q X_0^T + tril(Q U^T) Vi) follows after it. A block with a
    chunk whose decay spans ``limit`` or more (exp(-G) would leave the dtype's range; a reset
    is one) runs ``_chunk`` instead, from the state entering it."""
    B, H, T, K = q.shape
    if T == 0:
        return None
    n = -(-T // C)
    pad = n * C - T
    x = (q, k, v, gv, beta)
    if pad:  # tokens that change nothing: no write (beta = 0), no decay, no read
        x = tuple(
            torch.nn.functional.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad)) for t in x
        )
    per_block = max(1, BLOCK_NUMBERS // (B * H * C * C))
    outs = []
    # the blocks as views of one split (its gradient is one concatenation; a slice per block
    # would make a zero tensor of the whole for each block's gradient)
    for block in zip(*(t.split(per_block * C, dim=2) for t in x), strict=True):
        found = _factored_block(*block, X, C, limit)
        o_b, X = _chunk(*block, X, C) if found is None else found
        outs.append(o_b)
    return torch.cat(outs, 2)[:, :, :T], X


def _factored_block(q, k, v, gv, beta, X, C: int, limit: float):
    """One block of whole chunks ([B, H, nb C, .]) entering with X: (o, X), or None where a
    chunk's decay spans ``limit`` or more."""
    nb = q.shape[2] // C
    V = v.shape[-1]
    dtype = q.dtype
    q, k, v, gv = (t.unflatten(2, (nb, C)) for t in (q, k, v, gv))  # [B, H, nb, C, .]
    beta = beta.unflatten(2, (nb, C)).unsqueeze(-1)  # [B, H, nb, C, 1]
    G = gv.double().cumsum(3)
    # gv <= 0, so G_t >= G_C: a block that passes this check has every G_t above -limit
    if bool((G[..., -1, :] <= -limit).any()):
        return None
    eG64 = torch.exp(G)
    eG, e_G = eG64.to(dtype), torch.reciprocal(eG64).to(dtype)
    D = eG[..., -1, :]  # [B, H, nb, V]: the chunk's decay of X's rows
    Vd, Vi = eG * v, e_G * v
    T_inv = unit_lower_inverse_of_strict(beta * (Vd @ Vi.transpose(-1, -2)))
    X_terms = T_inv @ (beta * torch.cat([Vd, k], dim=-1))  # [B, H, nb, C, V + K]: [W | U0]
    W, U0 = X_terms[..., :V], X_terms[..., V:]
    into = (D.unsqueeze(-2) * Vi).transpose(-1, -2)  # [B, H, nb, V, C]: exp(G_C - G_s) * v_s
    states, errors = [], []
    steps = zip(W.unbind(2), U0.unbind(2), into.unbind(2), D.unsqueeze(-1).unbind(2), strict=True)
    for W_j, U0_j, into_j, D_j in steps:
        states.append(X)
        U = U0_j - W_j @ X  # [B, H, C, K]: the errors
        errors.append(U)
        X = torch.addcmul(into_j @ U, D_j, X)
    X_all, U_all = torch.stack(states, 2), torch.stack(errors, 2)
    o = eG * (q @ X_all.transpose(-1, -2) + (q @ U_all.transpose(-1, -2)).tril_() @ Vi)
    return o.flatten(2, 3), X


# The largest chunk the compiled kernels take (csrc/oja.cpp checks it too); a larger one runs the
# PyTorch form.
FUSED_MAX_CHUNK = 1024


class _FusedOja(torch.autograd.Function):
    """The chunk form on the compiled kernels (``csrc/oja.cpp``: its header gives the forward's
    steps 1-5 and the backward's steps 6-11): q, k [TT, H, K], v, gv [TT, HV, V], beta [TT, HV]
    (the sequences' tokens one after another, ``bounds`` their cumulative lengths), S0 [N, HV, K,
    V] -> (o [TT, HV, V], S [N, HV, K, V], steep). The forward keeps the state entering every
    chunk; ``steep`` > 0 says that a chunk's decay spans ``limit`` and the outputs are not the
    rule's (the caller then runs the PyTorch form)."""

    @staticmethod
    def forward(ctx, q, k, v, gv, beta, S0, bounds: list[int], scale: float, C: int, limit: float):
        o, S, states, steep = _native.fused("oja_forward")(
            q, k, v, gv, beta, S0, bounds, scale, C, limit, True
        )
        ctx.save_for_backward(q, k, v, gv, beta, states, o)
        ctx.options = (bounds, scale, C, limit)
        ctx.mark_non_differentiable(steep)
        return o, S, steep

    @staticmethod
    def backward(ctx, d_o, dS, _):
        q, k, v, gv, beta, states, o = ctx.saved_tensors
        bounds, scale, C, limit = ctx.options
        d_o = torch.zeros_like(o) if d_o is None else d_o.contiguous()
        dS = None if dS is None else dS.contiguous()
        dq, dk, dv, dgv, dbeta, dS0 = _native.fused("oja_backward")(
            q, k, v, gv, beta, states, o, d_o, dS, bounds, scale, C, limit
        )
        H, HV = q.shape[1], v.shape[1]
        if HV != H:  # value head j read q / k head j // (HV // H): their gradients summed
            dq, dk = (x.unflatten(1, (H, HV // H)).sum(2) for x in (dq, dk))
        return dq, dk, dv, dgv, dbeta, dS0, None, None, None, None


def _fused(q, k, v, gv, beta, scale: float, C: int, S0, cu_seqlens):
    """The chunk form on the compiled kernels (``_FusedOja``) in the public layouts: (o [B, T,
    HV, V], S [N, HV, K, V]), or None where a chunk's decay spans the factored form's limit."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    bounds = cu_seqlens.tolist() if cu_seqlens is not None else [b * T for b in range(B + 1)]
    N = len(bounds) - 1
    gv = torch.zeros_like(v) if gv is None else gv
    x = [t.reshape(B * T, *t.shape[2:]).contiguous() for t in (q, k, v, gv, beta)]
    S0 = v.new_zeros(N, HV, K, V) if S0 is None else S0.contiguous()
    limit = _FACTOR_LIMIT[torch.float32]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (*x, S0)):
        o, S, steep = _FusedOja.apply(*x, S0, bounds, scale, C, limit)
    else:
        o, S, _, steep = _native.fused("oja_forward")(*x, S0, bounds, scale, C, limit, False)
    if int(steep):
        return None
    return o.view(B, T, HV, V), S


def gated_oja_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gv: Tensor | None,
    beta: Tensor,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = CHUNK_SIZE,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The gated Oja rule (the module docstring; Oja 1982, fla 0.6.0's ``gated_oja_rule``):

        S_t = S_{t-1} Diag(exp gv_t) (I - beta_t v_t v_t^T) + beta_t k_t v_t^T,
        o_t = S_t^T (scale q_t)

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H (value head j reads q/k head
            j // (HV // H)).
        gv: None or [B, T, HV, V], a log-decay per value channel (<= 0, -inf a reset).
        beta: [B, T, HV], finite.
        scale: multiplies q; None means 1 / sqrt(K).
        mode: "parallel" (one chunk of T), "recurrent" or "chunk"; chunk_size >= 1.
        initial_state: None (zeros) or [N, HV, K, V].
        output_final_state: return S_T (else None).
        cu_seqlens: None or [N + 1] cumulative lengths (B = 1): packed sequences.

    Returns:
        (o [B, T, HV, V] in v's dtype, S_T [N, HV, K, V] in float32 (float64 for float64 inputs)
        or None).
    """

    def own(B: int, T: int, HV: int, K: int, V: int) -> None:
        _checks.tensor("beta", beta, 3)
        if tuple(beta.shape) != (B, T, HV):
            raise ValueError(
                f"beta must have shape [B, T, HV] = {(B, T, HV)}, got {tuple(beta.shape)}"
            )
        _checks.gate(gv, B, T, HV, V, layout="[B, T, HV]", name="gv", channel_only=gv is not None)

    checked = check_op(
        q, k, v, None, mode=mode, chunk_size=chunk_size, scale=scale,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        initial_state=initial_state, own=own,
    )  # fmt: skip
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("gated_oja_rule", q, gv, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    if gv is not None and gv.numel() and bool(torch.isneginf(gv).any()) and mode != "recurrent":
        # a reset inside a chunk makes G_t - G_s = -inf - (-inf): the token loop takes it exactly
        mode = "recurrent"
    dtype = _engine.compute_dtype(q.dtype)
    T, H, HV, K, V = checked.T, checked.H, checked.HV, checked.K, checked.V
    scale = K**-0.5 if scale is None else scale
    G = HV // H if H else 1
    fits = checked.chunk_size <= FUSED_MAX_CHUNK
    if mode == "chunk" and fits and eager_float32_cpu(q, k, v, gv, beta, initial_state):
        found = _fused(q, k, v, gv, beta, scale, checked.chunk_size, initial_state, cu_seqlens)
        if found is not None:
            return found[0], (found[1] if checked.output_final_state else None)

    def heads(x, repeat=False):  # [B, T, h, ...] -> [B, HV, T, ...] in the compute dtype
        x = x.to(dtype)
        if repeat and G > 1:
            x = x.repeat_interleave(G, dim=2)
        return x.transpose(1, 2)

    gate = torch.zeros_like(v, dtype=dtype) if gv is None else gv
    tensors = [heads(q * scale, True), heads(k, True), heads(v), heads(gate), heads(beta)]
    N = checked.N
    X0 = q.new_zeros((N, HV, V, K), dtype=dtype)
    if initial_state is not None:
        X0 = initial_state.to(dtype).transpose(-1, -2)
    if mode == "recurrent":
        form = _recurrent
    else:
        size = max(T, 1) if mode == "parallel" else checked.chunk_size
        limit = _FACTOR_LIMIT.get(dtype) if mode == "chunk" else None

        def form(*x):
            found = None if limit is None else _factored_chunks(*x, size, limit)
            return _chunk(*x, size) if found is None else found

    if cu_seqlens is None:
        o, X = form(*tensors, X0)
    else:
        bounds = cu_seqlens.tolist()
        outs, Xs = [], []
        for n in range(N):
            s, e = bounds[n], bounds[n + 1]
            o_n, X_n = form(*(t[:, :, s:e] for t in tensors), X0[n : n + 1])
            outs.append(o_n)
            Xs.append(X_n)
        o, X = torch.cat(outs, 2), torch.cat(Xs)
    o = o.transpose(1, 2).to(v.dtype)
    return o, (X.transpose(-1, -2) if checked.output_final_state else None)


def gated_oja_rule_step(
    state: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gv: Tensor | None,
    beta: Tensor,
    *,
    scale: float | None = None,
) -> Tensor:
    """One token of ``gated_oja_rule`` (decoding), the state [B, HV, K, V] updated in place.

    Args:
        state: [B, HV, K, V], float32 or float64. q, k: [B, H, K] (H dividing HV); v: [B, HV, V];
        gv: None or [B, HV, V] (<= 0); beta: [B, HV]. scale: None means 1 / sqrt(K).

    Returns:
        o_t: [B, HV, V] in v's dtype.
    """
    _checks.tensor("state", state, 4)
    B, HV, K, V = state.shape
    _checks.tensor("q", q, 3)
    _checks.tensor("k", k, 3)
    H = k.shape[1]
    if tuple(k.shape) != (B, H, K) or q.shape != k.shape or H == 0 or HV % H:
        raise ValueError(
            f"q and k must have shape [B, H, K] with B, K = {(B, K)} and H dividing the state's "
            f"{HV} heads, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    _checks.tensor("v", v, 3)
    if tuple(v.shape) != (B, HV, V):
        raise ValueError(f"v must have shape [B, HV, V] = {(B, HV, V)}, got {tuple(v.shape)}")
    _checks.tensor("beta", beta, 2)
    if tuple(beta.shape) != (B, HV):
        raise ValueError(f"beta must have shape [B, HV] = {(B, HV)}, got {tuple(beta.shape)}")
    _checks.gate(gv, B, HV, V, layout="[B, HV]", name="gv", channel_only=gv is not None)
    _checks.scale(scale)
    scale = K**-0.5 if scale is None else scale
    d, G = state.dtype, HV // H
    x = [
        (q * scale).to(d).repeat_interleave(G, 1), k.to(d).repeat_interleave(G, 1), v.to(d),
        torch.zeros_like(v, dtype=d) if gv is None else gv.to(d), beta.to(d),
    ]  # fmt: skip
    o, X = _recurrent(*(t.unsqueeze(2) for t in x), state.transpose(-1, -2))
    state.copy_(X.transpose(-1, -2))
    return o[:, :, 0].to(v.dtype)
