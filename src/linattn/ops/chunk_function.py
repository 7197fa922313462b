"""The chunk form as one autograd function: groups of chunks, memory linear in T (spec 5.1, 8).

The sequence is processed in groups of chunks sized to stay in the cache (``GROUP_TOKENS`` tokens
of all heads). Within a group, every state-independent term (gates, masks, the UT transform's
inverse, W, U0; ``_chunk_terms.Terms``) is computed for all its chunks at once in batched products;
only the state recurrence loops over chunks, two small batched products per chunk:

    U_j = U0_j - W_j S_j;    S_{j+1} = D_j * S_j + Ke_j^T U_j       (delta rule)
    S_{j+1} = D_j * S_j + Ke_j^T v_j                                 (linear attention: one
                                                                       batched product, then a sum)

then the outputs of the group are two batched products, ``o = Qd S + A_qk U``. The forward pass
saves only the inputs and the state entering each chunk (T / C states of K x V per head); the
backward pass recomputes each group's terms from them and runs the state gradient backwards:

    dU_j = A_qk_j^T dO_j + Ke_j dS_{j+1};   dS_j = D_j * dS_{j+1} + Qd_j^T dO_j - W_j^T dU_j

The public ops reach it through the op ``linattn::chunk_forward`` (``library``), which runs float32
CPU inputs fused in C++ instead, chunk by chunk with every block in the cache (``_native``, every
mechanism); this group loop serves float64, GPUs and ``LINATTN_NATIVE=0``, and is what the fused
code is tested against.
Neither is recorded by autograd: with ``create_graph=True`` (double backward) the gradients come
from plain autograd through the all-blocks form ``chunk.chunk_forward`` instead.

Internal layout as in ``chunk``: q, k [B, H, T, K]; v [B, HV, T, V]; beta [B, HV, T] or None; g
None, [B, HV, T, 1] or [B, HV, T, K]; states [B, HV, K, V]. The scale multiplies q inside. Grouped
value heads (HV = G H; G = 1 the plain case): value head j reads q/k head j // G, in place: each
group's copy of q and k into its chunk buffers (made for every G) broadcasts a q/k head over its G
value heads, and the backward sums their gradients of q and k over each group.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import _native, tuning
from linattn.ops._chunk_terms import Buffers, Terms
from linattn.ops.chunk import chunk_forward
from linattn.ops.mechanism import Mechanism

NAMES = ("q", "k", "v", "beta", "g")


def _gather(
    x: Tensor | None,
    t0: int,
    t1: int,
    n: int,
    C: int,
    out: Tensor | None = None,
    scale=None,
    G: int = 1,
) -> Tensor | None:
    """Tokens [t0, t1) of x [B, H, T, ...] as chunks [n, B * H * G, C, ...], zero-padded to n C,
    head h broadcast to the G heads h G, ..., h G + G - 1 (grouped value heads; G = 1: as is).

    One strided copy (times ``scale`` if given) into ``out`` (a reused buffer) when given.
    """
    if x is None:
        return None
    B, H, tail = x.shape[0], x.shape[1], x.shape[3:]
    if out is None:
        out = x.new_empty(n, B * H * G, C, *tail)
    dst = out[:n].view(n, B, H, G, C, *tail)
    full, rem = divmod(t1 - t0, C)
    # [B, H, full C, ...] -> [B, H, full, C, ...] -> [full, B, H, 1, C, ...] -> (G, broadcast)
    src = x[:, :, t0 : t0 + full * C].unflatten(2, (full, C)).movedim(2, 0).unsqueeze(3)
    src = src.expand(dst[:full].shape)
    if scale is None:
        dst[:full].copy_(src)
    else:
        torch.mul(src, scale, out=dst[:full])
    if rem:
        last = dst[full]
        last.zero_()
        tail_rows = x[:, :, t0 + full * C : t1].unsqueeze(2)  # [B, H, 1, rem, ...]
        last[:, :, :, :rem] = tail_rows if scale is None else tail_rows * scale
    return out[:n]


def _scatter(dst: Tensor, y: Tensor, t0: int, t1: int) -> None:
    """Write chunks y [n, B * H * G, C, ...] into tokens [t0, t1) of dst [B, H, T, ...], summing
    each group of G heads (the gradient of ``_gather``'s broadcast; G = 1: a copy)."""
    B, H, tail = dst.shape[0], dst.shape[1], dst.shape[3:]
    n, C = y.shape[0], y.shape[2]
    G = y.shape[1] // (B * H)
    src = y.view(n, B, H, G, C, *tail)
    src = src[:, :, :, 0] if G == 1 else src.sum(3)  # [n, B, H, C, ...]
    full, rem = divmod(t1 - t0, C)
    # [B, H, full C, ...] -> [full, B, H, C, ...], written in one strided copy
    dst[:, :, t0 : t0 + full * C].unflatten(2, (full, C)).movedim(2, 0).copy_(src[:full])
    if rem:
        dst[:, :, t0 + full * C : t1] = src[full, :, :, :rem]


def _groups(T: int, C: int, P: int):
    """(first chunk, t0, t1, chunks) of each group of whole chunks covering T tokens."""
    n_chunks = -(-T // C)
    per_group = _chunks_per_group(C, P)
    for c0 in range(0, n_chunks, per_group):
        n = min(per_group, n_chunks - c0)
        yield c0, c0 * C, min(T, (c0 + n) * C), n


def _chunks_per_group(C: int, P: int) -> int:
    """Chunks per group for chunks of C tokens of P heads."""
    return max(1, tuning.GROUP_ROWS_PER_THREAD * torch.get_num_threads() // (C * P))


class _Gatherer:
    """Reused group buffers for q (scaled), k, v, beta, g (, d_o): one strided copy each per
    group, every tensor's chunks for the P = B HV value heads (q and k broadcast over groups)."""

    def __init__(self, tensors, C: int, scale: float) -> None:
        self.tensors, self.C, self.scale = tensors, C, scale
        B, HV = tensors[2].shape[:2]  # v: the value heads
        self.G = HV // max(tensors[0].shape[1], 1)
        n = _chunks_per_group(C, B * HV)
        self.buffers = [
            None if x is None else x.new_empty(n, B * HV, C, *x.shape[3:]) for x in tensors
        ]

    def __call__(self, t0: int, t1: int, n: int):
        return tuple(
            _gather(x, t0, t1, n, self.C, buf, self.scale if i == 0 else None, self._G(i))
            for i, (x, buf) in enumerate(zip(self.tensors, self.buffers, strict=True))
        )

    def _G(self, i: int) -> int:
        return self.G if i < 2 else 1  # q and k: broadcast over their group of value heads


class ChunkFunction(torch.autograd.Function):
    """o, S_final = chunk form of ``S_t = A_t S_{t-1} + k_t w_t^T`` (DESIGN.md's table)."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, S0, scale: float, C: int, mech: Mechanism):
        B, _, T, K = k.shape
        HV, V = v.shape[1], v.shape[-1]  # grouped value heads: HV = G H
        P = B * HV
        n_chunks = -(-T // C)
        # The state entering every chunk is kept for the backward pass only; without one (no
        # input needs a gradient, e.g. under no_grad) a group-sized buffer is reused, which
        # spares a fresh T / C x K x V allocation (its page faults) and keeps the states in cache.
        keep = any(ctx.needs_input_grad)
        ctx.scale, ctx.C, ctx.mech = scale, C, mech
        if keep:
            states = _native.empty((n_chunks, P, K, V), q)
        else:
            group_states = q.new_empty(_chunks_per_group(C, P), P, K, V)
        # Allocated in the public layout [B, T, H, V] and written through its [B, H, T, V] view,
        # so that the caller gets a contiguous output (a layer's reshape to [B, T, H V] is free).
        o = _native.empty((B, T, HV, V), q).transpose(1, 2)
        S = S0.reshape(P, K, V)
        gather = _Gatherer((q, k, v, beta, g), C, scale)
        buffers = Buffers()
        for c0, t0, t1, n in _groups(T, C, P):
            qg, kg, vg, bg, gg = gather(t0, t1, n)
            terms = Terms(qg, kg, vg, bg, gg, mech, buffers, gather.G)
            st = states[c0 : c0 + n] if keep else group_states[:n]  # [n, P, K, V]
            _, U, S = terms.states(S, st)
            _scatter(o, terms.outputs(U, st), t0, t1)
        if keep:
            ctx.save_for_backward(q, k, v, beta, g, S0, states)
        return o, S.view(B, HV, K, V)

    @staticmethod
    def backward(ctx, d_o, d_S):
        return (*ChunkFunction.gradients(ctx, d_o, d_S), None)  # none for the mechanism

    @staticmethod
    def gradients(ctx, d_o, d_S):
        """The gradients of the eight tensor and number inputs (None for the numbers)."""
        if torch.is_grad_enabled():
            # create_graph=True: gradients that can be differentiated again (issue 18).
            return _differentiable_backward(ctx, d_o, d_S)
        q, k, v, beta, g, _, states = ctx.saved_tensors
        scale, C = ctx.scale, ctx.C
        B, _, T, K = k.shape
        HV, V = v.shape[1], v.shape[-1]
        P = B * HV
        inputs = (q, k, v, beta, g)
        grads = {
            name: _empty_like(x) if x is not None and needed else None
            for name, x, needed in zip(NAMES, inputs, ctx.needs_input_grad[:5], strict=True)
        }
        dS = q.new_zeros(P, K, V) if d_S is None else d_S.reshape(P, K, V).clone()
        gather = _Gatherer((q, k, v, beta, g, d_o), C, scale)
        buffers = Buffers()
        for c0, t0, t1, n in reversed(list(_groups(T, C, P))):
            qg, kg, vg, bg, gg, dO = gather(t0, t1, n)
            terms = Terms(qg, kg, vg, bg, gg, ctx.mech, buffers, gather.G)
            st = states[c0 : c0 + n]  # [n, P, K, V]
            U = terms.pseudo_values(st)  # [n, P, C, V]
            dS_next = q.new_empty(n, P, K, V)  # gradient of the state leaving each chunk
            dU, dS = _state_loop_backward(terms, dO, dS, dS_next)
            dQd = dO @ st.transpose(-1, -2)  # [n, P, C, K]
            dA_qk = dO @ U.transpose(-1, -2)  # [n, P, C, C]
            dKe = U @ dS_next.transpose(-1, -2)  # [n, P, C, K]
            dD = None
            if ctx.mech.decays:
                dD = (dS_next * st).sum(-1, keepdim=True)  # [n, P, K, 1]
                if ctx.mech.gate == "head":
                    dD = dD.sum(-2, keepdim=True)
            dq, dk, dv, dbeta, dg = terms.gradients(dQd, dA_qk, dKe, dD, dU, st)
            dq.mul_(scale)
            for name, value in zip(NAMES, (dq, dk, dv, dbeta, dg), strict=True):
                if grads[name] is not None:
                    _scatter(grads[name], value, t0, t1)
        dS0 = dS.view(B, HV, K, V)
        return grads["q"], grads["k"], grads["v"], grads["beta"], grads["g"], dS0, None, None


def _differentiable_backward(ctx, d_o: Tensor, d_S: Tensor | None) -> tuple:
    """The backward pass as plain autograd, for ``create_graph=True`` (double backward).

    The fused and group-loop backward passes write into preallocated buffers (``out=``), which
    autograd cannot record. With grad mode on, the gradients are instead those of the same algebra
    in its all-blocks-at-once form (``chunk.chunk_forward``, plain autograd, the engine of the
    parallel form), recomputed from the saved inputs with ``torch.autograd.grad(...,
    create_graph=True)``: so they are themselves differentiable, exactly, with respect to the
    inputs and to ``d_o`` and ``d_S``. Memory is that of the parallel engine in blocks of C
    tokens (the scores of every block at once), a price paid only for higher-order gradients.
    """
    q, k, v, beta, g, S0, _ = ctx.saved_tensors
    inputs = (q, k, v, beta, g, S0)
    wanted = [x is not None and need for x, need in zip(inputs, ctx.needs_input_grad, strict=False)]
    o, S = chunk_forward(q * ctx.scale, k, v, beta, g, S0, ctx.C, ctx.mech)
    outputs, seeds = [o], [d_o]
    if d_S is not None:
        outputs.append(S)
        seeds.append(d_S)
    chosen = [x for x, w in zip(inputs, wanted, strict=True) if w]
    found = iter(torch.autograd.grad(outputs, chosen, seeds, create_graph=True, allow_unused=True))
    grads = []
    for x, w in zip(inputs, wanted, strict=True):
        grad = next(found) if w else None
        grads.append(torch.zeros_like(x) if w and grad is None else grad)
    return (*grads, None, None)


def _empty_like(x: Tensor) -> Tensor:
    """``torch.empty_like(x)``, on huge pages (``_native.empty``) for the [B, H, T, D] views of
    [B, T, H, D] tensors that q, k and v are."""
    if x.dim() == 4 and x.transpose(1, 2).is_contiguous():
        B, H, T, D = x.shape
        return _native.empty((B, T, H, D), x).transpose(1, 2)
    return torch.empty_like(x)


def _state_loop_backward(
    terms: Terms, dO: Tensor, dS: Tensor, dS_next: Tensor
) -> tuple[Tensor, Tensor]:
    """Run the state gradient backwards through the group; fill ``dS_next`` [n, P, K, V] (the
    gradient of the state leaving each chunk); return dU and the gradient of the entering state.

    dU_j = A_qk_j^T dO_j + Ke_j dS_{j+1};   dS_j = D_j dS_{j+1} + Qd_j^T dO_j - W_j^T dU_j.
    """
    n = dO.shape[0]
    dU = terms.A_qk.transpose(-1, -2) @ dO  # [n, P, C, V]: the part that does not need dS
    dS_local = terms.Qd.transpose(-1, -2) @ dO  # [n, P, K, V]
    dS_next[n - 1] = dS
    dS_in = torch.empty_like(dS)
    for j in range(n - 1, -1, -1):
        out = dS_next[j - 1] if j > 0 else dS_in
        dS_j = dS_next[j]
        if terms.mech.delta:
            dU[j].baddbmm_(terms.Ke[j], dS_j)
            dS_local[j].baddbmm_(terms.W[j].transpose(-1, -2), dU[j], alpha=-1)
        if not terms.mech.decays:
            torch.add(dS_local[j], dS_j, out=out)
        else:
            torch.addcmul(dS_local[j], terms.D[j], dS_j, out=out)
    if not terms.mech.delta:
        dU.add_(terms.Ke @ dS_next)
    return dU, dS_in
