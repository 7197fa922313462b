"""fla's gated slot attention (GSA): ``chunk_gsa``, ``fused_recurrent_gsa`` (fla.ops.gsa).

Two passes of the additive rule with a softmax over m slots between them (Zhang et al. 2024;
``linattn.ops.slots``): S_k,t = S_k,t-1 Diag(exp g_t) + k_t s_t^T, p_t = softmax(S_k,t^T (scale
q_t)), S_v,t = Diag(exp g_t) S_v,t-1 + s_t v_t^T, o_t = S_v,t^T p_t. States: the pair
(S_k [N, H, K, M], S_v [N, H, M, V]); fla returns them as a list ``[S_k, S_v]`` ([None, None]
without ``output_final_state``). ``g=None``: the slots follow ABC's cumulative softmax of s
(fla's ``fused_additive_gate``), restarted at each sequence and call.

Grouped query heads (q with HQ = G H heads, k, v, s, g and the states with H): as fla, every
query head of a group runs the group's memory (k, v, s, g and the initial states repeated G
times) and the final state is the group's first head's. fla's ``fused_recurrent_gsa`` takes
them only for one token without gradients and without ``cu_seqlens`` (its decoding kernel),
and refuses them otherwise; so does this one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops.slots import additive_gate, gated_slot_attention


def _checks(q, k, v, s, g, initial_state, cu_seqlens):
    """fla's shape checks: q [B, T, HQ, K], k [B, T, H, K], v [B, T, H, V], s and g
    [B, T, H, M], HQ a multiple of H; the states' count with cu_seqlens. Returns G = HQ / H."""
    for name, x in (("q", q), ("k", k), ("v", v), ("s", s)):
        _core.check_tensor(name, x)
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape [B, T, H, D], got {tuple(x.shape)}")
    _core.floating_tensor("g", g)
    B, T, HQ, K = q.shape
    H = k.shape[2]
    if tuple(k.shape) != (B, T, H, K):
        raise ValueError(
            f"k must have shape [B, T, H, K] with B, T, K = {(B, T, K)}, got {tuple(k.shape)}"
        )
    if H < 1 or HQ < H or HQ % H:
        raise ValueError(
            f"The number of query heads ({HQ}) must be a multiple of the number of key heads ({H})."
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v must have shape [B, T, H, V] with B, T, H = {tuple(k.shape[:3])}, "
            f"got {tuple(v.shape)}"
        )
    if s.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"s must have shape [B, T, H, M] with B, T, H = {tuple(k.shape[:3])}, "
            f"got {tuple(s.shape)}"
        )
    if g is not None and g.shape != s.shape:
        raise ValueError(
            f"g must have the shape of s [B, T, H, M] = {tuple(s.shape)}, got {tuple(g.shape)}"
        )
    if initial_state is not None:
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != 2:
            raise TypeError(
                "initial_state must be None or a pair (S_k [N, H, K, M], S_v [N, H, M, V])"
            )
        for name, S in zip(("S_k", "S_v"), initial_state, strict=True):
            _core.floating_tensor(f"initial_state's {name}", S)
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(
                f"cu_seqlens: the batch size is expected to be 1 rather than {B} when using "
                "cu_seqlens (flatten variable-length inputs first)"
            )
        first = None if initial_state is None else initial_state[0]
        if first is not None and first.shape[0] != len(cu_seqlens) - 1:
            raise ValueError(
                "initial_state: the number of initial states is expected to be equal to the number "
                f"of input sequences, i.e., {len(cu_seqlens) - 1} rather than {first.shape[0]}"
            )
    return HQ // H


