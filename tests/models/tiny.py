"""Tiny model configurations shared by the model tests."""

from __future__ import annotations

import torch

from linattn import registry
from linattn.models import MIXERS, CausalLM, LMConfig

HYBRID = ("kda", "kda", "kda", "softmax")  # Kimi-Linear-style: three KDA blocks, one softmax block
ZOOLOGY = ("conv", "deltanet")  # the MQAR models: a gated short convolution, then the mechanism
# The mixers of the registry's entries that ``build_mixer`` builds from the registry (their
# layers' ``from_config``): log-linear Gated DeltaNet, MesaNet, PaTH, FoX.
REGISTERED = tuple(m for m in registry.mixers() if m not in MIXERS)
# One block of every mixer, the hybrid, and a gated convolution in front of a mechanism.
CASES = [(name,) for name in MIXERS + REGISTERED] + [HYBRID, ZOOLOGY]
IDS = [c[0] if len(c) == 1 else "hybrid" if c == HYBRID else "conv+deltanet" for c in CASES]


def tiny_config(mixers, **overrides) -> LMConfig:
    kwargs = dict(vocab_size=37, d_model=32, n_heads=2, mixers=mixers, chunk_size=8, taylor_dim=4)
    kwargs.update(overrides)
    return LMConfig(**kwargs)


def make_model(mixers, dtype=torch.float64, seed=0, **overrides) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(tiny_config(mixers, **overrides)).to(dtype)
    # Larger weights than the init's 0.02, so that every mixer matters to the logits.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(10.0)
    return model
