"""fla's ``fused_attnres`` (fla.ops.attnres): attention residuals (Attention Residuals,
arXiv 2603.15031), a softmax over a layer's residual sources instead of their sum.

For L residual sources v_1..v_L [..., D], a pseudo-query q [D] and RMSNorm weights w:

    k_l = RMSNorm_w(v_l),   p_l = softmax_l(scale q^T k_l),   o = sum_l p_l v_l,

then, with ``output_rms_weight``, o = RMSNorm_{w_o}(o) (the pre-norm that follows it, fused).
Computed in float32 (float64 for float64 sources) and returned in the sources' dtype; with
``return_weights`` also p [L, ...] in float32 (float64), without gradient, as fla's.
tests/compat/test_attnres.py pins this against fla's ``naive_attnres`` and its Triton kernel
under the interpreter (whose check for CUDA tensors the test lifts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype


def fused_attnres(
    query: Tensor,
    residuals: Sequence[Tensor],
    rms_weight: Tensor,
    output_rms_weight: Tensor | None = None,
    rms_eps: float = 1e-6,
    scale: float = 1.0,
    return_weights: bool = False,
    checkpoint_level: int = 1,
) -> Tensor | tuple[Tensor, Tensor]:
    """fla's ``fused_attnres``: o = sum_l softmax_l(scale q^T RMSNorm_w(v_l)) v_l, optionally
    RMS-normalised by ``output_rms_weight`` (the module docstring). ``checkpoint_level`` (0 or
    1, fla's backward memory trade-off) is checked and has no effect here: autograd keeps what
    it needs."""
    if isinstance(residuals, Tensor) or not isinstance(residuals, Sequence) or not residuals:
        raise ValueError("residuals must be a non-empty sequence of tensors [..., D]")
    for i, r in enumerate(residuals):
        _core.check_tensor(f"residuals[{i}]", r)
    shape, dtype = residuals[0].shape, residuals[0].dtype
    D = shape[-1]
    for i, r in enumerate(residuals):
        if r.shape != shape or r.dtype != dtype:
            raise ValueError(
                f"residuals[{i}] must have residuals[0]'s shape {tuple(shape)} and dtype {dtype}, "
                f"got {tuple(r.shape)} {r.dtype}"
            )
    _core.check_tensor("query", query)
    if query.numel() != D:
        raise ValueError(
            f"query must have D = {D} entries ([D] or [D, 1]), got {tuple(query.shape)}"
        )
    _core.check_tensor("rms_weight", rms_weight)
    if rms_weight.numel() != D:
        raise ValueError(f"rms_weight must have shape [D] = [{D}], got {tuple(rms_weight.shape)}")
    if output_rms_weight is not None:
        _core.check_tensor("output_rms_weight", output_rms_weight)
        if output_rms_weight.numel() != D:
            raise ValueError(
                f"output_rms_weight must have shape [D] = [{D}], got "
                f"{tuple(output_rms_weight.shape)}"
            )
    if checkpoint_level not in (0, 1):
        raise ValueError(f"checkpoint_level must be 0 or 1, got {checkpoint_level}")
    work = compute_dtype(dtype)
    v = torch.stack([r.reshape(-1, D) for r in residuals]).to(work)  # [L, N, D]
    k = F.rms_norm(v, (D,), rms_weight.reshape(D).to(work), rms_eps)
    logits = k @ (query.reshape(D).to(work) * scale)  # [L, N]
    p = torch.softmax(logits, dim=0)
    o = torch.einsum("ln,lnd->nd", p, v)
    if output_rms_weight is not None:
        o = F.rms_norm(o, (D,), output_rms_weight.reshape(D).to(work), rms_eps)
    o = o.reshape(shape).to(dtype)
    if return_weights:
        return o, p.detach().reshape(len(residuals), *shape[:-1])
    return o
