"""Tiny model configurations shared by the model tests."""

from __future__ import annotations

from linattn.models import MIXERS, LMConfig

HYBRID = ("kda", "kda", "kda", "softmax")  # Kimi-Linear-style: three KDA blocks, one softmax block
# One block of every mixer, and the hybrid.
CASES = [(name,) for name in MIXERS] + [HYBRID]
IDS = [c[0] if len(c) == 1 else "hybrid" for c in CASES]


def tiny_config(mixers, **overrides) -> LMConfig:
    kwargs = dict(vocab_size=37, d_model=32, n_heads=2, mixers=mixers, chunk_size=8, taylor_dim=4)
    kwargs.update(overrides)
    return LMConfig(**kwargs)
