"""The chunk form with every chunk at once, through plain autograd (spec sections 5.1, 8).

One engine serves the whole DESIGN.md table. Linear attention is the case where the pseudo-values U
equal the values V; the delta rule is the case where U comes from the UT transform. Decay enters
only through the cumulative log-gate G of each chunk. For a chunk with incoming state S (K x V):

    U = U0 - W S                 (delta rule; U = V for linear attention)
    o = Qd S + A_qk U            S_next = D * S + Ke^T U

with the chunk terms (G, Qd, Ke, D, A_qk, I + L, W, U0) of ``_chunk_terms.Terms``, the same terms
and the same steps as the group loop of ``chunk_function``. Here they are computed for all chunks
at once with ``buffers=differentiable`` (new tensors, recorded by autograd); only the state
recurrence loops over chunks. This form runs the parallel form (one chunk of T tokens) and the
gradients of the chunk form that must be differentiable again (``create_graph=True``).

Internal layout: q, k [B, H, T, K]; v [B, H, T, V]; beta [B, H, T] or None (additive rule); g None,
[B, H, T, 1] or [B, H, T, K]; states [B, H, K, V]; the scale is already folded into q.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from linattn.ops._blockmath import differentiable
from linattn.ops._chunk_terms import Terms
from linattn.ops.mechanism import Mechanism


def chunks(x: Tensor | None, C: int) -> Tensor | None:
    """[B, H, T, ...] -> [N, B H, C, ...] (the terms' layout), zero-padded at the end to N C tokens.

    Padding tokens (k = v = 0, g = 0, beta = 0) leave the state unchanged.
    """
    if x is None:
        return None
    pad = -x.shape[2] % C
    if pad:
        x = F.pad(x, [0, 0] * (x.dim() - 3) + [0, pad])  # F.pad lists the last dimension first
    # [B, H, N C, ...] -> [B H, N, C, ...] -> [N, B H, C, ...]
    x = x.reshape(x.shape[0] * x.shape[1], -1, C, *x.shape[3:])
    return x.transpose(0, 1).contiguous()


def chunk_terms(
    q: Tensor | None,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    C: int,
    mech: Mechanism,
) -> Terms:
    """The differentiable terms of every chunk of C tokens at once, [N, B H, C, ...] each.

    q None: no output terms (Qd, A_qk), as for the affine maps.
    """
    inputs = (chunks(x, C) for x in (q, k, v, beta, g))
    return Terms(*inputs, mech, differentiable)


def chunk_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    g: Tensor | None,
    initial_state: Tensor | None,
    chunk_size: int,
    mech: Mechanism | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunk form for any chunk_size >= 1; returns o [B, H, T, V] and the final state.

    ``mech``: the mechanism the public op resolved (``Mechanism.of``); None for direct calls with
    internal tensors, whose g [B, H, T, 1] is then taken for a gate per head.
    """
    B, H, T, K = k.shape
    V = v.shape[-1]
    C = min(chunk_size, T)
    mech = Mechanism.internal(beta, g) if mech is None else mech
    terms = chunk_terms(q, k, v, beta, g, C, mech)
    S0 = initial_state if initial_state is not None else q.new_zeros(B, H, K, V)
    # The only loop, over chunks: the state entering each, and the pseudo-values given it.
    states, U, S = terms.states(S0.reshape(B * H, K, V))
    o = terms.outputs(U, states)  # [N, B H, C, V]
    # [N, B H, C, V] -> [B H, N C, V] -> [B, H, T, V]
    o = o.transpose(0, 1).reshape(B, H, -1, V)[:, :, :T]
    return o, S.view(B, H, K, V)
