"""fla's softmax attention entry points: ``parallel_attn`` (fla.ops.attn),
``parallel_forgetting_attn`` (fla.ops.forgetting_attn) and ``parallel_stickbreaking_attn``
(fla.ops.stickbreaking_attn).

- ``parallel_attn``: causal softmax attention with optional per-query-head log-gates g (the
  logit of query t and key s gains G_t - G_s, G the cumulative sum of g in each sequence: the
  Forgetting Transformer), a sliding window (keys t - window_size < s <= t), GQA (query head j
  reads key/value head j // (HQ / H)), attention sinks (``sink_bias`` [HQ], a logit with no value
  in each row's denominator) and packed sequences; ``linattn.ops.softmax_variants``'s
  ``forgetting_attention``.
- ``parallel_forgetting_attn``: ``parallel_attn`` with g the log forget gates (fla's is the same
  call).
- ``parallel_stickbreaking_attn``: stick-breaking attention, returning (o, rem) with rem the
  stick each query leaves unused; ``linattn.ops.softmax_variants.stickbreaking_attention``.

The masked T x T product serves sequences up to ``PARALLEL_UP_TO`` tokens; longer ones run the
blockwise form (blocks of ``BLOCK`` tokens, an online softmax / the stick carried), whose memory
per step is linear in T. The two agree to rounding (tests/ops/test_softmax_variants.py).
dtypes: computed in float32 (float64 for float64), o returned in q's dtype as fla's
``o.to(q.dtype)``; q, k, v of mixed dtypes are promoted first.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.ops.softmax_variants import forgetting_attention, stickbreaking_attention

PARALLEL_UP_TO = 1024  # the masked product up to this many tokens a sequence, then blockwise
BLOCK = 128  # fla's query block (BT) in parallel_attn


def _mode(T: int) -> str:
    return "parallel" if T <= PARALLEL_UP_TO else "chunk"


def _heads(q: Tensor, k: Tensor, v: Tensor) -> None:
    """fla's shape checks: q [B, T, HQ, K], k [B, T, H, K], v [B, T, H, V], HQ a multiple of H."""
    _core.floating_qkv(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape [B, T, H, D], got {tuple(x.shape)}")
    HQ, H = q.shape[2], k.shape[2]
    if H == 0 or HQ % H != 0:
        raise ValueError(
            f"q: the number of query heads ({HQ}) must be divisible by the number of key/value "
            f"heads ({H})."
        )


def _varlen(q: Tensor, cu_seqlens: Tensor | None) -> None:
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(
            f"cu_seqlens: the batch size is expected to be 1 rather than {q.shape[0]} when using "
            "cu_seqlens (flatten variable-length inputs first)"
        )


def parallel_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    window_size: int | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    *,
    sink_bias: Tensor | None = None,
) -> Tensor:
    """fla's ``parallel_attn``: o_t = sum_s exp(l_ts) v_s / (sum_s exp(l_ts) + exp(sink_bias)),
    l_ts = scale q_t^T k_s + G_t - G_s over t - window_size < s <= t (the module docstring).

    q [B, T, HQ, K], k [B, T, H, K], v [B, T, H, V], g [B, T, HQ] log-gates or None, sink_bias
    [HQ] or None; ``chunk_indices`` (fla's precomputed block indices) is accepted and unused.
    Returns o [B, T, HQ, V] in q's dtype.
    """
    _heads(q, k, v)
    _varlen(q, cu_seqlens)
    _core.floating_tensor("g", g)
    _core.floating_tensor("sink_bias", sink_bias)
    dtype = _core.promote(q, k, v, g, sink_bias)
    o = forgetting_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), None if g is None else g.to(dtype),
        scale=scale, window_size=window_size,
        sink_bias=None if sink_bias is None else sink_bias.to(dtype), cu_seqlens=cu_seqlens,
        mode=_mode(q.shape[1]), chunk_size=BLOCK,
    )  # fmt: skip
    return o.to(q.dtype)


def parallel_forgetting_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    window_size: int | None = None,
    cu_seqlens: torch.LongTensor | None = None,
) -> Tensor:
    """fla's ``parallel_forgetting_attn`` (the Forgetting Transformer, Lin et al. 2025):
    softmax attention with logits scale q_t^T k_s + sum_{s < i <= t} g_i, g [B, T, HQ] the log
    forget gates; ``parallel_attn`` with g."""
    return parallel_attn(q, k, v, g, scale, window_size=window_size, cu_seqlens=cu_seqlens)


def parallel_stickbreaking_attn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    attend_current: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
) -> tuple[Tensor, Tensor]:
    """fla's ``parallel_stickbreaking_attn`` (Tan et al. 2024): A_ts = sigmoid(z_ts)
    prod_{s < i < t} (1 - sigmoid(z_ti)), z = scale q^T k (i <= t and s <= t with
    attend_current); returns (o [B, T, HQ, V] in q's dtype, rem [B, T, HQ] = 1 - sum_s A_ts
    in q's dtype)."""
    _heads(q, k, v)
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q, k, v: expected shapes [B, T, HQ, K], [B, T, H, K] and [B, T, H, V], got "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    _varlen(q, cu_seqlens)
    dtype = _core.promote(q, k, v)
    o, rem = stickbreaking_attention(
        q.to(dtype), k.to(dtype), v.to(dtype), scale=scale, attend_current=attend_current,
        cu_seqlens=cu_seqlens, mode=_mode(q.shape[1]), chunk_size=64,
    )  # fmt: skip
    return o.to(q.dtype), rem.to(q.dtype)
