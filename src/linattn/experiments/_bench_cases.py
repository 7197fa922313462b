"""The mechanisms `linattn bench` times: their inputs, their calls and their section-9 cost.

Every mechanism of the registry (``linattn.registry``) is one call of its public op on float32
inputs laid out [B, T, H, D], made by its entry's case (``linattn.registry.cases``). Operation
counts come from the section-9 cost model (``linattn.reference.costs``), by the case's cost family:

- "linear" (the additive rule, gated or not): ``linear_training_ops(T, K, V, C)``;
- "delta" (the delta rule; DeltaProduct over its T n_h write rows): ``delta_training_ops``;
- "dplr" (the generalized delta rule): ``dplr_training_ops``;
- "softmax": ``softmax_training_ops(T, K)`` = 4 T^2 K, the full (unmasked) count of the
  spec; a causal kernel that skips the masked half does about half of it;

per head, times B H. The decays add only elementwise work, so a decayed mechanism is counted as its
base mechanism (its efficiency is then the fraction of the base mechanism's matrix-product rate).
Forward plus backward is counted as 3 times the forward (each product of the forward pass has two
products of the same size in the backward pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor

from linattn import registry
from linattn.reference.costs import (
    delta_training_ops,
    dplr_training_ops,
    linear_training_ops,
    softmax_training_ops,
)
from linattn.registry import Entry as Mechanism

BACKWARD_FACTOR = 3  # forward + backward = 3 x forward (see the module docstring)
_TRAINING_OPS = {
    "linear": linear_training_ops,
    "delta": delta_training_ops,
    "dplr": dplr_training_ops,
}


def mechanisms() -> tuple[Mechanism, ...]:
    """The registry's mechanisms, in its order (a user's registrations included)."""
    return registry.mechanisms()


def by_name(name: str) -> Mechanism:
    """The registry entry ``name``."""
    return registry.get(name)


def quadratic(mech: Mechanism) -> bool:
    """Whether the mechanism has no fixed memory (softmax attention): its cost grows as T^2,
    so that the bench caps its T and times its one form alone."""
    return mech.case.cost == "softmax"


def make_inputs(
    mech: Mechanism, B: int, T: int, H: int, K: int, V: int, seed: int = 0
) -> dict[str, Tensor]:
    """Random float32 inputs [B, T, H, D] of the kind the mechanism is trained with (its case's:
    unit keys, write strengths and log-decays of a trained model's range), without an initial
    state."""
    import torch

    inputs = mech.case.inputs(B, T, H, K, V, seed=seed, dtype=torch.float32)
    inputs.pop("S0", None)
    return {n: x for n, x in inputs.items() if x is not None and not n.startswith("S0_")}


def call(mech: Mechanism, inputs: dict[str, Tensor], mode: str, chunk_size: int) -> Tensor:
    """The mechanism's output o [B, T, H, V] on ``inputs`` (the form ``mode``)."""
    # the key width (HGRN2's case has q and a forget gate f, HGRN's v and g only)
    K = next(inputs[n] for n in ("k", "q", "v") if n in inputs).shape[-1]
    return mech.case.call(_with_gate(inputs), mode, chunk_size, default_scale(K))[0]


def _with_gate(inputs: dict[str, Tensor]) -> dict:
    """``inputs`` with g and S0 as None where absent (the cases read them by name)."""
    return {"g": None, "S0": None, **inputs}


def forward_ops(mech: Mechanism, B: int, T: int, H: int, K: int, V: int, chunk_size: int) -> int:
    """Section-9 operations of one forward pass over B H heads (see the module docstring).

    The cost model has one head dimension d for the values; K = V here, and r = K features.
    """
    C = min(chunk_size, T)
    if quadratic(mech):
        return B * H * softmax_training_ops(T, K)
    rows = T * mech.case.rows_per_token
    return B * H * _TRAINING_OPS[mech.case.cost](rows, K, V, min(C, rows))


# ---------------------------------------------------------------------------------------------
# The established library's pure-PyTorch chunked references (optional: fla-core).


def fla_reference(mech: Mechanism) -> Callable[[dict[str, Tensor], int], Tensor] | None:
    """The fla-core pure-PyTorch chunked reference for ``mech``, or None (not installed / none).

    The returned callable takes our inputs and a chunk size and returns o [B, T, H, V]; the layout
    changes it needs are made on its own inputs, which ``prepare_fla`` builds outside the timing.
    """
    loader = _FLA_NAIVE.get(mech.name)
    if loader is None:
        return None
    try:
        return loader()
    except ImportError:  # fla-core (or triton, which its import needs) is not installed
        return None


def _fla_linear():
    from fla.ops.linear_attn.naive import naive_chunk_linear_attn

    return lambda x, C: naive_chunk_linear_attn(x["q"], x["k"], x["v"])


def _fla_scalar_decay():
    from fla.ops.simple_gla.naive import naive_chunk_simple_gla

    return lambda x, C: naive_chunk_simple_gla(x["q"], x["k"], x["v"], x["g"], chunk_size=C)[0]


def _fla_delta():
    from fla.ops.delta_rule.naive import delta_rule_chunkwise

    # [B, H, T, D] layout (prepared outside the timing); the scale 1/sqrt(K) is its own.
    return lambda x, C: delta_rule_chunkwise(
        x["q_bh"], x["k_bh"], x["v_bh"], x["beta_bh"], chunk_size=C
    )[0].transpose(1, 2)


def _fla_gated_delta():
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule

    return lambda x, C: naive_chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=C
    )[0]


def _fla_kda():
    from fla.ops.kda.naive import naive_chunk_kda

    return lambda x, C: naive_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=C)[0]


# The mechanisms whose fla-core naive chunked function the bench times against ours.
_FLA_NAIVE = {
    "linear": _fla_linear,
    "scalar_decay": _fla_scalar_decay,
    "delta": _fla_delta,
    "gated_delta": _fla_gated_delta,
    "kda": _fla_kda,
}


def prepare_fla(inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our inputs plus contiguous [B, H, T, D] copies for the references that take that layout."""
    extra = {f"{name}_bh": x.transpose(1, 2).contiguous() for name, x in inputs.items()}
    return {**inputs, **extra}


def default_scale(K: int) -> float:
    """1 / sqrt(K): the scale both libraries use when none is given."""
    return 1.0 / math.sqrt(K)
