"""Our layers built with the weights of transformers' (and fla's) layers, so that "equal" is a test.

Each function reads the sizes of the other library's module, builds our layer with them, and
copies every weight (no weight is left at its initialisation: a missing one is an error). The
classmethods ``GatedDeltaNet.from_transformers``, ``KimiDeltaAttention.from_transformers``,
``MultiHeadLatentAttention.from_transformers`` and ``GatedAttention.from_transformers`` call them;
the other library is only read, never imported here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linattn.layers._reference import fla_short_conv


def _copy(target: Tensor, source: Tensor, name: str) -> None:
    """target <- source, which must have the same number of elements (reshaped to target's)."""
    if target.numel() != source.numel():
        raise ValueError(
            f"{name}: {tuple(source.shape)} cannot fill our {tuple(target.shape)}; "
            "was the module built with other sizes?"
        )
    with torch.no_grad():
        target.copy_(source.detach().reshape(target.shape))


def _copy_all(pairs: list[tuple[Tensor, Tensor, str]]) -> None:
    """``_copy`` each (ours, theirs, their name)."""
    for target, source, name in pairs:
        _copy(target, source, name)


def _check_type(module: nn.Module, name: str, library: str = "transformers") -> None:
    """A TypeError unless ``module`` is ``library``'s class ``name`` (ours may share the name)."""
    kind = type(module)
    if kind.__name__ != name or not kind.__module__.startswith(library + "."):
        raise TypeError(f"module must be {library}'s {name}, got {kind.__module__}.{kind.__name__}")


def _check_activation(module: nn.Module) -> None:
    if getattr(module, "activation", "silu") not in ("silu", "swish"):
        raise ValueError(f"only a SiLU short convolution is supported, got {module.activation!r}")


def _like(layer: nn.Module, module: nn.Module) -> nn.Module:
    """Our layer on the device and in the dtype of ``module``'s first weight."""
    weight = next(module.parameters())
    return layer.to(device=weight.device, dtype=weight.dtype)


def gated_deltanet_from_qwen3_next(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``GatedDeltaNet`` from transformers' ``Qwen3NextGatedDeltaNet``.

    Qwen3-Next packs ``in_proj_qkvz`` per query/key head h: ``[q_h (K), k_h (K), v (G V),
    z (G V)]`` for its G = HV / H value heads, and ``in_proj_ba`` as ``[b (G), a (G)]`` per h; we
    unpack them into ``q_proj``, ``k_proj``, ``v_proj``, ``g_proj`` (z, the output gate),
    ``b_proj`` and the decay's ``a_proj``.
    """
    _check_type(module, "Qwen3NextGatedDeltaNet")
    _check_activation(module)
    H, HV = module.num_k_heads, module.num_v_heads
    K, V = module.head_k_dim, module.head_v_dim
    G = HV // H
    layer = cls(
        module.hidden_size,
        H,
        K,
        expand_v=V / K,
        num_v_heads=HV,
        conv_size=module.conv_kernel_size,
        norm_eps=module.layer_norm_epsilon,
        **kwargs,
    )
    layer = _like(layer, module)
    d = module.hidden_size
    # [H (2K + 2GV), d] -> [H, 2K + 2GV, d] -> q, k: [H, K, d]; v, z: [H, G V, d]
    qkvz = module.in_proj_qkvz.weight.view(H, 2 * K + 2 * G * V, d)
    q, k, v, z = qkvz.split([K, K, G * V, G * V], dim=1)
    ba = module.in_proj_ba.weight.view(H, 2 * G, d)  # [H, 2G, d] -> b, a: [H, G, d]
    b, a = ba.split([G, G], dim=1)
    pairs = [
        (layer.q_proj.weight, q, "q"),
        (layer.k_proj.weight, k, "k"),
        (layer.v_proj.weight, v, "v"),
        (layer.g_proj.weight, z, "z"),
        (layer.b_proj.weight, b, "b"),
        (layer.decay.a_proj.weight, a, "a"),
        (layer.decay.A_log, module.A_log, "A_log"),
        (layer.decay.dt_bias, module.dt_bias, "dt_bias"),
        (layer.conv.weight, module.conv1d.weight, "conv1d.weight"),
        (layer.o_norm.weight, module.norm.weight, "norm.weight"),
        (layer.o_proj.weight, module.out_proj.weight, "out_proj.weight"),
    ]
    _copy_all(pairs)
    if module.conv1d.bias is not None:
        raise ValueError("a short convolution with a bias is not supported")
    return layer


def kda_from_kimi_linear(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``KimiDeltaAttention`` from transformers' ``KimiLinearDeltaAttention`` (H heads, K = V =
    ``head_dim``; the output gate ``g_b_proj`` without bias)."""
    _check_type(module, "KimiLinearDeltaAttention")
    _check_activation(module)
    H, K = module.num_heads, module.head_dim
    kwargs.setdefault("gate_bias", module.g_b_proj.bias is not None)
    layer = cls(
        module.hidden_size,
        H,
        K,
        conv_size=module.conv_kernel_size,
        norm_eps=module.layer_norm_epsilon,
        **kwargs,
    )
    layer = _like(layer, module)
    gate = module.forget_gate
    pairs = [
        (layer.q_proj.weight, module.q_proj.weight, "q_proj"),
        (layer.k_proj.weight, module.k_proj.weight, "k_proj"),
        (layer.v_proj.weight, module.v_proj.weight, "v_proj"),
        (layer.conv.weight, module.conv1d.weight, "conv1d.weight"),
        (layer.decay.a_proj[0].weight, gate.f_a_proj.weight, "forget_gate.f_a_proj"),
        (layer.decay.a_proj[1].weight, gate.f_b_proj.weight, "forget_gate.f_b_proj"),
        (layer.decay.A_log, gate.A_log, "forget_gate.A_log"),
        (layer.decay.dt_bias, gate.dt_bias, "forget_gate.dt_bias"),
        (layer.b_proj.weight, module.b_proj.weight, "b_proj"),
        (layer.g_proj[0].weight, module.g_a_proj.weight, "g_a_proj"),
        (layer.g_proj[1].weight, module.g_b_proj.weight, "g_b_proj"),
        (layer.o_norm.weight, module.o_norm.weight, "o_norm.weight"),
        (layer.o_proj.weight, module.o_proj.weight, "o_proj"),
    ]
    if module.g_b_proj.bias is not None:
        pairs.append((layer.g_proj[1].bias, module.g_b_proj.bias, "g_b_proj.bias"))
    _copy_all(pairs)
    return layer


def mla_from_kimi_linear(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``MultiHeadLatentAttention`` from transformers' ``KimiLinearAttention`` (MLA with NoPE: the
    shared ``k^R`` channels are kept, not rotated)."""
    _check_type(module, "KimiLinearAttention")
    if module.num_key_value_groups != 1:
        raise ValueError("KimiLinearAttention with num_key_value_heads != num_attention_heads")
    kwargs.setdefault("rope", False)
    layer = cls(
        module.hidden_size,
        module.num_heads,
        kv_lora_rank=module.kv_lora_rank,
        q_lora_rank=module.q_lora_rank,
        qk_nope_head_dim=module.qk_nope_head_dim,
        qk_rope_head_dim=module.qk_rope_head_dim,
        v_head_dim=module.v_head_dim,
        attention_bias=module.o_proj.bias is not None,
        norm_eps=module.kv_a_layernorm.variance_epsilon,
        **kwargs,
    )
    layer = _like(layer, module)
    pairs = [
        (layer.kv_a_proj, module.kv_a_proj_with_mqa, "kv_a_proj_with_mqa"),
        (layer.kv_norm, module.kv_a_layernorm, "kv_a_layernorm"),
        (layer.kv_b_proj, module.kv_b_proj, "kv_b_proj"),
        (layer.o_proj, module.o_proj, "o_proj"),
    ]
    if module.q_lora_rank is None:
        pairs.append((layer.q_proj, module.q_proj, "q_proj"))
    else:
        pairs += [
            (layer.q_proj[0], module.q_a_proj, "q_a_proj"),
            (layer.q_proj[1], module.q_a_layernorm, "q_a_layernorm"),
            (layer.q_proj[2], module.q_b_proj, "q_b_proj"),
        ]
    for ours, theirs, name in pairs:
        _copy_module(ours, theirs, name)
    return layer


def gated_attention_from_qwen3_next(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``GatedAttention`` from transformers' ``Qwen3NextAttention``.

    Its ``q_proj`` packs, per head h, ``[q_h (D), z_h (D)]`` (the query, then its output gate);
    we unpack them into ``q_proj`` and ``g_proj``.
    """
    _check_type(module, "Qwen3NextAttention")
    config = module.config
    H, H_kv, D = config.num_attention_heads, config.num_key_value_heads, module.head_dim
    rope = config.rope_parameters
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"only the default RoPE is supported, got {rope['rope_type']!r}")
    layer = cls(
        config.hidden_size,
        H,
        D,
        num_key_value_heads=H_kv,
        partial_rotary_factor=rope.get("partial_rotary_factor", 1.0),
        rope_base=rope["rope_theta"],
        attention_bias=module.q_proj.bias is not None,
        norm_eps=module.q_norm.eps,
        **kwargs,
    )
    layer = _like(layer, module)
    d = config.hidden_size
    q, z = module.q_proj.weight.view(H, 2 * D, d).split([D, D], dim=1)  # [H, D, d] each
    pairs = [(layer.q_proj.weight, q, "q_proj (query)"), (layer.g_proj.weight, z, "q_proj (gate)")]
    if module.q_proj.bias is not None:
        q_bias, z_bias = module.q_proj.bias.view(H, 2 * D).split([D, D], dim=1)
        pairs += [(layer.q_proj.bias, q_bias, "q_proj.bias"), (layer.g_proj.bias, z_bias, "bias")]
    _copy_all(pairs)
    for name in ("k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
        _copy_module(getattr(layer, name), getattr(module, name), name)
    return layer


def _copy_module(ours: nn.Module, theirs: nn.Module, name: str) -> None:
    """Every parameter of ``ours`` from the same-named one of ``theirs`` (weight, bias)."""
    theirs_params = dict(theirs.named_parameters())
    if set(theirs_params) != {n for n, _ in ours.named_parameters()}:
        raise ValueError(f"{name}: parameters {sorted(theirs_params)} do not match ours")
    for n, p in ours.named_parameters():
        _copy(p, theirs_params[n], f"{name}.{n}")


def _fla_pairs(layer: nn.Module, module: nn.Module) -> list[tuple[Tensor, Tensor, str]]:
    """What fla's delta-rule layers and ours share by name: the q, k, v, beta and output
    projections, the output norm, the decay's A_log and dt_bias (where there is a decay), and
    fla's three short convolutions as our one."""
    pairs = [
        (getattr(layer, name).weight, getattr(module, name).weight, name)
        for name in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj")
    ]
    pairs.append((layer.o_norm.weight, module.o_norm.weight, "o_norm.weight"))
    if layer.decay is not None:  # fla's GatedDeltaProduct without its forget gate has none
        pairs.append((layer.decay.A_log, module.A_log, "A_log"))
        pairs.append((layer.decay.dt_bias, module.dt_bias, "dt_bias"))
    conv = fla_short_conv(module)
    if conv is not None:
        pairs.append((layer.conv.weight, conv, "q/k/v_conv1d.weight"))
    return pairs


def _fla_common(module: nn.Module) -> dict:
    return dict(
        expand_v=module.expand_v,
        num_v_heads=module.num_v_heads,
        short_conv=module.use_short_conv,
        conv_size=module.conv_size,
        allow_neg_eigval=module.allow_neg_eigval,
        norm_eps=module.o_norm.eps,
    )


def gated_deltanet_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``GatedDeltaNet`` from fla's ``fla.layers.GatedDeltaNet`` (same names but for the gate:
    fla's ``a_proj`` is our decay's ``a_proj``, its three convolutions our one)."""
    _check_type(module, "GatedDeltaNet", "fla")
    activation = {"swish": "silu", "silu": "silu", "sigmoid": "sigmoid"}
    gate_activation = getattr(module.o_norm, "activation", "swish")
    layer = cls(
        module.hidden_size,
        module.num_heads,
        module.head_k_dim,
        output_gate=module.use_gate,
        gate_activation=activation[gate_activation] if module.use_gate else "silu",
        **_fla_common(module),
        **kwargs,
    )
    layer = _like(layer, module)
    pairs = [
        *_fla_pairs(layer, module),
        (layer.decay.a_proj.weight, module.a_proj.weight, "a_proj"),
    ]
    if module.use_gate:
        pairs.append((layer.g_proj.weight, module.g_proj.weight, "g_proj"))
    _copy_all(pairs)
    return layer


def kda_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``KimiDeltaAttention`` from fla's ``fla.layers.KimiDeltaAttention`` (its output gate has a
    bias: ``gate_bias=True``; ``f_proj`` is our decay's low-rank ``a_proj``)."""
    _check_type(module, "KimiDeltaAttention", "fla")
    if module.lower_bound is not None or module.safe_gate:
        raise ValueError("fla's lower_bound / safe_gate gate clamps are not supported")
    return _kda_family_from_fla(cls, module, (), **kwargs)


def _kda_family_from_fla(cls: type, module: nn.Module, extra: tuple[str, ...], **kwargs):
    """What fla's KDA and GatedDeltaNet2 share: ``_fla_pairs``, the low-rank ``f_proj`` (our
    decay's ``a_proj``) and output gate ``g_proj``; ``extra``: more same-named projections."""
    kwargs.setdefault("gate_bias", module.g_proj[1].bias is not None)
    layer = cls(
        module.hidden_size, module.num_heads, module.head_k_dim, **_fla_common(module), **kwargs
    )
    layer = _like(layer, module)
    pairs = [
        *_fla_pairs(layer, module),
        *((getattr(layer, n).weight, getattr(module, n).weight, n) for n in extra),
        (layer.decay.a_proj[0].weight, module.f_proj[0].weight, "f_proj.0"),
        (layer.decay.a_proj[1].weight, module.f_proj[1].weight, "f_proj.1"),
        (layer.g_proj[0].weight, module.g_proj[0].weight, "g_proj.0"),
        (layer.g_proj[1].weight, module.g_proj[1].weight, "g_proj.1"),
    ]
    if module.g_proj[1].bias is not None:
        pairs.append((layer.g_proj[1].bias, module.g_proj[1].bias, "g_proj.1.bias"))
    _copy_all(pairs)
    return layer


def gated_delta_product_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``GatedDeltaProduct`` from fla's ``fla.layers.GatedDeltaProduct`` (the names of its Gated
    DeltaNet, n_h times wider k, v and beta projections in the same [write, head, channel]
    layout; the forget gate's ``a_proj`` is our decay's)."""
    _check_type(module, "GatedDeltaProduct", "fla")
    gate = module.use_output_gate
    if gate and getattr(module.o_norm, "activation", "swish") not in ("swish", "silu"):
        raise ValueError(f"only a SiLU output gate is supported, got {module.o_norm.activation!r}")
    layer = cls(
        module.hidden_size, module.num_heads, module.head_k_dim, output_gate=gate,
        num_householder=module.num_householder, use_forget_gate=module.use_forget_gate,
        **_fla_common(module), **kwargs,
    )  # fmt: skip
    layer = _like(layer, module)
    pairs = _fla_pairs(layer, module)
    if layer.decay is not None:
        pairs.append((layer.decay.a_proj.weight, module.a_proj.weight, "a_proj"))
    if gate:
        pairs.append((layer.g_proj.weight, module.g_proj.weight, "g_proj"))
    _copy_all(pairs)
    return layer


def _lora_pairs(ours: nn.Module, theirs: nn.Module, name: str) -> list:
    """fla's ``LoRA`` (``lora``: Linear, activation, Linear) into ours (down, act, up, bias);
    the activations must match."""
    act = type(theirs.lora[1]).__name__
    if act != type(ours.act).__name__:
        raise ValueError(f"{name}: activation {act} where ours is {type(ours.act).__name__}")
    if (theirs.lora[2].bias is None) != (ours.bias is None):
        raise ValueError(f"{name}: a LoRA {'without' if ours.bias is not None else 'with'} bias")
    pairs = [
        (ours.down.weight, theirs.lora[0].weight, f"{name}.lora.0"),
        (ours.up.weight, theirs.lora[2].weight, f"{name}.lora.2"),
    ]
    if ours.bias is not None:
        pairs.append((ours.bias, theirs.lora[2].bias, f"{name}.lora.2.bias"))
    return pairs


def rwkv7_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``RWKV7`` from fla's ``fla.layers.RWKV7Attention``: its six ``x_*`` mixes stacked into our
    ``mu``, its LoRAs into ours, ``layer_idx == 0`` as ``first_layer``; its group norm (torch's or
    fla's fused one, affine with bias) into ours. A padding mask is not part of our layer."""
    _check_type(module, "RWKV7Attention", "fla")
    norm = module.g_norm
    if norm.weight is None or norm.bias is None or getattr(norm, "is_rms_norm", False):
        raise ValueError("only RWKV7Attention's affine group norm with bias is supported")
    first = module.layer_idx == 0
    layer = cls(
        module.hidden_size,
        module.num_heads,
        module.head_v_dim,
        first_layer=first,
        decay_rank=module.decay_low_rank_dim,
        a_rank=module.a_low_rank_dim,
        v_rank=module.v_low_rank_dim,
        gate_rank=module.gate_low_rank_dim,
        norm_eps=norm.eps / module.head_dim,
        **kwargs,
    )
    layer = _like(layer, module)
    mu = torch.cat([getattr(module, f"x_{b}").reshape(1, -1) for b in "rwkvag"])  # [6, D]
    pairs = [(layer.mu, mu, "x_r .. x_g")]
    pairs += [(getattr(layer, n), getattr(module, n), n) for n in ("k_k", "k_a", "r_k")]
    pairs += [
        (getattr(layer, n).weight, getattr(module, n).weight, n)
        for n in ("r_proj", "k_proj", "v_proj", "o_proj", "g_norm")
    ]
    pairs.append((layer.g_norm.bias, norm.bias, "g_norm.bias"))
    for name in ("w_lora", "a_lora", "g_lora") + (() if first else ("v_lora",)):
        pairs += _lora_pairs(getattr(layer, name), getattr(module, name), name)
    _copy_all(pairs)
    return layer


