"""RWKV-6: GLA read from the state before the token's write, plus a bonus on the token itself.

    o_t = S_{t-1}^T (scale q_t) + scale (q_t^T Diag(u) k_t) v_t
    S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T

(Peng et al. 2024, "Eagle and Finch"; fla 0.6.0's ``naive_recurrent_rwkv6``, whose w is our g: a
log-decay per key channel, applied to the state after it is read). The memory is the additive
rule's with a gate (GLA in the mechanism table, docs/design.md); only the read differs, and it
is one token late.

The additive rule run on every token's query but the first and every token's write but the last
reads each state one token early: the tokens q_{t+1} and (k_t, v_t, g_t), t = 1 .. T - 1, give

    o'_t = S_t^T (scale q_{t+1}) = the read of token t + 1,

and the first token reads the state its sequence enters with; one more token's step (the last
write) gives the final state. So the exclusive read (the chunk form's strictly lower intra-chunk
matrix with the decay exp(G_{t-1} - G_s), and the inter-chunk read q_t exp(G_{t-1}) of the state
before the token) is the additive rule's own inclusive read of the same tokens paired one apart:
every form of ``linear_attention`` (parallel, recurrent, chunk; the fused C++ loop forward and
backward), its decays (every exponent <= 0, resets exact), grouped value heads, states and
gradients are used unchanged, on views of the inputs (no copy). The bonus is the diagonal the
strictly lower matrix leaves out, with u in place of the decay: one product per token,
(q_t * u * k_t) summed over the key channels, which the reads are added into.

float32 on the CPU, in the chunk form and on sequences of equal length, the forward is instead
that chunk form itself, in the additive rule's fused C++ loop with a bonus (``chunk_forward``'s
``bonus``, csrc/rules/additive.cpp), and the backward the fused backward on q one token earlier
(the comment above ``_fused``): the pairs' views, their gradients and the bonus's autograd cost
more than the kernels' difference (benchmarks/README.md, "RWKV-6 over GLA").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.dtypes import compute_dtype
from linattn.ops import _engine, _native, rules
from linattn.ops import backends as _backends
from linattn.ops import checks as _checks
from linattn.ops._bonus import bonus, shifted_bonus_backward_
from linattn.ops._layout import to_internal
from linattn.ops.chunk import differentiable_gradients
from linattn.ops.library import backward_kernel, schema_args, tracing
from linattn.ops.mechanism import Mechanism
from linattn.ops.recurrent import step
from linattn.ops.tuning import MAX_CHUNK


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
    chunk_size = _checks.options(mode, chunk_size)
    output_final_state = _checks.flag("output_final_state", output_final_state)
    T, N = _check(q, k, v, g, u, scale, initial_state, cu_seqlens)
    if _backends.wanted(q):  # the op's arguments by name: none reassigned before this line
        chosen = _backends.choose("rwkv6", q, g, locals())
        if chosen is not None:
            return _backends.run(chosen, q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if mode == "chunk" and cu_seqlens is None and _fused(q, k, v, g, initial_state):
        _engine.check_chunk(chunk_size, [T])
        o, S = _fused_forward(q, k, v, g, u, initial_state, scale, chunk_size)
        return o, S if output_final_state else None
    return _composite(q, k, v, g, u, scale, mode, chunk_size, initial_state, output_final_state,
                      cu_seqlens)  # fmt: skip


def _composite(q, k, v, g, u, scale, mode, chunk_size, initial_state, output_final_state,
               cu_seqlens) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """``rwkv6`` on every form and dtype (checked inputs, scale a number): the additive rule's
    ``linear_attention`` forms on the inputs paired one token apart (the module docstring)."""
    if cu_seqlens is not None and bool((cu_seqlens[1:] == cu_seqlens[:-1]).any()):
        return _skipping_empty(q, k, v, g, u, scale, mode, chunk_size, initial_state,
                               output_final_state, cu_seqlens)  # fmt: skip
    T = q.shape[1]
    q_next, kvg, reads, last = _paired(q, (k, v, g), cu_seqlens)  # views unless packed
    options = dict(scale=scale, mode=mode, chunk_size=chunk_size)
    if cu_seqlens is None:
        o_next, S = _engine.run(
            q_next,
            *kvg[:2],
            None,
            kvg[2],
            initial_state=initial_state,
            cu_seqlens=None,
            **options,
            rule="additive",
        )  # o_next[:, t] = the read of token t + 1, in the compute dtype
    else:
        o_next, S = _packed_pairs(q_next, kvg, initial_state, cu_seqlens, options)
    o = _outputs(q, k, v, u, o_next, initial_state, cu_seqlens, reads, scale)
    if output_final_state and T > 0:  # the last token's write
        k_t, v_t, g_t = (None if x is None else x.index_select(1, last) for x in (k, v, g))
        S = _last_write(S, k_t, v_t, g_t)
    return o.to(q.dtype), S if output_final_state else None


def _skipping_empty(q, k, v, g, u, scale, mode, chunk_size, initial_state, output_final_state,
                    cu_seqlens) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """``_composite`` on packed sequences some of which have no token: the others run, and an
    empty one's final state is its initial state (zeros without one). Run as they are, an empty
    sequence's first token and last write would be indexed at its neighbour's (or past T)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    kept = (lengths > 0).nonzero().squeeze(1).to(q.device)
    N, HV, K, V = lengths.numel(), v.shape[2], k.shape[3], v.shape[3]
    dtype = compute_dtype(q.dtype)
    if initial_state is None:
        S = q.new_zeros(N, HV, K, V, dtype=dtype)
    else:
        S = initial_state.to(dtype)
    if kept.numel() == 0:  # T = 0: no token at all
        return q.new_zeros(1, 0, HV, V), S if output_final_state else None
    bounds = torch.cat([cu_seqlens[:1], cu_seqlens[1:][lengths > 0]])
    S0 = None if initial_state is None else initial_state.index_select(0, kept)
    o, S_kept = _composite(q, k, v, g, u, scale, mode, chunk_size, S0, output_final_state,
                           bounds)  # fmt: skip
    if not output_final_state:
        return o, None
    return o, S.index_copy(0, kept, S_kept.to(dtype))


