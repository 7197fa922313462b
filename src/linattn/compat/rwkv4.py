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
5 and 10), run by ``linattn.ops.rwkv6``. Their shift m = max(eps_0, max_t k_t + max(u, 0)) per
sequence and channel keeps every exponent <= 0, so nothing overflows; a channel whose keys lie
far (~700 in float64, ~80 in float32) below its largest underflows there where the running
maximum would not. The final eps is its max-plus recurrence unrolled:
eps_T = max(eps_0 - T exp(w), max_s k_s - (T - 1 - s) exp(w)).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks
from linattn.ops import rwkv6


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
    else:
        o, alpha, beta, eps = _additive(w, u, k, v, alpha, beta, eps, mode, chunk_size)
    return o.to(out_dtype), torch.stack([alpha, beta, eps], 1).unsqueeze(2).to(out_dtype)


def fused_recurrent_rwkv4(
    w: Tensor, u: Tensor, k: Tensor, v: Tensor, state: Tensor
) -> tuple[Tensor, Tensor]:
    """fla's ``fused_recurrent_rwkv4``: RWKV-4's WKV by fla's running-maximum loop; returns
    (wkv [B, T, C], state [B, 3, 1, C]) in k's dtype."""
    return wkv(w, u, k, v, state, mode="recurrent")
