"""fla's HGRN: ``fused_recurrent_hgrn``, the element-wise gated recurrence h_t = exp(g_t) h_{t-1}
+ x_t, o_t = h_t (x, g [B, T, D]).

It is linear attention with one head per channel d and K = V = 1 (q = k = 1, v = x[d], the
scalar decay g[d], scale 1): linattn's scalar-decay recurrence (spec section 10), exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core


def fused_recurrent_hgrn(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_hgrn``: h_t = exp(g_t) h_{t-1} + x_t, per channel; states [N, D]."""
    for name, t in (("x", x), ("g", g)):
        _core.check_tensor(name, t)
        if t.dim() != 3 or t.shape != x.shape:
            raise ValueError(f"{name} must have shape [B, T, D] as x, got {tuple(t.shape)}")
    _core.check_varlen(x, initial_state, cu_seqlens, "[N, D]")
    ones = torch.ones_like(x, dtype=_core.promote(x, g)).unsqueeze(-1)  # q = k = 1: [B, T, D, 1]
    S0 = None if initial_state is None else initial_state[..., None, None]  # [N, D, 1, 1]
    o, S = _core.run(
        ones, ones, x.unsqueeze(-1), delta=False, mode="recurrent", g=g, scale=1.0,
        initial_state=S0, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    return o.squeeze(-1), None if S is None else S[..., 0, 0]  # [B, T, D], [N, D]