def _check(q, k, v, g, u, scale, initial_state, cu_seqlens) -> tuple[int, int]:
    """The checks of ``rwkv6``'s tensors (``linattn.ops.checks``), each error naming its argument;
    returns (T, N): the tokens and the sequences."""
    B, T, H, HV, K, V = _checks.grouped_qkv(q, k, v)
    _checks.gate(g, B, T, HV, K)
    _checks.tensor("u", u, 2)
    if tuple(u.shape) != (HV, K):
        raise ValueError(f"u must have shape [HV, K] = {(HV, K)}, got {tuple(u.shape)}")
    _checks.scale(scale)
    N = _checks.seqlens(cu_seqlens, B, T)
    _checks.state(initial_state, N, HV, K, V)
    return T, N


def _packed_pairs(q_next, kvg, initial_state, cu_seqlens, options) -> tuple[Tensor, Tensor]:
    """The additive rule on packed sequences' pairs (``_paired``): each sequence has one pair
    fewer than tokens, so the sequences of one token have none and keep their initial state (the
    others run as ``_engine.run``'s packed sequences, none of them empty). Returns o_next [1,
    T - N, HV, V] and the states [N, HV, K, V] before each sequence's last write."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    runs = (lengths > 1).nonzero().squeeze(1)  # the sequences with a pair
    N, (_, _, HV, V), K = lengths.numel(), kvg[1].shape, kvg[0].shape[-1]
    dtype = compute_dtype(q_next.dtype)
    S = q_next.new_zeros(N, HV, K, V, dtype=dtype) if initial_state is None else initial_state
    S = S.to(dtype)
    if runs.numel() == 0:
        return q_next.new_zeros(1, 0, HV, V, dtype=dtype), S
    bounds = torch.cat([lengths.new_zeros(1), (lengths[runs] - 1).cumsum(0)])
    S0 = None if initial_state is None else initial_state.index_select(0, runs.to(S.device))
    o_next, S_runs = _engine.run(
        q_next,
        *kvg[:2],
        None,
        kvg[2],
        initial_state=S0,
        cu_seqlens=bounds,
        **options,
        rule="additive",
    )
    return o_next, S.index_copy(0, runs.to(S.device), S_runs)


def _paired(q: Tensor, kvg: tuple, cu_seqlens: Tensor | None) -> tuple:
    """(q of every token but each sequence's first, (k, v, g) of every token but each sequence's
    last, the indices of the first's tokens, those of each sequence's last token): [B, T - N,
    ...] each, token i of the first paired with token i of the second (the module docstring).
    Views for equal lengths (N = 1 along T; the first indices then None), gathered copies for
    packed sequences."""
    T = q.shape[1]
    if cu_seqlens is None:
        last = torch.full((min(T, 1),), T - 1, dtype=torch.long, device=q.device)
        if T == 0:
            return q, kvg, None, last
        # split, not slices: the gradient of a slice is a whole-sequence tensor of zeros first
        kvg = tuple(None if x is None else x.split([T - 1, 1], dim=1)[0] for x in kvg)
        return q.split([1, T - 1], dim=1)[1], kvg, None, last
    bounds = cu_seqlens.to(device=q.device, dtype=torch.long)
    keep = torch.ones(T, dtype=torch.bool, device=q.device)
    reads = keep.index_fill(0, bounds[:-1], False).nonzero().squeeze(1)
    writes = keep.index_fill(0, bounds[1:] - 1, False).nonzero().squeeze(1)
    kvg = tuple(None if x is None else x.index_select(1, writes) for x in kvg)
    return q.index_select(1, reads), kvg, reads, bounds[1:] - 1


def _last_write(S: Tensor, k_t: Tensor, v_t: Tensor, g_t: Tensor | None) -> Tensor:
    """S_T = Diag(exp g_T) S_{T-1} + k_T v_T^T for every sequence: S [N, HV, K, V]; k_t [B, N',
    H, K], v_t [B, N', HV, V], g_t [B, N', HV(, K)] or None, one of B, N' being 1 (the additive
    rule's step, ``recurrent.step``, whose read is not used)."""
    k_t, v_t = k_t.flatten(0, 1).to(S.dtype), v_t.flatten(0, 1).to(S.dtype)  # [N, H, K], [N, HV, V]
    if g_t is not None:
        g_t = g_t.flatten(0, 1).to(S.dtype)
        g_t = g_t.unsqueeze(-1) if g_t.dim() == 2 else g_t  # [N, HV, 1|K]
    _, S = step(S, k_t, k_t, v_t, None, g_t, rule=rules.named("additive"))
    return S


