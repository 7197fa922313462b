"""Tiny model configurations shared by the model tests."""

from __future__ import annotations

from linattn.models import MIXERS, LMConfig

HYBRID = ("kda", "kda", "kda", "softmax")  # Kimi-Linear-style: three KDA blocks, one softmax block
ZOOLOGY = ("conv", "deltanet")  # the MQAR models: a gated short convolution, then the mechanism
# One block of every mixer, the hybrid, and a gated convolution in front of a mechanism.
CASES = [(name,) for name in MIXERS] + [HYBRID, ZOOLOGY]
IDS = [c[0] if len(c) == 1 else "hybrid" if c == HYBRID else "conv+deltanet" for c in CASES]


def tiny_config(mixers, **overrides) -> LMConfig:
    kwargs = dict(vocab_size=37, d_model=32, n_heads=2, mixers=mixers, chunk_size=8, taylor_dim=4)
    kwargs.update(overrides)
    return LMConfig(**kwargs)
