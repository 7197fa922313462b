"""PyTorch ops: softmax attention, linear attention and the delta-rule family (spec sections 2-8).

Layout [B, T, H, D]; states [B, H, K, V]. Each op has the forms "parallel", "recurrent" and
"chunk", which agree to rounding and are tested against ``linattn.reference.gated.recurrence``.
"""

from linattn.ops.delta_rule import delta_rule
from linattn.ops.linear_attention import linear_attention

__all__ = ["delta_rule", "linear_attention"]