def _outputs(q, k, v, u, o_next, initial_state, cu_seqlens, reads, scale: float) -> Tensor:
    """o [B, T, HV, V]: each token's read (o_next's row before it, or for a sequence's first
    token the read of its initial state, zeros without one) plus its bonus. reads: the tokens
    o_next's rows belong to (packed sequences), or None (equal lengths: tokens 1 .. T - 1)."""
    B, T, HV, V = v.shape
    if T == 0:
        return bonus(q, k, v, u, scale, o_next.dtype)
    if initial_state is None:
        first = o_next.new_zeros(B if cu_seqlens is None else cu_seqlens.numel() - 1, HV, V)
    else:
        first = _first_reads(q, initial_state, cu_seqlens, scale, o_next.dtype)  # [N, HV, V]
    if cu_seqlens is None:
        return bonus(q, k, v, u, scale, o_next.dtype, reads=o_next, first=first.unsqueeze(1))
    # packed: o_next's rows and the first reads placed on their tokens (one new tensor)
    aligned = o_next.new_zeros(B, T, HV, V).index_copy(1, reads, o_next)
    aligned = aligned.index_copy(1, cu_seqlens[:-1].to(aligned.device), first.unsqueeze(0))
    return bonus(q, k, v, u, scale, o_next.dtype, reads=aligned)


