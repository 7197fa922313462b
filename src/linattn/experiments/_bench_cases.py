"""The mechanisms `linattn bench` times: their inputs, their calls and their section-9 cost.

Each mechanism of the mechanism table (docs/design.md) is one call of a public op on float32
inputs laid out [B, T, H, D]. Operation counts come from the section-9 cost model
(``linattn.reference.costs``):

- linear attention, scalar decay and per-channel decay (GLA): ``linear_training_ops(T, K, V, C)``;
- the delta rule, Gated DeltaNet and KDA: ``delta_training_ops(T, K, V, C)``;
- softmax attention: ``softmax_training_ops(T, K)`` = 4 T^2 K, the full (unmasked) count of the
  spec; a causal kernel that skips the masked half does about half of it;

per head, times B H. The decays add only elementwise work, so a decayed mechanism is counted as its
base mechanism (its efficiency is then the fraction of the base mechanism's matrix-product rate).
Forward plus backward is counted as 3 times the forward (each product of the forward pass has two
products of the same size in the backward pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.ops import delta_rule, linear_attention
from linattn.reference.costs import (
    delta_training_ops,
    linear_training_ops,
    softmax_training_ops,
)

BACKWARD_FACTOR = 3  # forward + backward = 3 x forward (see the module docstring)


@dataclass(frozen=True)
class Mechanism:
    """One row family of the benchmark: name, which op, which gate and which cost formula."""

    name: str
    title: str
    family: str  # "softmax", "linear" or "delta": the op and the cost formula
    gate: str | None  # None, "scalar" ([B, T, H]) or "channel" ([B, T, H, K])


MECHANISMS = (
    Mechanism("softmax", "softmax attention (SDPA, causal)", "softmax", None),
    Mechanism("linear", "linear attention", "linear", None),
    Mechanism("scalar_decay", "linear attention, scalar decay (Mamba-2)", "linear", "scalar"),
    Mechanism("gla", "linear attention, per-channel decay (GLA)", "linear", "channel"),
    Mechanism("delta", "delta rule (DeltaNet)", "delta", None),
    Mechanism("gated_delta", "gated delta rule (Gated DeltaNet)", "delta", "scalar"),
    Mechanism("kda", "Kimi Delta Attention", "delta", "channel"),
)
BY_NAME = {m.name: m for m in MECHANISMS}


def make_inputs(
    mech: Mechanism, B: int, T: int, H: int, K: int, V: int, seed: int = 0
) -> dict[str, Tensor]:
    """Random float32 inputs [B, T, H, D] of the kind the mechanism is trained with.

    Keys are unit vectors (as DeltaNet's l2-normalised keys), beta = sigmoid(normal) in (0, 1),
    log-decays g = log sigmoid(normal + 4) in about [-0.1, 0] (alpha near one, as trained).
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    inputs = {"q": q, "k": k, "v": v}
    if mech.family == "delta":
        inputs["beta"] = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    if mech.gate is not None:
        shape = (B, T, H) if mech.gate == "scalar" else (B, T, H, K)
        inputs["g"] = F.logsigmoid(torch.randn(*shape, generator=gen) + 4.0)
    return inputs


def call(mech: Mechanism, inputs: dict[str, Tensor], mode: str, chunk_size: int) -> Tensor:
    """The mechanism's output o [B, T, H, V] on ``inputs`` (the form ``mode``)."""
    if mech.family == "softmax":
        # [B, T, H, D] -> [B, H, T, D] views: SDPA's layout.
        q, k, v = (inputs[x].transpose(1, 2) for x in "qkv")
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    g = inputs.get("g")
    if mech.family == "linear":
        return linear_attention(
            inputs["q"], inputs["k"], inputs["v"], g, mode=mode, chunk_size=chunk_size
        )[0]
    return delta_rule(
        inputs["q"], inputs["k"], inputs["v"], inputs["beta"], g, mode=mode, chunk_size=chunk_size
    )[0]


def forward_ops(mech: Mechanism, B: int, T: int, H: int, K: int, V: int, chunk_size: int) -> int:
    """Section-9 operations of one forward pass over B H heads (see the module docstring).

    The cost model has one head dimension d for the values; K = V here, and r = K features.
    """
    C = min(chunk_size, T)
    if mech.family == "softmax":
        per_head = softmax_training_ops(T, K)
    elif mech.family == "linear":
        per_head = linear_training_ops(T, K, V, C)
    else:
        per_head = delta_training_ops(T, K, V, C)
    return B * H * per_head


# ---------------------------------------------------------------------------------------------
# The established library's pure-PyTorch chunked references (optional: fla-core).


def fla_reference(mech: Mechanism) -> Callable[[dict[str, Tensor], int], Tensor] | None:
    """The fla-core pure-PyTorch chunked reference for ``mech``, or None (not installed / none).

    The returned callable takes our inputs and a chunk size and returns o [B, T, H, V]; the layout
    changes it needs are made on its own inputs, which ``prepare_fla`` builds outside the timing.
    """
    try:
        if mech.name == "linear":
            from fla.ops.linear_attn.naive import naive_chunk_linear_attn

            return lambda x, C: naive_chunk_linear_attn(x["q"], x["k"], x["v"])
        if mech.name == "scalar_decay":
            from fla.ops.simple_gla.naive import naive_chunk_simple_gla

            return lambda x, C: naive_chunk_simple_gla(
                x["q"], x["k"], x["v"], x["g"], chunk_size=C
            )[0]
        if mech.name == "delta":
            from fla.ops.delta_rule.naive import delta_rule_chunkwise

            # [B, H, T, D] layout (prepared outside the timing); the scale 1/sqrt(K) is its own.
            return lambda x, C: delta_rule_chunkwise(
                x["q_bh"], x["k_bh"], x["v_bh"], x["beta_bh"], chunk_size=C
            )[0].transpose(1, 2)
        if mech.name == "gated_delta":
            from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule

            return lambda x, C: naive_chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=C
            )[0]
        if mech.name == "kda":
            from fla.ops.kda.naive import naive_chunk_kda

            return lambda x, C: naive_chunk_kda(
                x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=C
            )[0]
    except ImportError:  # fla-core (or triton, which its import needs) is not installed
        return None
    return None


def prepare_fla(inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our inputs plus contiguous [B, H, T, D] copies for the references that take that layout."""
    extra = {f"{name}_bh": x.transpose(1, 2).contiguous() for name, x in inputs.items()}
    return {**inputs, **extra}


def default_scale(K: int) -> float:
    """1 / sqrt(K): the scale both libraries use when none is given."""
    return 1.0 / math.sqrt(K)
