"""fla's RWKV-4 (``fused_recurrent_rwkv4``, ``fla.ops.rwkv4`` only; Peng et al. 2023, eq. 14):
the WKV of every channel c, with the decay exp(-exp(w_c)) per token, the bonus u_c and the weights
exp(k_t),

    wkv_t = (a_{t-1} + exp(u + k_t) v_t) / (b_{t-1} + exp(u + k_t))
    a_t = exp(-exp(w)) a_{t-1} + exp(k_t) v_t,    b_t = exp(-exp(w)) b_{t-1} + exp(k_t)

w, u [C]; k, v [B, T, C]; the state [B, 3, 1, C] is fla's (alpha, beta, eps): a = alpha exp(eps),
b = beta exp(eps), with eps the running maximum eps_t = max(eps_{t-1} - exp(w), k_t).

Forms (``wkv``): "recurrent" is fla's kernel's loop, which keeps (alpha, beta, eps) and so never
exponentiates more than a difference to the running maximum. "chunk" and "parallel" are the
reparametrisation: a and b are RWKV-6's additive memory per channel (one head per channel,
K = 1, q = 1, keys exp(k_t - m), values [v_t, 1], log-decay -exp(w), bonus exp(u); spec sections
5 and 10). "parallel" runs it by ``linattn.ops.rwkv6``; "chunk" by ``linattn.ops.diagonal``'s
chunk form (the sums a_t and b_t are element-wise recurrences: each step one operation over every
channel, where RWKV-6's chunk kernel would spend its blocks on K = 1 heads), with its gradients
written out (``_ChunkWKV``). The shift m = max(eps_0, max_t k_t + max(u, 0)) per sequence and
channel keeps every exponent <= 0, so nothing overflows; a channel whose keys lie far (~700 in
float64, ~80 in float32) below its largest underflows there where the running maximum would not.
The final eps is its max-plus recurrence unrolled:
eps_T = max(eps_0 - T exp(w), max_s k_s - (T - 1 - s) exp(w)).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks
from linattn.ops import rwkv6
from linattn.ops.diagonal import empty as _empty
from linattn.ops.diagonal import scan


def _check(w, u, k, v, state) -> None:
    for name, x in (("w", w), ("u", u), ("k", k), ("v", v), ("state", state)):
        _core.check_tensor(name, x)
    if k.dim() != 3:
        raise ValueError(f"k must have shape [B, T, C], got {tuple(k.shape)}")
    B, _, C = k.shape
    if v.shape != k.shape:
        raise ValueError(f"v must have the shape of k [B, T, C] = {tuple(k.shape)}, got "
                         f"{tuple(v.shape)}")  # fmt: skip
    for name, x in (("w", w), ("u", u)):
        if tuple(x.shape) != (C,):
            raise ValueError(f"{name} must have shape [C] = {(C,)}, got {tuple(x.shape)}")
    if tuple(state.shape) != (B, 3, 1, C):
        raise ValueError(
            f"state must have shape [B, 3, 1, C] = {(B, 3, 1, C)} (alpha, beta, eps), got "
            f"{tuple(state.shape)}"
        )


def _recurrent(w, u, k, v, alpha, beta, eps):
    """fla's loop: (alpha, beta, eps) kept relative to the running maximum eps."""
    decay = -w.exp()
    out = []
    for t in range(k.shape[1]):
        kt, vt = k[:, t], v[:, t]
        ukt = u + kt
        tau = torch.maximum(ukt, eps)
        e1, e2 = (eps - tau).exp(), (ukt - tau).exp()
        out.append((e1 * alpha + e2 * vt) / (e1 * beta + e2))
        w_eps = decay + eps
        eps = torch.maximum(w_eps, kt)
        e1, e2 = (w_eps - eps).exp(), (kt - eps).exp()
        alpha, beta = e1 * alpha + e2 * vt, e1 * beta + e2
    o = torch.stack(out, 1) if out else torch.zeros_like(v)
    return o, alpha, beta, eps


def _additive(w, u, k, v, alpha, beta, eps, mode, chunk_size):
    """The sums a, b as RWKV-6's memory per channel, shifted by m (the module docstring)."""
    B, T, C = k.shape
    decay = -w.exp()
    m = eps
    if T:
        m = torch.maximum(eps, k.amax(1) + u.clamp(min=0))
    m = m.detach()  # any shift gives the same ratios: a constant for autograd
    keys = (k - m[:, None]).exp().unsqueeze(-1)  # [B, T, C, 1]
    values = torch.stack([v, torch.ones_like(v)], -1)  # [B, T, C, 2]
    S0 = (torch.stack([alpha, beta], -1) * (eps - m).exp()[..., None]).unsqueeze(-2)
    o, S = rwkv6(
        torch.ones_like(keys), keys, values, decay.expand(B, T, C)[..., None], u.exp()[:, None],
        scale=1.0, mode=mode, chunk_size=chunk_size, initial_state=S0, output_final_state=True,
    )  # fmt: skip
    steps = torch.arange(T - 1, -1, -1, dtype=k.dtype, device=k.device)  # T - 1 - s
    eps_T = eps + T * decay
    if T:
        eps_T = torch.maximum(eps_T, (k + steps[:, None] * decay).amax(1))
    S = S[..., 0, :] * (m - eps_T).exp()[..., None]  # [B, C, 2]: (a, b) exp(-eps_T)
    return o[..., 0] / o[..., 1], S[..., 0], S[..., 1], eps_T


