"""Inputs with resets (log-gates far below what exp represents, or -inf) among ordinary gates,
shared by the reset tests of the ops (``test_resets``) and of the slice maps (``test_maps``)."""

from __future__ import annotations

import torch

T = 40
# First token of the sequence and of chunks of 7 and 16, last of a chunk (6, 15), consecutive
# (6, 7 and 15, 16), the middle of a chunk (23) and the last token.
RESET_AT = [0, 6, 7, 15, 16, 23, T - 1]


def reset_inputs(rule: str, gate: str, reset: float, *, B=2, H=2, K=8, V=4, seed=0) -> dict:
    """float64 inputs [B, T, H, ...] with ordinary gates (logsigmoid(N(2, 1)), down to about -0.05)
    and ``reset`` at RESET_AT: in every channel (the first token in the first batch only, so
    that the second one's initial state matters), and for per-channel gates in half of the
    channels at token 11 too."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    shape = (B, T, H) if gate == "scalar" else (B, T, H, K)
    g = torch.nn.functional.logsigmoid(randn(*shape) + 2.0)
    g[:, RESET_AT[1:]] = reset
    g[0, 0] = reset  # the first token of the first sequence: its initial state is forgotten
    if gate == "channel":
        g[:, 11, :, : K // 2] = reset  # a reset of some channels only
    x = {
        "q": randn(B, T, H, K),
        "k": torch.nn.functional.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, H, V),
        "beta": 2 * torch.rand(B, T, H, generator=gen, dtype=torch.float64),
        "g": g,
        "S0": randn(B, H, K, V),
    }
    if rule == "additive":
        x["beta"] = None
    return x
