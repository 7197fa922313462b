"""fla's delta rule: ``chunk_delta_rule``, ``fused_chunk_delta_rule`` and
``fused_recurrent_delta_rule``.

S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T (scale q_t) (spec sections 7,
8); beta [B, T, H] (or per value channel [B, T, H, V] in the recurrent form).
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core


def chunk_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_delta_rule`` (beta [B, T, H]; chunk_size 16, 32 or 64 by keyword).

    fla's Triton kernel refuses float32 and mixed dtypes; linattn computes them.
    """
    _core.check(q, k, v)
    if not isinstance(beta, Tensor) or beta.dim() != 3:
        raise ValueError("beta must be of shape (batch size, num of head, seq len).")
    _core.no_head_first(kwargs)
    C = _core.check_chunk_size(kwargs.pop("chunk_size", 64), (16, 32, 64), "the delta rule")
    return _core.run(
        q, k, v, delta=True, mode="chunk", beta=beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_size=C,
        l2norm=use_qk_l2norm_in_kernel, out="q",
    )  # fmt: skip


def fused_chunk_delta_rule(**kwargs: object) -> tuple[Tensor, Tensor | None]:
    """fla 0.6.0's ``fused_chunk_delta_rule`` is deprecated and raises; so does this one."""
    raise NotImplementedError(
        "fused_chunk_delta_rule is deprecated. Please use chunk_delta_rule instead."
    )


def fused_recurrent_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor = None,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_delta_rule``: the token loop; beta defaults to ones, and may be
    per value channel [B, T, H, V]; a scale must be positive (as fla asserts)."""
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if beta is None:
        beta = torch.ones_like(v[..., 0])
    return _core.run(
        q, k, v, delta=True, mode="recurrent", beta=beta, scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, l2norm=use_qk_l2norm_in_kernel,
    )  # fmt: skip
