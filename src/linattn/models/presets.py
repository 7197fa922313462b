"""``LMConfig`` presets named after the models, at small sizes (a CPU trains them).

    preset("mamba2")    4 Mamba-2 blocks, no MLP (Dao and Gu, 2024): 8 heads of 64, N = 64
    preset("gla")       4 GLA blocks + SwiGLU MLPs (Yang et al., 2024a): keys d/2, no short conv
    preset("deltanet")  4 DeltaNet blocks + SwiGLU MLPs (Yang et al., 2024b): short conv, no
                        output gate

Each keeps its model's block and its layer's defaults (fla's, the papers') at d_model = 256:
Mamba-2's language models stack the mixer alone (``mlp=False``, expand 2, head dim 64), GLA's and
DeltaNet's alternate the mixer with a SwiGLU MLP; every norm's epsilon is 1e-5 as theirs.
"""

from __future__ import annotations

from linattn.models.config import LMConfig

# name -> the LMConfig fields of the preset (vocab_size and any field can be overridden).
PRESETS: dict[str, dict] = {
    "mamba2": dict(
        d_model=256,
        n_heads=8,  # head dim expand * d_model / n_heads = 64, Mamba-2's
        mixers=("mamba2",) * 4,
        mlp=False,
        state_size=64,
        expand=2,
        n_groups=1,
        norm_eps=1e-5,
    ),
    "gla": dict(
        d_model=256,
        n_heads=4,  # keys 256 / 2 / 4 = 32 per head, values 64
        mixers=("gla",) * 4,
        short_conv=False,
        norm_eps=1e-5,
    ),
    "deltanet": dict(
        d_model=256,
        n_heads=4,
        mixers=("deltanet",) * 4,
        output_gate=False,  # fla's DeltaNet: use_gate=False
        norm_eps=1e-5,
    ),
}


def preset(name: str, vocab_size: int = 256, **overrides) -> LMConfig:
    """The ``LMConfig`` of the preset ``name`` (one of ``PRESETS``), fields overridden by
    ``overrides``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {tuple(PRESETS)}")
    return LMConfig(**{"vocab_size": vocab_size, **PRESETS[name], **overrides})
