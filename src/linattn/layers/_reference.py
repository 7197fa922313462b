"""Helpers of the ``from_fla`` / ``from_transformers`` classmethods: copy a reference layer's
weights into ours, refusing what our layer does not compute."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def check_type(module: object, class_name: str, library: str) -> None:
    """A TypeError unless ``module`` is an instance of a class called ``class_name``."""
    if type(module).__name__ != class_name:
        raise TypeError(f"module must be {library}'s {class_name}, got {type(module).__name__}")


def require(module: nn.Module, **expected: object) -> None:
    """A ValueError naming the first attribute of ``module`` that differs from ``expected``."""
    for name, want in expected.items():
        got = getattr(module, name, None)
        if got != want:
            raise ValueError(
                f"{type(module).__name__}.{name} = {got!r} is not supported (only {want!r})"
            )


def fla_short_conv(module: nn.Module) -> Tensor | None:
    """fla's three short convolutions (``q_conv1d``, ``k_conv1d``, ``v_conv1d``, weights
    [C, 1, kernel] each, no bias, SiLU) as our one convolution over [q | k | v]; None without
    them."""
    if not module.use_short_conv:
        return None
    convs = (module.q_conv1d, module.k_conv1d, module.v_conv1d)
    if any(c.bias is not None or c.activation not in ("silu", "swish") for c in convs):
        raise ValueError(
            f"{type(module).__name__}: only fla's short convolutions without bias, with SiLU, "
            "are supported"
        )
    return torch.cat([conv.weight for conv in convs], dim=0)  # [C_q + C_k + C_v, 1, kernel]


def load_fla(layer: nn.Module, module: nn.Module, weights: dict[str, Tensor], gate: bool):
    """``load`` fla's q, k, v and output projections, its output gate's ``g_proj`` (``gate``)
    and its three short convolutions into ``layer``, with ``weights``: the layer's others."""
    weights = {
        "q_proj.weight": module.q_proj.weight,
        "k_proj.weight": module.k_proj.weight,
        "v_proj.weight": module.v_proj.weight,
        "o_proj.weight": module.o_proj.weight,
        **weights,
    }
    if gate:
        weights["g_proj.weight"] = module.g_proj.weight
    conv = fla_short_conv(module)
    if conv is not None:
        weights["conv.weight"] = conv
    return load(layer, weights, module.q_proj.weight)


def load(layer: nn.Module, weights: dict[str, Tensor], like: Tensor) -> nn.Module:
    """Move ``layer`` to the device and dtype of ``like`` and load ``weights`` (every parameter
    and buffer of ``layer`` named, no other: ``strict``)."""
    layer.to(device=like.device, dtype=like.dtype)
    layer.load_state_dict({k: v.detach() for k, v in weights.items()}, strict=True)
    return layer
