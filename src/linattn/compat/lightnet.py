"""fla's LightNet (``fla.ops.lightnet``: ``chunk_lightnet``, ``fused_recurrent_lightnet``; Qin et
al. 2024, "You only scan once"): GLA whose keys are a softmax over the time so far.

Per key channel, with the key logits x_t and the log-normaliser z_t = log(exp(z_{t-1}) +
exp(x_t)) (z_0 = -inf, or the initial log-normaliser), fla's ``fused_additive_gate`` gives

    k_t = exp(x_t - z_t),    g_t = z_{t-1} - z_t  (0 while z_{t-1} = -inf)

and GLA (spec section 10) runs S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t):
S_t = sum_{s <= t} exp(x_s - z_t) v_s^T. A reparametrisation of GLA (registry entry "lightnet"),
computed by linattn's GLA. States: (S [N, H, K, V], z [N, 1, H, K]); the final z is returned
whatever ``output_final_state`` says, as fla does.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops import logsumexp_gate
from linattn.ops.diagonal import empty as _empty
from linattn.ops.diagonal import scan


def lightnet_gate(
    x: Tensor, initial_state: Tensor | None = None, cu_seqlens: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """LightNet's keys and log-decays from the key logits x [B, T, H, K] (fla's
    ``fused_additive_gate``): (k, g, z_T) with z_T [N, 1, H, K] (the module docstring), computed
    by ``_Gate`` (the running log-sum-exp in chunks), sequence by sequence where packed."""
    dtype = compute_dtype(x.dtype)
    B, T, H, K = x.shape
    flat = x.to(dtype)
    z0 = None if initial_state is None else initial_state[:, 0].to(dtype)  # [N, H, K]
    if cu_seqlens is None:
        k, g, z = _Gate.apply(flat, z0, _core.CHUNK) if T else _empty_gate(flat, z0)
    else:
        ends = cu_seqlens.tolist()
        ks, gs, zs = [], [], []
        for n, (bos, eos) in enumerate(itertools.pairwise(ends)):
            start = None if z0 is None else z0[n : n + 1]
            piece = flat[:, bos:eos]
            k, g, z = (
                _Gate.apply(piece, start, _core.CHUNK) if eos > bos else _empty_gate(piece, start)
            )
            ks.append(k), gs.append(g), zs.append(z)
        k, g, z = torch.cat(ks, 1), torch.cat(gs, 1), torch.cat(zs)
    return k.to(x.dtype), g.to(x.dtype), z[:, None]


def _empty_gate(x: Tensor, z0: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """No token: empty keys and gates, and z_T = z_0 (-inf without one)."""
    B, _, H, K = x.shape
    z = torch.full((B, H, K), float("-inf"), dtype=x.dtype) if z0 is None else z0 + 0 * x.sum()
    return x + 0, x + 0, z


def _running_logsumexp(x: Tensor, z0: Tensor | None, C: int, g: Tensor | None = None) -> Tensor:
    """z_t = log(exp(z_{t-1}) + exp(x_t)) for x [B, T, D] with contiguous rows (z_{-1} = z0, or
    -inf), in chunks as ``linattn.ops.diagonal.scan``: each chunk's log-sum-exp, the running one
    over the chunks (this function, recursively), then each chunk token by token from its
    entering value (log-sum-exp is associative: the same numbers, grouped). ``g``: also
    g_t = z_{t-1} - z_t into it, with z_{t-1} the value each step added to (so g <= 0 exactly,
    also where a chunk's entering value and its predecessor's last z differ by rounding)."""
    B, T, D = x.shape
    z = _empty((B, T, D), x)
    n, r = divmod(T, C)
    whole = 0 if n < 2 or C < 2 else n * C
    if whole:
        xv, zv = (t[:, :whole].view(B, n, C, D) for t in (x, z))
        gv = None if g is None else g[:, :whole].view(B, n, C, D)
        local = xv[:, :, 0].clone()  # each chunk's log-sum-exp, token by token (cheaper here
        for c in range(1, C):  # than torch.logsumexp's passes over the chunk)
            torch.logaddexp(local, xv[:, :, c], out=local)
        ends = _running_logsumexp(local, z0, C)
        start = torch.full_like(ends[:, :1], float("-inf")) if z0 is None else z0[:, None]
        prev = torch.cat([start, ends[:, :-1]], 1)
        for c in range(C):
            torch.logaddexp(prev, xv[:, :, c], out=zv[:, :, c])
            if gv is not None:
                torch.sub(prev, zv[:, :, c], out=gv[:, :, c])
            prev = zv[:, :, c]
    prev = z[:, whole - 1] if whole else z0
    for t in range(whole, T):
        if prev is None:
            z[:, t] = x[:, t]
        else:
            torch.logaddexp(prev, x[:, t], out=z[:, t])
            if g is not None:
                torch.sub(prev, z[:, t], out=g[:, t])
        prev = z[:, t]
    return z


class _Gate(torch.autograd.Function):
    """(k, g, z_T) of ``lightnet_gate`` for one batch of equal-length sequences, T >= 1.

    Forward: z by ``_running_logsumexp``, k = exp(x - z), g_t = z_{t-1} - z_t (g_0 = 0 where
    z_{-1} = -inf: no prior mass). Backward, with dz's total R (z_t = logaddexp(z_{t-1}, x_t):
    dz_t / dz_{t-1} = exp(g_t), dz_t / dx_t = k_t): the direct terms G_t = -dk_t k_t - dg_t +
    dg_{t+1} (+ dz_T at the last token), then R_t = G_t + exp(g_{t+1}) R_{t+1} (the element-wise
    recurrence backwards, ``linattn.ops.diagonal.scan``), dx = k (dk + R), dz_0 = exp(z_0 - z'_0)
    R_0 + dg_0 (z'_0 the first token's z). Full-size tensors on the extension's cached pages."""

    @staticmethod
    def forward(ctx, x: Tensor, z0: Tensor | None, C: int):
        B, T, H, K = x.shape
        rows = x.reshape(B, T, H * K)
        prior = None if z0 is None else z0.reshape(B, H * K)
        ctx.C, ctx.state_shape = C, (B, H, K)
        ctx.fused = logsumexp_gate.fused(x)
        if ctx.fused:  # csrc/logsumexp.cpp: the same steps, one pass over x
            k, g, z_last = logsumexp_gate.forward(rows.contiguous(), prior)
            ctx.save_for_backward(k, g, prior, None)
            shape = (B, T, H, K)
            return k.view(shape), g.view(shape), z_last.view(B, H, K)
        g = _empty((B, T, H * K), x)
        z = _running_logsumexp(rows, prior, C, g)
        k = _empty((B, T, H * K), x)
        torch.sub(rows, z, out=k).exp_()
        if prior is None:
            g[:, 0] = 0
        else:
            g[:, 0] = torch.where(prior == float("-inf"), 0, prior - z[:, 0])
        if bool((z[:, 0] == float("-inf")).any()):  # -inf logits: no mass yet, as at the start
            z_prev = torch.cat([torch.full_like(z[:, :1], float("-inf")) if prior is None
                                else prior[:, None], z[:, :-1]], 1)  # fmt: skip
            g = torch.where(z_prev == float("-inf"), 0, g)
        ctx.save_for_backward(k, g, prior, z[:, 0].clone())
        shape = (B, T, H, K)
        return k.view(shape), g.view(shape), z[:, -1].reshape(B, H, K)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dk: Tensor | None, dg: Tensor | None, dz_T: Tensor | None):
        k, g, prior, z_first = ctx.saved_tensors
        B, T, D = k.shape
        if ctx.fused:
            no_mass = torch.ones(B, D, dtype=torch.bool) if prior is None else prior == -math.inf
            flat = [None if t is None else t.reshape(B, T, D) for t in (dk, dg)]
            dx, dz0 = logsumexp_gate.backward(
                k, g, *flat, None if dz_T is None else dz_T.reshape(B, D), no_mass
            )
            if prior is None or not ctx.needs_input_grad[1]:
                dz0 = None
            else:  # a z0 of -inf has no gradient (exp(z0 - z_0) = 0)
                dz0 = torch.where(no_mass, 0, dz0).view(ctx.state_shape)
            return dx.view(*ctx.state_shape[:1], T, *ctx.state_shape[1:]), dz0, None
        direct = _empty((B, T, D), k)  # dk k
        total = _empty((B, T, D), k)  # G, then R in place
        if dk is None:
            direct.zero_()
        else:
            torch.mul(dk.reshape(B, T, D), k, out=direct)
        torch.neg(direct, out=total)
        if dg is not None:
            dg = dg.reshape(B, T, D)
            total.sub_(dg)
            total[:, :-1] += dg[:, 1:]
            first_fixed = dg[:, 0] if prior is None else torch.where(
                prior == float("-inf"), dg[:, 0], 0
            )  # fmt: skip
            total[:, 0] += first_fixed  # a g_0 of 0 (no prior mass) has no gradient
        if dz_T is not None:
            total[:, -1] += dz_T.reshape(B, D)
        if T > 1:
            decays = _empty((B, T - 1, D), k)
            torch.exp(g[:, 1:], out=decays)
            scan(decays, total[:, :-1], total[:, -1], ctx.C, reverse=True, out=total[:, :-1],
                 g=g[:, 1:])  # fmt: skip
        dx = direct.addcmul_(k, total)
        dz0 = None
        if prior is not None and ctx.needs_input_grad[1]:
            dz0 = torch.exp(prior - z_first) * total[:, 0]
            if dg is not None:
                dz0 = dz0 + torch.where(prior == float("-inf"), 0, dg[:, 0])
            dz0 = dz0.view(ctx.state_shape)
        return dx.view(*ctx.state_shape[:1], T, *ctx.state_shape[1:]), dz0, None


