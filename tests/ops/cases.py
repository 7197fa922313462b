"""Shared test inputs and the float64 oracle, looped over batch and heads."""

from __future__ import annotations

import numpy as np
import torch

from linattn.ops.mechanism import Mechanism
from linattn.reference.gated import recurrence


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    """sqrt(mean (x - ref)^2) / sqrt(mean ref^2), in float64."""
    x, ref = x.double(), ref.double()
    return float((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def make_inputs(
    B=2,
    T=17,
    H=2,
    K=4,
    V=3,
    *,
    gate=None,
    rule="additive",
    state=False,
    dtype=torch.float64,
    seed=0,
    positive=False,
):
    """Random q, k, v (keys of unit length), beta in [0, 2], g <= 0 of the requested shape.

    gate: None, "scalar" ([B, T, H]) or "channel" ([B, T, H, K]). rule: "additive" or "delta".
    Returns a dict of float64 tensors (cast to dtype): q, k, v, beta (delta only), g, S0.
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    k = k / k.norm(dim=-1, keepdim=True)
    if positive:
        q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    out = {"q": q, "k": k, "v": v}
    out["beta"] = 2 * torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    if rule != "delta":
        out["beta"] = None
    # log-sigmoid of a shifted normal: decays mostly in (0.5, 1), as in trained models.
    if gate == "scalar":
        out["g"] = torch.nn.functional.logsigmoid(randn(B, T, H) + 2.0)
    elif gate == "channel":
        out["g"] = torch.nn.functional.logsigmoid(randn(B, T, H, K) + 2.0)
    else:
        out["g"] = None
    out["S0"] = randn(B, H, K, V) if state else None
    return {n: (None if x is None else x.to(dtype)) for n, x in out.items()}


def oracle(q, k, v, beta=None, g=None, S0=None, *, rule="additive", scale=1.0):
    """The float64 reference for [B, T, H, D] inputs: returns o [B, T, H, V], S [B, H, K, V]."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = np.zeros((B, T, H, V))
    S = np.zeros((B, H, K, V))

    def np64(x):
        return None if x is None else x.detach().double().numpy()

    q, k, v, beta, g, S0 = (np64(x) for x in (q, k, v, beta, g, S0))
    for b in range(B):
        for h in range(H):
            o[b, :, h], S[b, h] = recurrence(
                q[b, :, h],
                k[b, :, h],
                v[b, :, h],
                None if beta is None else beta[b, :, h],
                None if g is None else g[b, :, h],
                rule=rule,
                scale=scale,
                initial_state=None if S0 is None else S0[b, h],
            )
    return torch.from_numpy(o), torch.from_numpy(S)


def schema_mechanism(beta, g) -> tuple[str, str]:
    """The chunk ops' ``rule`` and ``gate`` arguments for internal beta and g (``internal``'s: a
    gate of width 1 is one per head, wider one per key channel)."""
    rule = "additive" if beta is None else "delta"
    return rule, "none" if g is None else "head" if g.shape[-1] == 1 else "channel"


def internal(x, dtype=torch.float32):
    """Public [B, T, H, ...] inputs -> internal [B, H, T, ...] views in ``dtype`` (q, k, v, beta,
    g; a gate per head as one shared channel [B, H, T, 1])."""
    out = []
    for name in ("q", "k", "v", "beta", "g"):
        t = x[name]
        if t is not None:
            t = t.to(dtype).transpose(1, 2)
            if name == "g" and t.dim() == 3:
                t = t.unsqueeze(-1)
        out.append(t)
    return out


def mechanism(x):
    """The mechanism of public inputs (``Mechanism.of``), for calls of the internal forms."""
    return Mechanism.of(x.get("beta"), x.get("g"))
