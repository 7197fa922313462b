"""fla's TTT-Linear entry points (``fla.ops.ttt``): ``chunk_ttt_linear``,
``fused_chunk_ttt_linear``.

TTT-Linear (``linattn.ops.ttt``, oracle ``linattn.reference.ttt``; Sun et al. 2024) with fla's
arguments: ``chunk_size`` is the mini-batch of one gradient step, ``w``, ``b`` [H, V] the layer
norm's, ``eta`` [B, T, H, 1] (or a float) the learning rates; the state is two tensors,
``initial_state`` [N, H, K, V] and ``initial_state_bias`` [N, H, 1, V], and both entry points
return ``(o, final_state, final_state_bias)`` (float32 states; float64 for float64 inputs).

fla's two kernels compute the same thing (its naive reference too): both run here as the dual
(mini-batch) form. Where fla's naive reference and its kernels could differ, these follow the
kernels, which agree with it on the point that matters: a last mini-batch shorter than
``chunk_size`` is padded with zero tokens, whose gradients enter the final bias state.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops.ttt import ttt_linear


def _run(q, k, v, w, b, eta, scale, eps, chunk_size, initial_state, initial_state_bias,
         output_final_state, cu_seqlens):  # fmt: skip
    _core.floating_qkv(q, k, v)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[-1] != v.shape[-1]:
        raise ValueError(f"v: DK must equal to DV, got K = {k.shape[-1]} and V = {v.shape[-1]}")
    for name, x in (("w", w), ("b", b)):
        _core.check_tensor(name, x)
    if isinstance(eta, float):
        eta = torch.full_like(q[..., :1], eta)
    _core.check_tensor("eta", eta)
    for name, x in (("initial_state", initial_state), ("initial_state_bias", initial_state_bias)):
        _core.floating_tensor(name, x)
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise ValueError(
                f"cu_seqlens: the batch size is expected to be 1 rather than {q.shape[0]} when "
                "using cu_seqlens"
            )
        if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
            raise ValueError(
                "initial_state: the number of initial states is expected to be equal to the "
                f"number of input sequences, i.e., {len(cu_seqlens) - 1} rather than "
                f"{initial_state.shape[0]}"
            )
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    dtype = compute_dtype(q.dtype)
    N = q.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
    H, K, V = q.shape[2], q.shape[3], v.shape[3]
    state = None
    if initial_state is not None or initial_state_bias is not None:
        W0 = q.new_zeros(N, H, K, V, dtype=dtype) if initial_state is None else initial_state
        h0 = (
            q.new_zeros(N, H, 1, V, dtype=dtype)
            if initial_state_bias is None
            else initial_state_bias
        )
        state = (W0.to(dtype), h0.to(dtype))
    o, S = ttt_linear(
        q, k, v, w, b, eta, scale=scale, eps=eps, mini_batch_size=chunk_size, mode="chunk",
        initial_state=state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    if S is None:
        return o, None, None
    return o, S[0].to(dtype), S[1].to(dtype)


def _as_op_returns(out: tuple, given: dict) -> tuple:
    """fla's (o, W, h) as linattn's op returns them: (o, (W, h) or None)."""
    o, W, h = out
    return o, (None if W is None else (W, h))


# linattn's op: the mini-batch is ``mini_batch_size``, the state one pair (W, h)
OP_CALL = _core.inverts(
    names={"mini_batch_size": "chunk_size"},
    parts={"initial_state": ("initial_state", "initial_state_bias")},
    result=_as_op_returns,
)


@OP_CALL
def chunk_ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    b: Tensor,
    eta: Tensor,
    scale: float | None = None,
    eps: float = 1e-6,
    chunk_size: int = 16,
    initial_state: Tensor | None = None,
    initial_state_bias: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """fla's ``chunk_ttt_linear``: TTT-Linear, one gradient step per ``chunk_size`` tokens:
    ``o_t = z_t + LN(z_t)``, ``z_t = (scale q_t) W_t + h_t``,
    ``W_t = W_0 - eta_t sum_{s <= t} grad_W 1/2 |LN(k_s W_0 + h_0) - (v_s - k_s)|^2``."""
    return _run(q, k, v, w, b, eta, scale, eps, chunk_size, initial_state, initial_state_bias,
                output_final_state, cu_seqlens)  # fmt: skip


@OP_CALL
def fused_chunk_ttt_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w: Tensor,
    b: Tensor,
    eta: Tensor,
    scale: float | None = None,
    eps: float = 1e-6,
    chunk_size: int = 16,
    initial_state: Tensor | None = None,
    initial_state_bias: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """fla's ``fused_chunk_ttt_linear``: the same computation as ``chunk_ttt_linear``."""
    return _run(q, k, v, w, b, eta, scale, eps, chunk_size, initial_state, initial_state_bias,
                output_final_state, cu_seqlens)  # fmt: skip