class _ChunkWKV(torch.autograd.Function):
    """The shifted sums of RWKV-4 in chunks, the output and the final eps (the module docstring),
    with m a constant: e_t = exp(k_t - m), a_t = exp(d) a_{t-1} + e_t v_t, b_t likewise with e_t,
    wkv_t = (a_{t-1} + exp(u) e_t v_t) / (b_{t-1} + exp(u) e_t); returns (wkv, a_T, b_T, eps_T).

    The gradients, with n_t, z_t the numerator and denominator: dn = dwkv / z, dz = -dn wkv; the
    sums' own, ga_t = exp(d) ga_{t+1} + dn_{t+1} (ga_{T-1} = da_T), gb likewise with dz (the
    same recurrence backwards); then de = ga v + gb + exp(u) (dn v + dz), dv = e (ga + exp(u) dn),
    dk = e de, du = exp(u) sum e (dn v + dz), dd = exp(d) sum (ga_t a_{t-1} + gb_t b_{t-1}),
    da_0 = exp(d) ga_0 + dn_0 (b_0 likewise); eps_T's to the term that attains its maximum. Every
    full-size tensor is on the extension's cached pages (``diagonal._empty``), each written by one
    ``out=`` or in-place operation."""

    @staticmethod
    def forward(ctx, k, v, d, u, a0, b0, eps0, m, chunk_size):
        B, T, C = k.shape
        e = _empty((B, T, C), k)
        torch.sub(k, m[:, None], out=e).exp_()
        ev = _empty((B, T, C), k)
        torch.mul(e, v, out=ev)
        gates = d.expand(B, T, C)
        decays = d.exp().expand(B, T, C)
        a = scan(decays, ev, a0, chunk_size, g=gates)
        b = scan(decays, e, b0, chunk_size, g=gates)
        eu = u.exp()
        num, den = _empty((B, T, C), k), _empty((B, T, C), k)
        for out, total, write, first in ((num, a, ev, a0), (den, b, e, b0)):
            torch.addcmul(first, write[:, 0], eu, out=out[:, 0])
            torch.addcmul(total[:, :-1], write[:, 1:], eu, out=out[:, 1:])
        wkv = num.div_(den)
        del ev
        eps_T = _final_eps(k, d, eps0)
        ctx.save_for_backward(k, e, v, den, wkv, a, b, a0, b0, d, eu, eps0, eps_T)
        ctx.chunk_size = chunk_size
        return wkv, a[:, -1], b[:, -1], eps_T

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dwkv, da_T, db_T, deps_T):
        k, e, v, den, wkv, a, b, a0, b0, d, eu, eps0, eps_T = ctx.saved_tensors
        B, T, C = e.shape
        decays = d.exp().expand(B, T - 1, C)
        gates = d.expand(B, T - 1, C)
        dn = _empty((B, T, C), e)
        torch.div(dwkv, den, out=dn)
        dz = _empty((B, T, C), e)
        torch.mul(dn, wkv, out=dz).neg_()
        grads = []
        for d_out, d_last in ((dn, da_T), (dz, db_T)):
            r = _empty((B, T, C), e)
            r[:, -1] = 0 if d_last is None else d_last
            if T > 1:
                scan(decays, d_out[:, 1:], r[:, -1], ctx.chunk_size, reverse=True,
                     out=r[:, :-1], g=gates)  # fmt: skip
            grads.append(r)
        ga, gb = grads
        # dd: exp(d) sum_t (ga_t a_{t-1} + gb_t b_{t-1}), a_{-1} = a_0
        scratch = _empty((B, T, C), e)
        dd = torch.zeros_like(d)
        for r, total, first in ((ga, a, a0), (gb, b, b0)):
            torch.mul(r[:, 1:], total[:, :-1], out=scratch[:, 1:])
            torch.mul(r[:, 0], first, out=scratch[:, 0])
            dd += scratch.sum((0, 1))
        dd *= d.exp()
        da0 = d.exp() * ga[:, 0] + dn[:, 0]
        db0 = d.exp() * gb[:, 0] + dz[:, 0]
        # p = dn v + dz (the bonus's share), then de, dv, du, dk
        p = dz.addcmul_(dn, v)
        de = scratch
        torch.mul(ga, v, out=de).add_(gb).addcmul_(p, eu)
        dv = ga.addcmul_(dn, eu).mul_(e)
        du = eu * p.mul_(e).sum((0, 1))
        dk = de.mul_(e)
        deps0 = None
        if deps_T is not None:
            deps0 = _final_eps_gradient(k, d, eps0, eps_T, deps_T, dk, dd)
        return dk, dv, dd, du, da0, db0, deps0, None, None


