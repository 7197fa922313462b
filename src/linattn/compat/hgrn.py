"""fla's HGRN: ``chunk_hgrn`` and ``fused_recurrent_hgrn``, the element-wise gated recurrence
h_t = exp(g_t) h_{t-1} + x_t, o_t = h_t (x, g [B, T, D]; Qin et al. 2023, eq. 3-4, in fla's
parametrisation).

It is linear attention with one head per channel d and K = V = 1 (q = k = 1, v = x[d], the
scalar decay g[d], scale 1): linattn's scalar-decay recurrence (spec section 10), exactly.
``hgrn`` runs it in any form; the registry's entry "hgrn" is this reparametrisation.
fla's ``chunk_hgrn`` kernel differentiates the output alone (its final state is o's last row
outside the graph, and it returns no gradient for the initial state); here every gradient is
autograd's (those of fla's naive reference and of its ``fused_recurrent_hgrn``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core


def hgrn(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    mode: str = "recurrent",
    chunk_size: int = _core.CHUNK,
) -> tuple[Tensor, Tensor | None]:
    """HGRN in the form ``mode`` ("parallel", "recurrent" or "chunk"): h_t = exp(g_t) h_{t-1} + x_t
    per channel, o_t = h_t; x, g [B, T, D], states [N, D] (float32, float64 for float64 inputs)."""
    for name, t in (("x", x), ("g", g)):
        _core.check_tensor(name, t)
        if t.dim() != 3 or t.shape != x.shape:
            raise ValueError(f"{name} must have shape [B, T, D] as x, got {tuple(t.shape)}")
    _core.check_varlen(x, initial_state, cu_seqlens, "[N, D]")
    ones = torch.ones_like(x, dtype=_core.promote(x, g)).unsqueeze(-1)  # q = k = 1: [B, T, D, 1]
    S0 = None if initial_state is None else initial_state[..., None, None]  # [N, D, 1, 1]
    o, S = _core.run(
        ones, ones, x.unsqueeze(-1), delta=False, mode=mode, g=g, scale=1.0,
        initial_state=S0, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )  # fmt: skip
    return o.squeeze(-1), None if S is None else S[..., 0, 0]  # [B, T, D], [N, D]


def fused_recurrent_hgrn(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_hgrn``: h_t = exp(g_t) h_{t-1} + x_t, per channel; states [N, D]."""
    return hgrn(x, g, initial_state, output_final_state, cu_seqlens, mode="recurrent")


def chunk_hgrn(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor = None,
    output_final_state: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_hgrn`` (``fla.ops.hgrn`` only): ``fused_recurrent_hgrn`` in chunks of 128
    tokens (fla's block), without packed sequences; states [B, D]."""
    return hgrn(x, g, initial_state, output_final_state, mode="chunk", chunk_size=128)