def run(q, k, v, s, g, scale, initial_state, output_final_state, cu_seqlens, mode, chunk_size, out):
    """``gated_slot_attention`` with fla's conventions: one promoted dtype, float32 (float64)
    states, grouped query heads as fla runs them; o in ``out``'s dtype; returns (o, [S_k, S_v])."""
    G = q.shape[2] // k.shape[2]
    dtype = _core.promote(q, k, v, s, g)
    q, k, v, s = (x.to(dtype) for x in (q, k, v, s))
    g = None if g is None else g.to(dtype)
    state_dtype = compute_dtype(dtype)
    S0 = None
    if initial_state is not None:
        S0 = tuple(None if x is None else x.to(state_dtype) for x in initial_state)
    if G > 1:
        k, v, s = (x.repeat_interleave(G, dim=2) for x in (k, v, s))
        g = None if g is None else g.repeat_interleave(G, dim=2)
        if S0 is not None:
            S0 = tuple(None if x is None else x.repeat_interleave(G, dim=1) for x in S0)
    o, final = gated_slot_attention(
        q, k, v, s, g, scale=scale, mode=mode, chunk_size=chunk_size, initial_state=S0,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    if final is None:
        return o.to(out), [None, None]
    return o.to(out), [x[:, ::G].contiguous() for x in final]


def _as_op_returns(out: tuple, given: dict) -> tuple:
    """fla's (o, [S_k, S_v]) as linattn's op returns them: (o, (S_k, S_v) or None)."""
    o, (Sk, Sv) = out
    return o, (None if Sk is None else (Sk, Sv))


OP_CALL = _core.inverts(result=_as_op_returns)


@OP_CALL
def chunk_gsa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    initial_state: tuple[Tensor, Tensor] | None = None,
    output_final_state: bool = False,
    checkpoint_level: int = 2,
    cu_seqlens: Tensor | None = None,
    cu_seqlens_cpu: Tensor | None = None,
    **kwargs: object,
) -> tuple[Tensor, list[Tensor | None]]:
    """fla's ``chunk_gsa``: GSA (the module docstring) in linattn's chunk form.

    q [B, T, HQ, K], k [B, T, H, K], v [B, T, H, V], s and g [B, T, H, M] (g None: ABC's
    control); ``scale`` None is 1 / sqrt(K); ``checkpoint_level`` (0, 1, 2) only chooses fla's
    recomputation and is checked, not used; ``chunk_size`` (a keyword, a power of 2) sets the
    chunk form's blocks. Returns (o [B, T, HQ, V] in v's dtype, [S_k, S_v]).
    """
    _core.no_head_first(kwargs)
    chunk_size = _core.check_chunk_size(kwargs.pop("chunk_size", None), None, "chunk_gsa")
    _checks(q, k, v, s, g, initial_state, cu_seqlens)
    if checkpoint_level not in (0, 1, 2):
        raise ValueError(f"checkpoint_level must be 0, 1 or 2, got {checkpoint_level!r}")
    return run(
        q, k, v, s, g, scale, initial_state, output_final_state, cu_seqlens, "chunk",
        chunk_size, v.dtype,
    )  # fmt: skip


@OP_CALL
def fused_recurrent_gsa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    s: Tensor,
    g: Tensor | None = None,
    scale: float | None = None,
    initial_state: tuple[Tensor, Tensor] | None = None,
    output_final_state: bool = False,
    reverse: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, list[Tensor | None]]:
    """fla's ``fused_recurrent_gsa``: GSA (the module docstring) token by token.

    As ``chunk_gsa``; ``reverse=True`` runs each sequence from its last token to its first (the
    gate of g=None computed in the forward order first, as fla). Grouped query heads only for one
    token, no gradients, no cu_seqlens (fla's decoding kernel; o then in v's dtype, else q's).
    """
    G = _checks(q, k, v, s, g, initial_state, cu_seqlens)
    leaves = (q, k, v, s, g, *(initial_state or ()))
    grads = torch.is_grad_enabled() and any(
        isinstance(x, Tensor) and x.requires_grad for x in leaves
    )
    decoding = q.shape[1] == 1 and not grads and cu_seqlens is None
    if G > 1 and not decoding:
        raise ValueError("GQA is only supported for single-token inference.")
    out = v.dtype if decoding else q.dtype
    if reverse and not decoding:
        if cu_seqlens is not None:
            _core.check_varlen(q, None, cu_seqlens)
        if g is None:  # the control runs forward in time, then the recurrence backward
            weights, g = additive_gate(s.to(_core.promote(q, k, v, s)), cu_seqlens)
            s = weights
        order = _core.time_order(q.shape[1], cu_seqlens, q.device)
        q, k, v, s, g = (x.index_select(1, order) for x in (q, k, v, s, g))
        o, final = run(
            q, k, v, s, g, scale, initial_state, output_final_state, cu_seqlens, "recurrent",
            _core.CHUNK, out,
        )  # fmt: skip
        return o.index_select(1, order), final
    return run(
        q, k, v, s, g, scale, initial_state, output_final_state, cu_seqlens, "recurrent",
        _core.CHUNK, out,
    )  # fmt: skip
