"""``LMConfig`` presets named after the models, at small sizes (a CPU trains them).

    preset("kimi_linear")     3 KDA : 1 MLA with NoPE, twice (Kimi Team, 2025)
    preset("qwen3_next")      3 Gated DeltaNet (grouped value heads) : 1 gated attention, twice
    preset("gated_deltanet")  4 Gated DeltaNet blocks, values twice as wide as keys (Yang et al.)
    preset("mamba2")          4 Mamba-2 blocks, no MLP (Dao and Gu, 2024): 8 heads of 64, N = 64
    preset("gla")             4 GLA blocks + SwiGLU MLPs (Yang et al., 2024a): keys d/2, no
                              short convolution
    preset("deltanet")        4 DeltaNet blocks + SwiGLU MLPs (Yang et al., 2024b): short
                              convolution, no output gate

Each preset keeps its model's layout and ratios at a small width: Kimi Linear's MLA has a latent
of rank 4 D and D / 2 shared key channels (512 and 64 for D = 128), Qwen3-Next has twice as many
value heads as key heads in its delta-rule layers, one key/value head per group of query heads and
a quarter of each head rotated in its attention layers (our presets share one ``head_dim`` between
the two kinds of layers; Qwen3-Next's attention heads are twice as wide as its delta-rule heads).

``softmax_counterpart(config)`` is the all-attention model the memory comparison divides by: every
block replaced by the preset's attention block (``"softmax"`` when it has none), the sizes kept.

The last three keep their model's block and its layer's defaults (fla's, the papers') at
d_model = 256: Mamba-2's language models stack the mixer alone (``mlp=False``, expand 2, head dim
64), GLA's and DeltaNet's alternate the mixer with a SwiGLU MLP; every norm's epsilon is 1e-5 as
theirs.
"""

from __future__ import annotations

from dataclasses import replace

from linattn.models.config import ATTENTION_MIXERS, LMConfig

# name -> the LMConfig fields of the preset (vocab_size and any field can be overridden).
PRESETS: dict[str, dict] = {
    "kimi_linear": dict(
        d_model=256,
        n_heads=4,
        head_dim=64,
        mixers=("kda", "kda", "kda", "mla") * 2,
        kv_lora_rank=256,
        qk_rope_head_dim=32,
        rope=False,  # NoPE in the MLA layers
    ),
    "qwen3_next": dict(
        d_model=256,
        n_heads=4,
        head_dim=64,
        mixers=("gated_deltanet", "gated_deltanet", "gated_deltanet", "gated_attention") * 2,
        expand_v=1.0,  # Qwen3-Next: key and value heads of 128; twice as many value heads
        num_v_heads=8,
        num_key_value_heads=1,
        partial_rotary_factor=0.25,
    ),
    "gated_deltanet": dict(
        d_model=256,
        n_heads=2,
        head_dim=96,  # fla: num_heads * head_dim = 0.75 hidden_size
        mixers=("gated_deltanet",) * 4,
        expand_v=2.0,
    ),
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


def softmax_counterpart(config: LMConfig) -> LMConfig:
    """The same model with every block the config's attention block (its first attention mixer;
    ``"softmax"`` when it has none)."""
    attention = next((m for m in config.mixers if m in ATTENTION_MIXERS), "softmax")
    return replace(config, mixers=(attention,) * len(config.mixers))
