"""RWKV-6: GLA read from the state before the token's write, plus a bonus on the token itself.

    o_t = S_{t-1}^T (scale q_t) + scale (q_t^T Diag(u) k_t) v_t
    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T

(Peng et al. 2024, "Eagle and Finch"; fla 0.6.0's ``naive_recurrent_rwkv6``, whose w is our g: a
log-decay per key channel, applied to the state after it is read). The memory is the additive
rule's with a gate (DESIGN.md's table: GLA); only the read differs, and it is one token late.

The additive rule, run on the queries moved one token up, reads each state one token early:

    q'_t = q_{t+1}   =>   o'_t = S_t^T (scale q_{t+1}),   so   S_{t-1}^T (scale q_t) = o'_{t-1}

for every token but a sequence's first, which reads the state the sequence enters with. So the
exclusive read (the chunk form's strictly lower intra-chunk matrix with the decay
exp(G_{t-1} - G_s), and the inter-chunk read q_t exp(G_{t-1}) of the state before the token) is
the additive rule's own inclusive read re-indexed: every form of ``linear_attention`` (parallel,
recurrent, chunk; the fused C++ loop forward and backward), its decays (every exponent <= 0,
resets exact), grouped value heads, states and gradients are used unchanged, and the final state
is the additive rule's. The bonus is the diagonal the strictly lower matrix leaves out, with u in
place of the decay: one product per token, (q_t * u * k_t) summed over the key channels.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops import _engine
from linattn.ops import checks as _checks


def rwkv6(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None,
    u: Tensor,
    *,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """RWKV-6's time mixing (the module docstring; spec sections 5, 5.1 and 10).

        o_t = S_{t-1}^T (scale q_t) + scale (sum_c q_tc u_c k_tc) v_t
        S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T

    A separate op, not a ``bonus=`` of ``linear_attention``: the bonus comes with the read before
    the write (u = 0 is GLA read one token early, not GLA), which ``linear_attention``'s name and
    its normaliser do not have. It runs ``linear_attention``'s forms (see the module docstring).

    Args:
        q, k: [B, T, H, K] (RWKV's r and k). v: [B, T, HV, V], HV a multiple of H (grouped value
            heads: value head j reads q/k head j // (HV // H)). One floating dtype.
        g: [B, T, HV, K] (RWKV-6: a log-decay per key channel, fla's w), [B, T, HV] (per head) or
            None; every entry <= 0, -inf a reset (the state is forgotten after the token's read).
        u: [HV, K], the bonus of each value head (fla's u); any floating dtype, finite.
        scale: multiplies q (the read and the bonus); None means 1 / sqrt(K).
        mode, chunk_size, initial_state, output_final_state, cu_seqlens: as ``linear_attention``.

    Returns:
        o: [B, T, HV, V] in the input dtype; final_state: [B, HV, K, V] (or [N, ...] with
        cu_seqlens) in float32 (float64 for float64 inputs), or None.
    """
    B, T, H, HV, K, V = _checks.grouped_qkv(q, k, v)
    _checks.gate(g, B, T, HV, K)
    _checks.tensor("u", u, 2)
    if tuple(u.shape) != (HV, K):
        raise ValueError(f"u must have shape [HV, K] = {(HV, K)}, got {tuple(u.shape)}")
    chunk_size = _checks.options(mode, chunk_size)
    _checks.scale(scale)
    output_final_state = _checks.flag("output_final_state", output_final_state)
    N = _checks.seqlens(cu_seqlens, B, T)
    _checks.state(initial_state, N, HV, K, V)
    scale = 1.0 / math.sqrt(K) if scale is None else float(scale)
    # q_next [B, T, H, K]: row t is q_{t+1}; the last row's read is never used (zeros).
    q_next = torch.cat([q[:, 1:], torch.zeros_like(q[:, :1])], dim=1)
    o_next, S = _engine.run(
        q_next,
        k,
        v,
        None,
        g,
        scale=scale,
        mode=mode,
        chunk_size=chunk_size,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )  # o_next[:, t] = S_t^T (scale q_{t+1}), in the compute dtype
    o = _previous_reads(o_next, q, initial_state, cu_seqlens, scale)
    o = o + bonus(q, k, v, u, scale, o.dtype)
    return o.to(q.dtype), S if output_final_state else None


def _previous_reads(
    o_next: Tensor,
    q: Tensor,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    scale: float,
) -> Tensor:
    """S_{t-1}^T (scale q_t) for every token [B, T, HV, V]: o_next moved one token down, and each
    sequence's first token reading the state it enters with (zeros without one)."""
    T = o_next.shape[1]
    if T == 0:
        return o_next
    o = torch.cat([torch.zeros_like(o_next[:, :1]), o_next[:, : T - 1]], dim=1)
    if cu_seqlens is None:
        firsts = [0]
    else:  # packed sequences (B = 1): the first token of each
        firsts = cu_seqlens[:-1].tolist()
    index = torch.tensor(firsts, device=o.device)
    if initial_state is None:
        return o if cu_seqlens is None else o.index_fill(1, index, 0.0)
    S0 = initial_state.to(o.dtype)  # [N, HV, K, V]
    q0 = q.index_select(1, index).to(o.dtype) * scale  # [B, N', H, K], one of B, N' is 1
    q0 = q0.squeeze(0) if cu_seqlens is not None else q0.squeeze(1)  # [N, H, K]
    groups = _groups(q0.shape[1], S0.shape[1])
    # value head j reads q head j // G: [N, H, G, K, V] read by [N, H, K]
    reads = torch.einsum("nhk,nhgkv->nhgv", q0, S0.unflatten(1, groups)).flatten(1, 2)
    reads = reads.unsqueeze(0) if cu_seqlens is not None else reads.unsqueeze(1)
    return o.index_copy(1, index, reads)


def bonus(q: Tensor, k: Tensor, v: Tensor, u: Tensor, scale: float, dtype: torch.dtype) -> Tensor:
    """scale (sum_c q_tc u_c k_tc) v_t [B, T, HV, V] in ``dtype``: the current token's own term.

    q, k [B, T, H, K] (or [B, H, K], one token); v [B, T, HV, V] ([B, HV, V]); u [HV, K].
    """
    qk = q.to(dtype) * k.to(dtype)  # [..., H, K]
    # [..., H, K] with u [H, G, K] -> [..., H, G] -> [..., HV]: value head j pairs with j // G
    u = u.to(dtype).unflatten(0, _groups(q.shape[-2], u.shape[0]))
    weight = torch.einsum("...hk,hgk->...hg", qk, u)
    return (scale * weight.flatten(-2)).unsqueeze(-1) * v.to(dtype)


def _groups(H: int, HV: int) -> tuple[int, int]:
    """(H, G): the HV value heads as H runs of G = HV // H (G = 1 where there are no heads)."""
    return H, HV // H if H else 1