_EPS_BLOCK = 1024  # tokens per step of the final eps's maximum: its temporaries stay small


def _eps_terms(k: Tensor, d: Tensor):
    """The terms k_s + (T - 1 - s) d of eps_T, a block of tokens at a time: (start, the block's
    terms [B, n, C], their T - 1 - s [n, 1])."""
    T = k.shape[1]
    for start in range(0, T, _EPS_BLOCK):
        block = k[:, start : start + _EPS_BLOCK]
        steps = torch.arange(T - 1 - start, T - 1 - start - block.shape[1], -1, dtype=k.dtype,
                             device=k.device)[:, None]  # fmt: skip
        yield start, torch.addcmul(block, steps, d), steps


def _final_eps(k: Tensor, d: Tensor, eps0: Tensor) -> Tensor:
    """eps_T = max(eps_0 + T d, max_s k_s + (T - 1 - s) d) [B, C]."""
    best = eps0 + k.shape[1] * d
    for _, terms, _ in _eps_terms(k, d):
        best = torch.maximum(best, terms.amax(1))
    return best


def _final_eps_gradient(k, d, eps0, eps_T, deps_T, dk, dd) -> Tensor:
    """eps_T's gradient shared evenly by the terms that attain it (as ``amax``'s): into dk and
    dd in place; returns eps_0's share."""
    T = k.shape[1]
    first = eps0 + T * d == eps_T
    count = first.to(k.dtype)
    for _, terms, _ in _eps_terms(k, d):
        count += (terms == eps_T[:, None]).sum(1)
    share = deps_T / count
    dd += (torch.where(first, share, 0) * T).sum(0)
    for start, terms, steps in _eps_terms(k, d):
        hit = torch.where(terms == eps_T[:, None], share[:, None], 0)
        dk[:, start : start + terms.shape[1]] += hit
        dd += (hit * steps).sum((0, 1))
    return torch.where(first, share, 0)


def _chunk(w, u, k, v, alpha, beta, eps, chunk_size):
    """The chunk form (``_ChunkWKV``): wkv and the state (alpha, beta, eps) after the last token."""
    d = -w.exp()
    m = torch.maximum(eps, k.detach().amax(1) + u.detach().clamp(min=0)).detach()
    a0, b0 = (x * (eps - m).exp() for x in (alpha, beta))
    o, a_T, b_T, eps_T = _ChunkWKV.apply(
        k.contiguous(), v.contiguous(), d, u, a0, b0, eps, m, chunk_size
    )
    scale = (m - eps_T).exp()
    return o, a_T * scale, b_T * scale, eps_T


def wkv(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    state: Tensor,
    mode: str = "recurrent",
    chunk_size: int = _core.CHUNK,
) -> tuple[Tensor, Tensor]:
    """RWKV-4's WKV (the module docstring) in the form ``mode``; returns (wkv [B, T, C] and the
    state [B, 3, 1, C] after the last token, both in k's dtype), computed in float32 (float64
    for float64 inputs)."""
    _check(w, u, k, v, state)
    chunk_size = _checks.options(mode, chunk_size)
    dtype, out_dtype = compute_dtype(_core.promote(w, u, k, v, state)), k.dtype
    w, u, k, v, state = (x.to(dtype) for x in (w, u, k, v, state))
    alpha, beta, eps = state[:, 0, 0], state[:, 1, 0], state[:, 2, 0]
    if mode == "recurrent":
        o, alpha, beta, eps = _recurrent(w, u, k, v, alpha, beta, eps)
    elif mode == "chunk" and k.shape[1]:
        o, alpha, beta, eps = _chunk(w, u, k, v, alpha, beta, eps, chunk_size)
    else:
        o, alpha, beta, eps = _additive(w, u, k, v, alpha, beta, eps, mode, chunk_size)
    return o.to(out_dtype), torch.stack([alpha, beta, eps], 1).unsqueeze(2).to(out_dtype)


def fused_recurrent_rwkv4(
    w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """fla's ``fused_recurrent_rwkv4``: RWKV-4's WKV by fla's running-maximum loop; returns
    (wkv [B, T, C], state [B, 3, 1, C]) in k's dtype."""
    return wkv(w, u, k, v, state, mode="recurrent")