def _lightnet(mode, q, k, v, scale, initial_state, output_final_state, state_v_first, cu_seqlens):
    h0, z0 = (None, None) if initial_state is None else initial_state
    _core.check(q, k, v)
    if v.shape[2] != q.shape[2]:
        raise ValueError(f"v must have H = {q.shape[2]} heads as q, got {v.shape[2]}")
    _core.check_varlen(q, h0, cu_seqlens)
    N = q.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
    if z0 is not None:
        _core.check_tensor("initial_state[1]", z0)
        if tuple(z0.shape) != (N, 1, *q.shape[2:]):
            raise ValueError(
                f"initial_state[1] (the log-normaliser) must have shape "
                f"{(N, 1, *q.shape[2:])}, got {tuple(z0.shape)}"
            )
    key, g, zt = lightnet_gate(k, z0, cu_seqlens)
    o, ht = _core.run(
        q, key, v, delta=False, mode=mode, gk=g, scale=scale, initial_state=h0,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        state_v_first=state_v_first,
    )  # fmt: skip
    return o, (ht, zt)


def chunk_lightnet(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: tuple[Tensor | None, Tensor | None] | None = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor | None, Tensor]]:
    """fla's ``chunk_lightnet`` (``fla.ops.lightnet`` only): LightNet's keys and gates, then
    GLA's chunk form; k holds the key logits; returns (o, (S, z))."""
    return _lightnet(
        "chunk", q, k, v, scale, initial_state, output_final_state, state_v_first, cu_seqlens
    )


def fused_recurrent_lightnet(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: tuple[Tensor | None, Tensor | None] | None = None,
    output_final_state: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor | None, Tensor]]:
    """fla's ``fused_recurrent_lightnet`` (``fla.ops.lightnet`` only): the token loop of
    ``chunk_lightnet``; returns (o, (S, z))."""
    return _lightnet(
        "recurrent", q, k, v, scale, initial_state, output_final_state, state_v_first, cu_seqlens
    )
