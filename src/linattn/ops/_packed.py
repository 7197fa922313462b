"""Packed sequences (``cu_seqlens``) run as batches, not one at a time.

N packed sequences [1, T, ...] (T = the sum of their lengths) are regrouped into a few batches of
sequences of similar length, each padded at its end to its longest member: [m, L_max, ...]. A
padded token has k = v = q = 0, beta = 0 (and a = b = 0) and log-decay g = 0, so its transition is
the identity and its write zero:

    S_t = Diag(exp 0) S_{t-1} + 0 = S_{t-1}     (additive, delta and dplr rules alike)

and a sequence's final state is the state after its last real token, exactly; outputs are causal,
so a real token never sees the padding after it. Chunks start at each sequence's first token, as
when it runs alone. The kernels then schedule the chunks of every sequence of a batch together
(parallel over sequences x heads), which a Python loop over sequences cannot.

Equal lengths (the common case of packed training batches) are one batch and a free view:
[1, N L, ...] -> [N, L, ...], no copy in or out. Otherwise sequences are sorted by length and cut
into batches whose shortest member is at least ``FILL`` of the longest, so that padding adds at most
1 - FILL of the work; a batch's inputs are gathered in one pass each, its outputs written back in
one (``index_copy_`` into the packed output). The packed output and final states are taken from
the extension's cached blocks (``_native.empty``): written row by row into fresh memory, the
write-back cost more than the kernels themselves (each page faulted in and zeroed first; with
mixed lengths, 256 sequences of 32-96 tokens: 126 ms a call of linear attention's, against 78 ms
of kernels).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from linattn.ops import _native

FILL = 7 / 8  # the shortest sequence of a batch has at least this fraction of the longest's tokens


def batches(lengths: list[int]) -> list[list[int]]:
    """The packed sequences' indices, grouped into batches of similar length (longest first):
    within a batch every length is at least ``FILL`` times the batch's longest."""
    order = sorted(range(len(lengths)), key=lambda n: -lengths[n])
    groups: list[list[int]] = []
    for n in order:
        if groups and lengths[n] >= FILL * lengths[groups[-1][0]]:
            groups[-1].append(n)
        else:
            groups.append([n])
    return groups


def _positions(bounds: list[int], members: list[int], L: int) -> tuple[Tensor, Tensor]:
    """For a batch of sequences ``members`` padded to L tokens: the packed position of each of its
    m L slots (flat [m L]), and the flat indices of its padded slots. A padded slot reads its
    sequence's last token (then zeroed) and writes the spare output row T (then dropped)."""
    starts = torch.tensor([bounds[n] for n in members])
    ends = torch.tensor([bounds[n + 1] for n in members])
    slots = starts[:, None] + torch.arange(L)  # [m, L]
    pad = (slots >= ends[:, None]).flatten()
    return slots.flatten(), pad.nonzero().flatten()


def _gather(x: Tensor | None, slots: Tensor, pad: Tensor, m: int, L: int) -> Tensor | None:
    """x [1, T, ...] -> [m, L, ...] at the packed positions ``slots`` [m L] (one pass), zero at the
    padded slots ``pad`` (only those rows written)."""
    if x is None:
        return None
    index = torch.minimum(slots, torch.tensor(x.shape[1] - 1)).to(x.device)
    out = x[0].index_select(0, index)  # [m L, ...]: a copy, its padded rows zeroed in place
    if pad.numel():
        out.index_fill_(0, pad.to(x.device), 0)
    return out.view(m, L, *x.shape[2:])


def run(
    bounds: list[int],
    inputs: tuple[Tensor | None, ...],
    initial_state: Tensor | None,
    forward: Callable[..., tuple[Tensor, Tensor]],
) -> tuple[Tensor, Tensor]:
    """``forward(*batched_inputs, initial_state)`` over the packed sequences of ``bounds``, as few
    batches as ``batches`` gives; inputs [1, T, heads, ...] (public layout), o [1, T, HV, V] and
    the final states [N, HV, K, V] in the sequences' order."""
    lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    N, T = len(lengths), bounds[-1]
    if N and all(L == lengths[0] for L in lengths):  # one batch, views in and out
        L = lengths[0]
        parts = [None if x is None else x.reshape(N, L, *x.shape[2:]) for x in inputs]
        o, S = forward(*parts, initial_state)  # o [N, L, HV, V]
        return o.reshape(1, T, *o.shape[2:]), S
    o = S_all = None  # o [T + 1, HV, V]: row T takes the padded slots' outputs, then is dropped
    for members in batches(lengths):
        m, L = len(members), lengths[members[0]]
        slots, pad = _positions(bounds, members, L)
        parts = [_gather(x, slots, pad, m, L) for x in inputs]
        S0 = None if initial_state is None else initial_state[members]
        o_b, S = forward(*parts, S0)  # o_b [m, L, HV, V], S [m, HV, K, V]
        if o is None:
            o = _native.empty((T + 1, *o_b.shape[2:]), o_b)
            S_all = _native.empty((N, *S.shape[1:]), S)
        where = slots.index_fill(0, pad, T).to(o.device)
        o.index_copy_(0, where, o_b.reshape(m * L, *o_b.shape[2:]))  # [m L, HV, V] rows
        S_all.index_copy_(0, torch.tensor(members, device=S.device), S)
    return o[:T].unsqueeze(0), S_all