def comba_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``Comba`` from fla's ``fla.layers.Comba``: Gated DeltaNet's names, plus its ``decay`` (our
    ``inner_decay``) and ``D``; its sigmoid-gated output norm (or its plain RMSNorm without an
    output gate)."""
    _check_type(module, "Comba", "fla")
    layer = cls(
        module.hidden_size,
        module.num_heads,
        module.head_k_dim,
        expand_v=module.expand_v,
        num_v_heads=module.num_v_heads,
        short_conv=module.use_short_conv,
        conv_size=module.conv_size,
        output_gate=module.use_output_gate,
        inner_decay=module.use_inner_decay,
        output_correction=module.use_output_correction,
        norm_eps=module.o_norm.eps,
        **kwargs,
    )
    layer = _like(layer, module)
    pairs = [*_fla_pairs(layer, module), (layer.decay.a_proj.weight, module.a_proj.weight, "a")]
    if module.use_inner_decay:
        pairs.append((layer.inner_decay, module.decay, "decay"))
    if module.use_output_correction:
        pairs.append((layer.D, module.D, "D"))
    if module.use_output_gate:
        pairs.append((layer.g_proj.weight, module.g_proj.weight, "g_proj"))
    _copy_all(pairs)
    return layer


def gdn2_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``GatedDeltaNet2`` from fla's ``fla.layers.GatedDeltaNet2``: KDA's names, plus the write
    gate's ``w_proj``; ``b_proj`` is the erase gate per key channel."""
    _check_type(module, "GatedDeltaNet2", "fla")
    return _kda_family_from_fla(cls, module, ("w_proj",), **kwargs)


