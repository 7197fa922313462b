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

Internal layout: q, k [B, H, T, K]; v [B, HV, T, V]; beta [B, HV, T] or None (additive rule); g
None, [B, HV, T, 1] or [B, HV, T, K]; states [B, HV, K, V]; the scale is already folded into q.
Grouped value heads (HV = G H, value head j reading q/k head j // G): q's and k's chunks broadcast
over each group (``chunks(..., G)``; autograd sums their gradients back).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from linattn.ops._blockmath import differentiable
from linattn.ops._chunk_terms import Terms
from linattn.ops.mechanism import Mechanism


def chunks(x: Tensor | None, C: int, G: int = 1) -> Tensor | None:
    """[B, H, T, ...] -> [N, B H G, C, ...] (the terms' layout), zero-padded at the end to N C
    tokens; head h broadcast to the G value heads h G, ..., h G + G - 1 (G = 1: as is).

    Padding tokens (k = v = 0, g = 0, beta = 0) leave the state unchanged.
    """
    if x is None:
        return None
    B, H, tail = x.shape[0], x.shape[1], x.shape[3:]
    pad = -x.shape[2] % C
    if pad:
        x = F.pad(x, [0, 0] * (x.dim() - 3) + [0, pad])  # F.pad lists the last dimension first
    # [B, H, N C, ...] -> [B, H, 1, N, C, ...] -> (G, broadcast) -> [N, B, H, G, C, ...]
    x = x.unflatten(2, (-1, C)).unsqueeze(2).expand(B, H, G, -1, C, *tail)
    # one copy into the terms' layout: [N, B H G, C, ...]
    return x.movedim(3, 0).reshape(-1, B * H * G, C, *tail)


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
    G = v.shape[1] // max(k.shape[1], 1)  # grouped value heads: q, k broadcast over G
    inputs = (chunks(x, C, G if i < 2 else 1) for i, x in enumerate((q, k, v, beta, g)))
    return Terms(*inputs, mech, differentiable, G)


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
    B, _, T, K = k.shape
    HV, V = v.shape[1], v.shape[-1]  # grouped value heads: HV = G H
    C = min(chunk_size, T)
    mech = Mechanism.internal(beta, g) if mech is None else mech
    terms = chunk_terms(q, k, v, beta, g, C, mech)
    S0 = initial_state if initial_state is not None else k.new_zeros(B, HV, K, V)
    # The only loop, over chunks: the state entering each, and the pseudo-values given it.
    states, U, S = terms.states(S0.reshape(B * HV, K, V))
    o = terms.outputs(U, states)  # [N, B HV, C, V]
    # [N, B HV, C, V] -> [B HV, N C, V] -> [B, HV, T, V]
    o = o.transpose(0, 1).reshape(B, HV, -1, V)[:, :, :T]
    return o, S.view(B, HV, K, V)
