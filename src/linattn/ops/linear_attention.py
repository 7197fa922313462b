"""Linear attention with optional decay, in all three forms (spec sections 4, 5, 5.1)."""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import _engine
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops._arguments import check_op


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    *,
    normalize: bool = False,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Causal linear attention: S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t).

    Spec sections 4 and 5 (g = None: the additive rule of Katharopoulos et al.), 5.1 (chunks), and
    the decays of section 10: g of shape [B, T, H] is one log-decay per head (Mamba-2 / RetNet),
    [B, T, H, K] one per key channel (GLA). ``q`` and ``k`` are already feature-mapped
    (``linattn.features``).

    Grouped value heads: v, g and the states may have HV = G * H heads while q and k have H;
    value head j then reads q/k head j // G. HV = H is the plain case.

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H. One floating dtype
            (float64/32, bfloat16, float16).
        g: None, [B, T, HV] or [B, T, HV, K]; a log-decay, every entry <= 0 (alpha = exp g), -inf
            included: a reset, alpha = 0 exactly (the state is forgotten at that token).
        normalize: divide by the normaliser z_t^T (scale q_t), where z_t is the same recurrence run
            on a column of ones: z_t = Diag(exp g_t) z_{t-1} + k_t. It is computed as one more
            value column, so the state is [B, H, K, V + 1] with z as its last column (the initial
            state must then have that shape too). A zero denominator gives inf/NaN: use positive
            features (elu + 1, positive random features) with normalize=True.
        scale: multiplies q; None means 1 / sqrt(K) (pass 1.0 for the spec's plain form).
        mode: "parallel" (the masked n x n product), "recurrent" (token by token; with T = 1 and
            an initial state this is the generation step) or "chunk" (blocks of chunk_size).
        chunk_size: any int >= 1 (need not divide T); used by mode="chunk", whose chunks of
            min(chunk_size, T) tokens may be at most 8192 long (``_engine.MAX_CHUNK``).
        initial_state: [B, HV, K, V] (or [B, HV, K, V + 1] with normalize) or None (zeros); with
            cu_seqlens, [N, HV, K, V(+1)] for N packed sequences.
        output_final_state: return the state after the last token (else None).
        cu_seqlens: None, or cumulative sequence lengths [N + 1] (FlashAttention convention, B = 1):
            the packed sequences run independently.

    Returns:
        o: [B, T, HV, V] in the input dtype; final_state: [B, HV, K, V(+1)] (or [N, ...]) in float32
        (float64 for float64 inputs), or None.
    """
    normalize = _checks.flag("normalize", normalize)
    checked = check_op(
        q, k, v, g, mode=mode, chunk_size=chunk_size, scale=scale,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        initial_state=initial_state, state_columns=int(normalize),
    )  # fmt: skip
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("linear_attention", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, q.dtype)
    V = checked.V
    if normalize:
        # The normaliser is the same recurrence on a column of ones (docs/design.md, "The
        # mechanism table").
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    o, S = _engine.run(
        q,
        k,
        v,
        None,
        g,
        scale=scale,
        mode=mode,
        chunk_size=checked.chunk_size,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        rule="additive",
        keep_dtype=not normalize,  # the normaliser divides o in float32
    )
    if normalize:
        o = o[..., :V] / o[..., V:]
    return o.to(q.dtype), S if checked.output_final_state else None