def precond_gated_deltanet_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``PrecondGatedDeltaNet`` from fla's ``fla.layers.PrecondGatedDeltaNet``: Gated
    DeltaNet's weights, and the ATK gate's (``a_atk_proj``, ``A_log_atk``, ``dt_bias_atk``: our
    ``atk_decay``), ``b_atk_proj`` and ``log_atk_scale``."""
    _check_type(module, "PrecondGatedDeltaNet", "fla")
    activation = {"swish": "silu", "silu": "silu", "sigmoid": "sigmoid"}
    gate_activation = getattr(module.o_norm, "activation", "swish")
    layer = cls(
        module.hidden_size,
        module.num_heads,
        module.head_k_dim,
        output_gate=module.use_gate,
        gate_activation=activation[gate_activation] if module.use_gate else "silu",
        squash_x=module.squash_x,
        squash_eps=module.squash_eps,
        **_fla_common(module),
        **kwargs,
    )
    layer = _like(layer, module)
    pairs = [
        *_fla_pairs(layer, module),
        (layer.decay.a_proj.weight, module.a_proj.weight, "a_proj"),
        (layer.atk_decay.a_proj.weight, module.a_atk_proj.weight, "a_atk_proj"),
        (layer.atk_decay.A_log, module.A_log_atk, "A_log_atk"),
        (layer.atk_decay.dt_bias, module.dt_bias_atk, "dt_bias_atk"),
        (layer.b_atk_proj.weight, module.b_atk_proj.weight, "b_atk_proj"),
        (layer.log_atk_scale, module.log_atk_scale, "log_atk_scale"),
    ]
    if module.use_gate:
        pairs.append((layer.g_proj.weight, module.g_proj.weight, "g_proj"))
    _copy_all(pairs)
    return layer


def precond_kda_from_fla(cls: type, module: nn.Module, **kwargs) -> nn.Module:
    """``PrecondKDA`` from fla's ``fla.layers.PrecondKDA``: KDA's weights (``_kda_family_from_fla``)
    and the ATK's (fla's ``a_proj``, ``A_log_atk``, ``dt_bias_atk``: our ``atk_decay``;
    ``b_atk_proj``, ``log_atk_scale``)."""
    _check_type(module, "PrecondKDA", "fla")
    if module.lower_bound is not None or module.safe_gate:
        raise ValueError("fla's lower_bound / safe_gate gate clamps are not supported")
    kwargs.setdefault("squash_x", module.squash_x_val)
    kwargs.setdefault("squash_eps", module.squash_eps)
    layer = _kda_family_from_fla(cls, module, (), **kwargs)
    _copy_all([
        (layer.atk_decay.a_proj.weight, module.a_proj.weight, "a_proj"),
        (layer.atk_decay.A_log, module.A_log_atk, "A_log_atk"),
        (layer.atk_decay.dt_bias, module.dt_bias_atk, "dt_bias_atk"),
        (layer.b_atk_proj.weight, module.b_atk_proj.weight, "b_atk_proj"),
        (layer.log_atk_scale, module.log_atk_scale, "log_atk_scale"),
    ])  # fmt: skip
    return layer
