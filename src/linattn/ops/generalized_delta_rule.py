"""The generalized delta rule: a diagonal-plus-low-rank transition, three forms (spec 7, 8, 10)."""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import _engine
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops._arguments import check_op
from linattn.ops.rules import dplr


def generalized_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = dplr.CHUNK_SIZE,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """S_t = (Diag(exp g_t) + a_t b_t^T) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t).

    b_t reads the state entering the token (S_{t-1}, not decayed by g_t) and a_t is the
    direction the read is written along; the write k_t v_t^T has no strength of its own. The
    transition's diagonal is the gate: none (IPLR, I + a b^T), one log-decay per head or one per
    key channel (DPLR). The delta rule's rows of the mechanism table (docs/design.md) are
    special cases:

    | mechanism        | g        | a          | b                 | v       |
    |------------------|----------|------------|-------------------|---------|
    | delta rule       | None     | -beta k    | k                 | beta v  |
    | Gated DeltaNet   | [B,T,HV] | -beta k    | exp(g) k          | beta v  |
    | KDA              | channel  | -beta k    | exp(g) * k        | beta v  |
    | Comba            | [B,T,HV] | -beta k    | p                 | beta v  |
    | GDN-2            | channel  | -k         | exp(g) * bb * k   | w * v   |
    | IPLR, DPLR, RWKV-7 | any    | a          | b                 | v       |

    (Comba as fla's kernels and ``naive_chunk_comba`` compute it, ``linattn.ops.comba``: p reads
    the state before its decay. Reading the decayed state, S <- alpha S; u = beta (v - S^T p), as
    fla's ``naive_recurrent_comba`` does, is b = exp(g) p.)

    The chunk form solves one unit-lower-triangular system per chunk for the reads b^T S of its
    tokens (the WY form of section 8, generalized: ``linattn.ops.rules.dplr``), every exponent of
    a gate non-positive.

    Grouped value heads: v, a, b, g and the states may have HV = G * H heads while q and k have
    H; value head j then reads q/k head j // G (its state, a, b and gates are its own).

    Args:
        q, k: [B, T, H, K]. v: [B, T, HV, V], HV a multiple of H.
        a, b: [B, T, HV, K], finite (any values: the transition need not contract).
        g: None, [B, T, HV] or [B, T, HV, K]; a log-decay, every entry <= 0, -inf included (a
            reset: the diagonal is 0 there; a b^T still acts).
        scale: multiplies q; None means 1 / sqrt(K).
        mode: "parallel", "recurrent" or "chunk" (as ``delta_rule``).
        chunk_size: any int >= 1 (mode="chunk"; chunks of min(chunk_size, T) <= 8192 tokens);
            32 by default, the rule's fastest (``linattn.ops.rules.dplr.CHUNK_SIZE``).
        initial_state: [B, HV, K, V] or None (zeros); [N, HV, K, V] with cu_seqlens.
        output_final_state: return the state after the last token (else None).
        cu_seqlens: None or cumulative sequence lengths [N + 1] (B = 1): packed sequences.

    Returns:
        o: [B, T, HV, V] in v's dtype; final_state [B, HV, K, V] (or [N, HV, K, V]) in float32
        (float64 for float64 inputs), or None.
    """

    def own(B: int, T: int, HV: int, K: int, V: int) -> None:
        _checks.vectors("a", a, B, T, HV, K)
        _checks.vectors("b", b, B, T, HV, K)

    checked = check_op(
        q, k, v, g, mode=mode, chunk_size=chunk_size, scale=scale,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        initial_state=initial_state, own=own,
    )  # fmt: skip
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("generalized_delta_rule", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, v.dtype)
    dtype = _engine.compute_dtype(q.dtype)
    ab = torch.cat([a.to(dtype), b.to(dtype)], dim=-1)  # [B, T, HV, 2K]: the ops' beta slot
    o, S = _engine.run(
        q,
        k,
        v,
        ab,
        g,
        scale=scale,
        mode=mode,
        chunk_size=checked.chunk_size,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
        rule="dplr",
        keep_dtype=True,  # o only converted to v's dtype below
    )
    return o.to(v.dtype), S if checked.output_final_state else None