def _first_reads(
    q: Tensor, initial_state: Tensor, cu_seqlens: Tensor | None, scale: float, dtype: torch.dtype
) -> Tensor:
    """S_0^T (scale q_1) of each sequence [N, HV, V]: its first token's read of the state it
    enters with (one initial state per batch row or sequence; T > 0)."""
    packed = cu_seqlens is not None
    firsts = cu_seqlens[:-1] if packed else torch.zeros(1, dtype=torch.long)
    firsts = firsts.to(device=q.device, dtype=torch.long)
    S0 = initial_state.to(dtype)  # [N, HV, K, V]
    q0 = q.index_select(1, firsts).to(dtype) * scale  # [B, N', H, K], one of B, N' is 1
    q0 = q0.squeeze(0) if packed else q0.squeeze(1)  # [N, H, K]
    groups = _groups(q0.shape[1], S0.shape[1])
    # value head j reads q head j // G: [N, H, G, K, V] read by [N, H, K]
    return torch.einsum("nhk,nhgkv->nhgv", q0, S0.unflatten(1, groups)).flatten(1, 2)


def _groups(H: int, HV: int) -> tuple[int, int]:
    """(H, G): the HV value heads as H runs of G = HV // H (G = 1 where there are no heads)."""
    return H, HV // H if H else 1


# The fused path: float32 on the CPU, the chunk form, sequences of equal length. The forward is
# the additive rule's fused C++ loop with the bonus (csrc/rules/additive.cpp: the exclusive read,
# a strictly lower A_qk with q's gate at G_{i-1} and Qd = scale q exp(G_{i-1}), the bonus on the
# diagonal) on the inputs themselves: o, S_T and the states entering every chunk in one pass, the
# states the additive rule's own. The backward is the additive rule's fused backward on q shifted
# one token earlier, q'_t = q_{t+1} (q'_{T-1} = 0), whose read of token t is S_t^T q_{t+1}, the
# read of token t + 1: with the same k, v, g and states, and d_o' shifted as q', its gradients of
# k, v, g and S_0 are RWKV-6's read's and its dq' is dq one token early; dq' is moved into place
# and the bonus's and the first read's gradients added, in place, block by block
# (``_bonus.shifted_bonus_backward_``). Two whole-sequence copies (q', d_o'), in the extension's
# cached blocks; the paired views cost the gradients of four views and of the bonus, added to
# the loop's (benchmarks/README.md, "RWKV-6 over GLA").


def _fused(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, S0: Tensor | None) -> bool:
    """Whether the fused path serves the call: float32 CPU tensors (``_native.applies``), T > 0,
    eager (a trace holds the paired ops instead)."""
    tensors = [x for x in (q, k, v, g, S0) if x is not None]
    return (
        q.shape[1] > 0
        and all(x.dtype == torch.float32 for x in tensors)
        and _native.applies(q)
        and not tracing(q)
    )


def _shifted(x: Tensor) -> Tensor:
    """x [B, T, ...] one token earlier: row t is x's row t + 1, the last row zeros (a copy, in
    the extension's cached blocks: ``_native.empty``, whose pages are not faulted in again)."""
    out = _native.empty(tuple(x.shape), x)
    out[:, :-1] = x[:, 1:]
    out[:, -1] = 0
    return out


def _fused_forward(q, k, v, g, u, S0, scale: float, C: int) -> tuple[Tensor, Tensor]:
    """(o [B, T, HV, V], S_T) on the fused path, through ``_FusedRWKV6`` where a gradient can
    flow back."""
    inputs = (q, k, v, g, u, S0)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs):
        return _FusedRWKV6.apply(q, k, v, g, u, S0, scale, C)
    o, S, _ = _fused_loop(q, k, v, g, u, S0, scale, C, keep=False)
    return o, S


def _internal(q, k, v, g, S0, C: int) -> tuple:
    """(q, k, v, g in the loop's layout [B, H, T, D] (views), S_0 (zeros without one), the chunk
    size as ``library.chunk`` passes it, the schema's (rule, gate))."""
    B, T, HV, V = v.shape
    qi, ki, vi, _, gi = to_internal(q, k, v, g=g)
    S_in = S0 if S0 is not None else q.new_zeros(B, HV, q.shape[-1], V)
    C = C if C <= MAX_CHUNK else min(C, T)
    return qi, ki, vi, gi, S_in, C, schema_args(Mechanism.of(None, g, "additive"))


