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


def _copy(target: Tensor, source: Tensor, name: str) -> None:
    """target <- source, which must have the same number of elements (reshaped to target's)."""
    if target.numel() != source.numel():
        raise ValueError(
            f"{name}: {tuple(source.shape)} cannot fill our {tuple(target.shape)}; "
            "was the module built with other sizes?"
        )
    with torch.no_grad():
        target.copy_(source.detach().reshape(target.shape))


def _check_type(module: nn.Module, name: str) -> None:
    if type(module).__name__ != name:
        raise TypeError(f"module must be transformers' {name}, got {type(module).__name__}")


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
    for target, source, name in pairs:
        _copy(target, source, name)
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
    for target, source, name in pairs:
        _copy(target, source, name)
    return layer
