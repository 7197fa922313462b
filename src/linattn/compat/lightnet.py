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

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype


def lightnet_gate(
    x: Tensor, initial_state: Tensor | None = None, cu_seqlens: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """LightNet's keys and log-decays from the key logits x [B, T, H, K] (fla's
    ``fused_additive_gate``): (k, g, z_T) with z_T [N, 1, H, K] (the module docstring)."""
    dtype = compute_dtype(x.dtype)
    B, T, H, K = x.shape
    if cu_seqlens is None:
        bounds = [(n * T, (n + 1) * T) for n in range(B)]
    else:
        ends = cu_seqlens.tolist()
        bounds = list(zip(ends[:-1], ends[1:], strict=True))
    flat = x.to(dtype).reshape(B * T, H, K)
    ks, gs, zs = [], [], []
    for n, (bos, eos) in enumerate(bounds):
        z0 = None if initial_state is None else initial_state[n, 0].to(dtype)  # [H, K]
        z = flat[bos:eos].logcumsumexp(0)
        if z0 is not None:
            z = torch.logaddexp(z, z0)
        start = torch.full_like(flat[:1], float("-inf")) if z0 is None else z0[None]
        z_prev = torch.cat([start, z[:-1]])
        ks.append((flat[bos:eos] - z).exp())
        gs.append(torch.where(z_prev == float("-inf"), torch.zeros_like(z), z_prev - z))
        zs.append(z[-1] if eos > bos else start[0])
    k = torch.cat(ks).reshape(B, T, H, K).to(x.dtype)
    g = torch.cat(gs).reshape(B, T, H, K).to(x.dtype)
    return k, g, torch.stack(zs)[:, None]


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