def _fused_loop(q, k, v, g, u, S0, scale: float, C: int, keep: bool) -> tuple:
    """(o [B, T, HV, V], S_T, the states entering every chunk (keep; else empty)): the additive
    rule's fused loop with the bonus u (the comment above)."""
    qi, ki, vi, gi, S_in, C, mech = _internal(q, k, v, g, S0, C)
    bonus = u.to(torch.float32)
    o, S, states = _native.fused("chunk_forward")(qi, ki, vi, None, gi, S_in, scale, C, keep,
                                                  *mech, bonus=bonus)  # fmt: skip
    return o.transpose(1, 2), S, states


class _FusedRWKV6(torch.autograd.Function):
    """``_fused_loop`` with its gradient: the fused loop's backward on q', k, v, g with d_o'
    (d_o one token earlier), then dq' moved one token later and the first read's and the bonus's
    gradients added in place (``_bonus.shifted_bonus_backward_``). Double backward
    (``create_graph=True``) differentiates the composite (the paired ops) instead, as the chunk
    op's differentiates its all-blocks form (``chunk.differentiable_backward``)."""

    @staticmethod
    def forward(ctx, q, k, v, g, u, S0, scale: float, C: int):
        o, S, states = _fused_loop(q, k, v, g, u, S0, scale, C, keep=True)
        ctx.scale, ctx.C = scale, C
        ctx.save_for_backward(q, k, v, g, u, S0, states)
        ctx.set_materialize_grads(False)
        return o, S

    @staticmethod
    def backward(ctx, d_o: Tensor | None, d_S: Tensor | None) -> tuple:
        q, k, v, g, u, S0, states = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            return (*_composite_gradients(ctx, (q, k, v, g, u, S0), d_o, d_S), None, None)
        B, T, HV, V = v.shape
        d_next = v.new_zeros(B, T, HV, V) if d_o is None else _shifted(d_o)
        qi, ki, vi, gi, S_in, C, mech = _internal(_shifted(q), k, v, g, S0, ctx.C)
        d_S = torch.zeros_like(S_in) if d_S is None else d_S
        args = (qi, ki, vi, None, gi, states, d_next.transpose(1, 2), d_S, ctx.scale, C)
        dq, dk, dv, _, dg, dS0 = backward_kernel(*args, *mech)
        dq, dk, dv = (x.transpose(1, 2) for x in (dq, dk, dv))  # [B, T, ., D]
        d_o = d_next if d_o is None else d_o  # o unused: zeros
        dq_first, dS0 = _first_read_gradients(q, S0, d_o, ctx.scale, dS0)
        du = shifted_bonus_backward_(d_o, q, k, v, u, ctx.scale, dq, dk, dv, dq_first)
        dg = None if g is None else dg.transpose(1, 2).reshape(g.shape)
        return dq, dk, dv, dg, du.to(u.dtype), dS0 if S0 is not None else None, None, None


def _first_read_gradients(q, S0, d_o, scale: float, dS0) -> tuple[Tensor, Tensor]:
    """The gradients of token 0's read S_0^T (scale q_0): (dq_0 [B, 1, H, K], dS0 + its share)."""
    B, _, H, K = q.shape
    if S0 is None:
        return q.new_zeros(B, 1, H, K), dS0
    G = S0.shape[1] // H
    d0 = d_o[:, 0].to(S0.dtype).unflatten(1, (H, G))  # [B, H, G, V]
    q0 = q[:, 0].to(S0.dtype) * scale  # [B, H, K]
    dq0 = torch.einsum("bhgv,bhgkv->bhk", d0, S0.unflatten(1, (H, G))) * scale
    dS0 = dS0 + torch.einsum("bhk,bhgv->bhgkv", q0, d0).flatten(1, 2)
    return dq0.unsqueeze(1), dS0


def _composite_gradients(ctx, inputs: tuple, d_o, d_S) -> tuple:
    """The gradients of ``_composite`` (differentiable again) for the inputs that need one."""
    q, k, v, g, u, S0 = inputs
    with torch.enable_grad():
        o, S = _composite(q, k, v, g, u, ctx.scale, "chunk", ctx.C, S0, True, None)
    outputs, seeds = zip(*[(x, d) for x, d in ((o, d_o), (S, d_S)) if d is not None], strict=True)
    wanted = [x is not None and need for x, need in zip(inputs, ctx.needs_input_grad, strict=False)]
    return differentiable_gradients(outputs, seeds, inputs, wanted)
