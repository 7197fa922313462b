"""One token of every mechanism for the generation-step tests (``test_step``, ``test_native``)."""

from __future__ import annotations

import torch

B, H, K, V = 2, 3, 5, 4
MECHANISMS = ["linear", "scalar_decay", "gla", "delta", "gated_delta", "kda"]


def inputs(mechanism: str, seed: int = 0, dtype=torch.float64) -> dict:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, K, generator=gen), torch.randn(B, H, K, generator=gen)
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, H, V, generator=gen)
    beta = (
        torch.rand(B, H, generator=gen) * 2 if "delta" in mechanism or mechanism == "kda" else None
    )
    g = None
    if mechanism in ("scalar_decay", "gated_delta"):
        g = -torch.rand(B, H, generator=gen)
    if mechanism in ("gla", "kda"):
        g = -torch.rand(B, H, K, generator=gen)
    cast = {"q": q, "k": k, "v": v, "beta": beta, "g": g}
    return {n: None if x is None else x.to(dtype) for n, x in cast.items()}
