"""fla's Gated DeltaProduct: ``chunk_gated_delta_product`` (``fla.ops.gated_delta_product``).

Per token t: S <- exp(g_t) S, then n_h delta-rule writes S <- (I - beta k k^T) S + beta k v^T,
then o_t = S^T (scale q_t) (``linattn.ops.gated_delta_product``). k, v and beta have T n_h rows
(the writes of token t are rows t n_h .. t n_h + n_h - 1), q and g have T rows; ``cu_seqlens``
counts tokens (rows of q). fla's kernel refuses float32 inputs (an assert); linattn computes
every dtype (float32 and float64 in their own precision).
"""

from __future__ import annotations

from functools import partial

from torch import Tensor

from linattn.compat import _core
from linattn.ops import gated_delta_product


def chunk_gated_delta_product(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    num_householder: int,
    scale: float = None,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    cp_context: object | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_gated_delta_product`` (the module docstring): g [B, T, H] or None, beta
    [B, T n_h, H], k [B, T n_h, H, K], v [B, T n_h, H, V]; returns (o [B, T, H, V] in q's dtype,
    the final state [N, H, K, V] or None)."""
    _core.check_cp(cp_context)
    op = partial(
        gated_delta_product,
        num_householder=num_householder,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
    )
    return _core.run_op(
        op, q, k, v, {"beta": beta, "g": g}, mode="chunk", scale=scale,
        initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, out="q",
    )  # fmt: skip
