"""PyTorch ops: softmax attention, linear attention and the delta-rule family (spec sections 2-8).

Layout [B, T, H, D]; states [B, H, K, V]. Each op has the forms "parallel", "recurrent" and
"chunk", which agree to rounding and are tested against ``linattn.reference.gated.recurrence``.

``linattn.ops.checks`` holds their input checks, public so that code built on the ops checks the
same arguments the same way: the context-parallel ops (``linattn.distributed``) before their
collectives, the layers and ``LMConfig`` their yes/no options (``checks.flag``).

``backend("auto" | "fla" | "torch" | "native")`` (``linattn.ops.backends``) chooses, for the ops
called inside it, between fla's Triton kernels (by default on CUDA tensors), linattn's fused CPU
kernels and its PyTorch loop.
"""

from linattn.ops.affine import chunk_affine_map
from linattn.ops.backends import backend
from linattn.ops.delta_product import delta_product_step, gated_delta_product
from linattn.ops.delta_rule import delta_rule
from linattn.ops.dplr_family import comba, gated_deltanet2, rwkv7
from linattn.ops.generalized_delta_rule import generalized_delta_rule
from linattn.ops.linear_attention import linear_attention
from linattn.ops.log_linear import (
    LogLinearState,
    log_linear_attention,
    log_linear_state,
    log_linear_step,
)
from linattn.ops.rule_attention import rule_attention, rule_step
from linattn.ops.rwkv6 import rwkv6
from linattn.ops.slots import abc_attention, abc_step, gated_slot_attention, slot_step
from linattn.ops.softmax import softmax_attention
from linattn.ops.step import recurrent_step

__all__ = [
    "abc_attention",
    "abc_step",
    "backend",
    "chunk_affine_map",
    "comba",
    "delta_product_step",
    "delta_rule",
    "gated_delta_product",
    "gated_deltanet2",
    "gated_slot_attention",
    "generalized_delta_rule",
    "linear_attention",
    "LogLinearState",
    "log_linear_attention",
    "log_linear_state",
    "log_linear_step",
    "recurrent_step",
    "rule_attention",
    "rule_step",
    "rwkv6",
    "rwkv7",
    "slot_step",
    "softmax_attention",
]
