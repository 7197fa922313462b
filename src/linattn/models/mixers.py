"""``build_mixer(name, config)``: the mixer of one block, from its name in ``LMConfig.mixers``."""

from __future__ import annotations

from collections.abc import Callable

from linattn import registry
from linattn.layers import (
    RWKV7,
    Comba,
    DeltaNet,
    GatedAttention,
    GatedConvolution,
    GatedDeltaNet,
    GatedDeltaNet2,
    GatedDeltaProduct,
    GatedLinearAttention,
    KimiDeltaAttention,
    LinearAttention,
    LogLinearMamba2,
    Mamba2,
    MultiHeadLatentAttention,
    RuleMixer,
    SoftmaxAttention,
    TokenMixer,
)
from linattn.layers.options import chunk_option, delta_options, dt_options, recurrent_options
from linattn.models.config import AUXILIARY_MIXERS, MIXERS, LMConfig, known_mixers


def _rwkv7(c: LMConfig, index: int | None) -> RWKV7:
    """RWKV-7 as fla builds it (its LoRA widths, K = d_model / n_heads); the model's first rwkv7
    block (or a block built alone, ``index`` None) makes the values the later ones mix in."""
    first = index is None or index == c.mixers.index("rwkv7")
    return RWKV7(c.d_model, c.n_heads, c.head_dim, first_layer=first, **chunk_option(c))


# name -> builder; "linear", "taylor" and "scalar_decay" are one class, configured.
_BUILDERS: dict[str, Callable[[LMConfig], TokenMixer]] = {
    "softmax": lambda c: SoftmaxAttention(
        c.d_model,
        c.n_heads,
        c.head_size,
        rope=c.rope,
        rope_base=c.rope_base,
        short_conv=c.softmax_short_conv,
        conv_size=c.conv_size,
    ),
    "linear": lambda c: LinearAttention(
        c.d_model, c.n_heads, feature_map="elu_plus_one", normalize=True, **recurrent_options(c)
    ),
    "taylor": lambda c: LinearAttention(
        c.d_model,
        c.n_heads,
        key_dim=c.taylor_dim,
        feature_map="taylor",
        normalize=True,
        **recurrent_options(c),
    ),
    "scalar_decay": lambda c: LinearAttention(
        c.d_model,
        c.n_heads,
        feature_map="identity",
        decay="scalar",
        **recurrent_options(c),
        **dt_options(c),
    ),
    # GLA as its paper and fla define it: keys d_model / 2 wide over the heads (expand_k 0.5)
    "gla": lambda c: GatedLinearAttention(
        c.d_model, c.n_heads, gate_low_rank_dim=c.gate_rank, **recurrent_options(c)
    ),
    "deltanet": lambda c: DeltaNet(c.d_model, c.n_heads, **delta_options(c)),
    "gated_deltanet": lambda c: GatedDeltaNet(
        c.d_model, c.n_heads, expand_v=c.expand_v, num_v_heads=c.num_v_heads, **delta_options(c)
    ),
    "kda": lambda c: KimiDeltaAttention(
        c.d_model, c.n_heads, num_v_heads=c.num_v_heads, **delta_options(c)
    ),
    "deltaproduct": lambda c: GatedDeltaProduct(
        c.d_model,
        c.n_heads,
        expand_v=c.expand_v,
        num_v_heads=c.num_v_heads,
        num_householder=c.num_householder,
        use_forget_gate=c.forget_gate,
        **delta_options(c),
    ),  # fmt: skip
    "mla": lambda c: MultiHeadLatentAttention(
        c.d_model,
        c.n_heads,
        kv_lora_rank=c.kv_lora_rank,
        q_lora_rank=c.q_lora_rank,
        qk_nope_head_dim=c.head_size,
        qk_rope_head_dim=c.qk_rope_head_dim,
        v_head_dim=c.head_size,
        rope=c.rope,
        rope_base=c.rope_base,
        norm_eps=c.norm_eps,
        **chunk_option(c),
    ),
    "gated_attention": lambda c: GatedAttention(
        c.d_model,
        c.n_heads,
        c.head_size,
        num_key_value_heads=c.num_key_value_heads,
        partial_rotary_factor=c.partial_rotary_factor if c.rope else 0.0,
        rope_base=c.rope_base,
        norm_eps=c.norm_eps,
        **chunk_option(c),
    ),
    "mamba2": lambda c: Mamba2(
        c.d_model,
        c.state_size,
        c.conv_size,
        c.expand,
        c.mamba2_head_dim,
        c.n_groups,
        norm_eps=c.norm_eps,
        **chunk_option(c),
        **(
            {}
            if c.dt_init_range is None
            else dict(zip(("dt_min", "dt_max"), c.dt_init_range, strict=True))
        ),
    ),
    "rwkv7": lambda c: _rwkv7(c, None),
    "comba": lambda c: Comba(
        c.d_model, c.n_heads, expand_v=c.expand_v, num_v_heads=c.num_v_heads, **recurrent_options(c)
    ),
    "gdn2": lambda c: GatedDeltaNet2(
        c.d_model, c.n_heads, num_v_heads=c.num_v_heads, **delta_options(c)
    ),
    "log_linear_mamba2": lambda c: LogLinearMamba2(
        c.d_model,
        c.state_size,
        c.conv_size,
        c.expand,
        c.mamba2_head_dim,
        c.n_groups,
        norm_eps=c.norm_eps,
        **chunk_option(c),
    ),  # fmt: skip
    "conv": lambda c: GatedConvolution(c.d_model, c.gated_conv_size, **chunk_option(c)),
}
assert tuple(_BUILDERS) == MIXERS + AUXILIARY_MIXERS


def build_mixer(name: str, config: LMConfig, index: int | None = None) -> TokenMixer:
    """The token mixer called ``name`` (one of ``MIXERS``, ``"conv"`` or a registered mechanism's
    mixer name, ``linattn.registry``) with the sizes of
    ``config``; ``index``: its block in ``config.mixers`` (RWKV-7's first block differs).

    A registered mechanism's mixer is its layer's ``from_config(config)`` where the layer defines
    one; otherwise ``layer(d_model, n_heads, **recurrent_options(config))``, or, without a layer,
    ``linattn.layers.RuleMixer`` of its rule and gate."""
    if name == "rwkv7":
        return _rwkv7(config, index)
    if name in _BUILDERS:
        return _BUILDERS[name](config)
    entry = registry.with_mixer(name)
    layer = None if entry is None else entry.layer
    if layer is not None and hasattr(layer, "from_config"):
        # a layer that reads the config itself (MesaNet, PaTH, FoX, log-linear Gated DeltaNet)
        return layer.from_config(config)
    if entry is None or entry.rule is None:
        raise ValueError(f"unknown mixer {name!r}; choose from {known_mixers()}")
    if layer is not None:  # the user's own layer, built with the config's sizes
        return layer(config.d_model, config.n_heads, **recurrent_options(config))
    return RuleMixer(
        config.d_model, config.n_heads, rule=entry.rule, gate=entry.gate,
        **recurrent_options(config), **dt_options(config),
    )  # fmt: skip
