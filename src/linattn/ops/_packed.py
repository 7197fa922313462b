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
write-back cost more than the kernels themselves (each page faulted in and zeroed first). The
gather and the write-back are an autograd function each (``_Gather``,
``_Scatter``), each the other's gradient: autograd's own gradient of the indexing made a zero
tensor the size of a whole input for each batch, then summed them, so that training on packed
sequences cost more than on the same sequences padded into one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

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


class Plan(NamedTuple):
    """Where the rows of one batch (flattened: [m L], or [m]) are among the packed rows [R, ...]."""

    read: Tensor  # [n] the packed row each batch row reads (a padded row: its sequence's last)
    pad: Tensor  # the batch rows that are padding: zero when read, dropped when written
    write: Tensor  # [n] the packed row each batch row is written to (padding: the spare row R)


def _plan(bounds: list[int], members: list[int], L: int, device: torch.device) -> Plan:
    """The batch of the sequences ``members`` padded to L tokens, over the T packed tokens."""
    T = bounds[-1]
    starts = torch.tensor([bounds[n] for n in members])
    ends = torch.tensor([bounds[n + 1] for n in members])
    slots = (starts[:, None] + torch.arange(L)).flatten()  # [m L]
    padded = slots >= ends.repeat_interleave(L)
    read = torch.minimum(slots, torch.tensor(T - 1))
    write = slots.masked_fill(padded, T)
    return Plan(read.to(device), padded.nonzero().flatten().to(device), write.to(device))


def _rows(members: list[int], device: torch.device) -> Plan:
    """The rows ``members`` of [N, ...] (the sequences' states), no padding."""
    rows = torch.tensor(members, device=device)
    return Plan(rows, rows[:0], rows)


def _take(x: Tensor, plan: Plan) -> Tensor:
    """x [R, ...] -> [n, ...]: row i reads x[plan.read[i]], zero at the padded rows (one pass)."""
    out = x.index_select(0, plan.read)
    if plan.pad.numel():
        out.index_fill_(0, plan.pad, 0)
    return out


def _put(parts: tuple[Tensor, ...], plans: tuple[Plan, ...], R: int) -> Tensor:
    """The rows of ``parts`` (each [n, ...]) into [R, ...]: row i of a part to plan.write[i], the
    padded rows to a spare row R, dropped. The plans' rows cover [0, R) once (the batches
    partition the sequences), so every row is written and none summed. The result lies in the
    extension's cached blocks (``_native.empty``): written row by row into fresh memory, each
    page would be faulted in and zeroed first."""
    out = _native.empty((R + 1, *parts[0].shape[1:]), parts[0])
    for part, plan in zip(parts, plans, strict=True):
        out.index_copy_(0, plan.write, part)
    return out[:R]


class _Gather(torch.autograd.Function):
    """x [R, ...] -> one [n_b, ...] per plan (``_take``). Its gradient is the adjoint scatter
    (``_Scatter``: a packed row's gradient is that of the one batch row that read it), itself
    differentiable, so that double backward holds; autograd's own (a zero tensor the size of x
    per batch, summed) cost more than the kernels."""

    @staticmethod
    def forward(ctx, x: Tensor, plans: tuple[Plan, ...]) -> tuple[Tensor, ...]:
        ctx.plans, ctx.R = plans, x.shape[0]
        return tuple(_take(x, plan) for plan in plans)

    @staticmethod
    def backward(ctx, *grads: Tensor) -> tuple[Tensor, None]:
        return _Scatter.apply(ctx.plans, ctx.R, *grads), None


class _Scatter(torch.autograd.Function):
    """The parts [n_b, ...] -> [R, ...] (``_put``); its gradient is the adjoint gather
    (``_Gather``), zero at the padded rows."""

    @staticmethod
    def forward(ctx, plans: tuple[Plan, ...], R: int, *parts: Tensor) -> Tensor:
        ctx.plans = plans
        return _put(parts, plans, R)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple:
        return (None, None, *_Gather.apply(grad, ctx.plans))


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
    device = next(x for x in inputs if x is not None).device
    groups = batches(lengths)
    plans = tuple(_plan(bounds, members, lengths[members[0]], device) for members in groups)
    rows = tuple(_rows(members, device) for members in groups)
    # each input's rows of every batch, [m L, ...], gathered in one pass (``_Gather``)
    parts = [None if x is None else _Gather.apply(x.squeeze(0), plans) for x in inputs]
    states = (None,) * len(groups) if initial_state is None else _Gather.apply(initial_state, rows)
    outputs, finals = [], []
    for b, members in enumerate(groups):
        m, L = len(members), lengths[members[0]]
        batch = [None if x is None else x[b].view(m, L, *x[b].shape[1:]) for x in parts]
        o_b, S = forward(*batch, states[b])  # o_b [m, L, HV, V], S [m, HV, K, V]
        outputs.append(o_b.reshape(m * L, *o_b.shape[2:]))  # [m L, HV, V]
        finals.append(S)
    o = _Scatter.apply(plans, T, *outputs)  # [T, HV, V]
    return o.unsqueeze(0), _Scatter.apply(rows, N, *finals)
