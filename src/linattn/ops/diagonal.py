"""The diagonal (element-wise) linear recurrence h_t = exp(g_t) * h_{t-1} + x_t, in chunks.

Every channel is its own scalar-decay memory with K = V = 1 (spec section 10, the scalar decay of
Mamba-2's row with one-number states): HGRN's hidden state (Qin, Yang and Zhong 2023, eq. 3-4),
RWKV-4's sums a_t and b_t (Peng et al. 2023, eq. 14), and, run backwards, the gradient of a running
log-sum-exp (LightNet's normaliser). The matrix forms (linear attention with one head per channel)
spend a chunk kernel on K = V = 1 heads; here each step is one vectorised operation over every
channel instead.

The chunk form (spec section 5.1 with the states one number per channel): the sequence in chunks
of C tokens, all chunks at once,

1. every chunk from a zero state, token by token (C steps, each over all chunks and channels):
   the chunk's own end value l_j and its product of decays p_j = prod_{t in chunk j} exp(g_t);
2. the states entering the chunks, s_j = p_j s_{j-1} + l_j (s_0 the initial state): the same
   recurrence over the T / C chunk ends (computed by this function, recursively);
3. every chunk again, token by token from its entering state, writing h.

Each step is an ``addcmul`` over every chunk's slice (about 3 C + 3 (T / C)^(1/2) operations of
T D / C numbers each, for D channels), so the work is a few passes over the inputs and the Python
cost a few hundred operations at any length. Every h_t is the recurrence's own arithmetic, with
the products of decays of step 2 associated in chunks (rounding, not approximation): float64
matches the token loop to about 1e-15.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linattn.ops import _native, checks


def empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """An uninitialised tensor; a large one on the extension's cached huge pages
    (``_native.empty``), so that a fresh output is not faulted in page by page."""
    return _native.empty(shape, like)


def _rows(x: Tensor) -> Tensor:
    """x [B, T, ...] as [B, T, D] with the token rows of D numbers contiguous (a view where it
    can be; an expanded decay, stride 0 over T, stays expanded)."""
    B, T = x.shape[:2]
    D = math.prod(x.shape[2:])
    flat = x.reshape(B, T, D)
    if flat.stride(2) != 1 and D > 1:
        flat = flat.contiguous()
    return flat


def _decays(g: Tensor) -> Tensor:
    """exp(g) [B, T, D]; for a decay constant over the tokens (stride 0 over T), computed once and
    expanded."""
    if g.shape[1] > 1 and g.stride(1) == 0:
        return g[:, :1].exp().expand_as(g)
    a = empty(tuple(g.shape), g)
    return torch.exp(g, out=a)


def _sequential(a: Tensor, x: Tensor, h: Tensor, prev: Tensor | None, steps) -> Tensor | None:
    """h_t = a_t prev + x_t over ``steps`` (token indices, in order); the last h_t."""
    for t in steps:
        if prev is None:
            h[:, t].copy_(x[:, t])
        else:
            torch.addcmul(x[:, t], a[:, t], prev, out=h[:, t])
        prev = h[:, t]
    return prev


def scan(
    a: Tensor,
    x: Tensor,
    h0: Tensor | None,
    C: int,
    reverse: bool = False,
    out: Tensor | None = None,
    g: Tensor | None = None,
) -> Tensor:
    """h_t = a_t h_{t-1} + x_t (from the last token to the first if ``reverse``) for a, x
    [B, T, D] with contiguous rows, h0 [B, D] or None (zeros); the chunk form of the module
    docstring, into ``out`` (a [B, T, D] tensor with contiguous rows) where given. ``g``: log a,
    where known (each chunk's product of decays is then exp of one sum). No autograd."""
    B, T, D = x.shape
    h = empty((B, T, D), x) if out is None else out
    n, r = divmod(T, C)
    if n < 2 or C < 2:  # one chunk, or chunks of one token: the token loop
        _sequential(a, x, h, h0, range(T - 1, -1, -1) if reverse else range(T))
        return h
    # The n whole chunks from the scan's start: the last n C tokens of a reversed scan.
    s = r if reverse else 0
    av, xv, hv = (t[:, s : s + n * C].view(B, n, C, D) for t in (a, x, h))
    steps = range(C - 1, -1, -1) if reverse else range(C)
    first, *rest = steps
    local = xv[:, :, first].clone()
    for c in rest:
        torch.addcmul(xv[:, :, c], av[:, :, c], local, out=local)
    if g is None:
        log_product = None
        product = av.prod(2)
    else:
        log_product = g[:, s : s + n * C].view(B, n, C, D).sum(2)
        product = log_product.exp()
    # [B, n, D]: the state after each chunk
    ends = scan(product, local, h0, C, reverse, g=log_product)
    start = torch.zeros_like(local[:, :1]) if h0 is None else h0[:, None]
    if reverse:
        entering = torch.cat([ends[:, 1:], start], 1)
    else:
        entering = torch.cat([start, ends[:, :-1]], 1)
    prev = entering
    for c in steps:
        torch.addcmul(xv[:, :, c], av[:, :, c], prev, out=hv[:, :, c])
        prev = hv[:, :, c]
    # The r tokens past the whole chunks: after them (forward) or before them (reversed).
    if reverse:
        _sequential(a, x, h, h[:, r], range(r - 1, -1, -1))
    else:
        _sequential(a, x, h, h[:, n * C - 1], range(n * C, T))
    return h


class _Diagonal(torch.autograd.Function):
    """h = scan(exp g, x, h0) with its gradients: with r_t = dh_t + exp(g_{t+1}) r_{t+1} (the
    same recurrence backwards), dx_t = r_t, dg_t = r_t exp(g_t) h_{t-1}, dh_0 = exp(g_1) r_1."""

    @staticmethod
    def forward(ctx, g: Tensor, x: Tensor, h0: Tensor | None, C: int) -> Tensor:
        a = _decays(g)
        h = scan(a, x, h0, C, g=g)
        ctx.save_for_backward(g, a, h, h0)
        ctx.C = C
        return h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dh: Tensor):
        g, a, h, h0 = ctx.saved_tensors
        B, T, D = h.shape
        dh = dh.contiguous()
        r = empty((B, T, D), h)
        r[:, -1] = dh[:, -1]
        if T > 1:
            scan(a[:, 1:], dh[:, :-1], r[:, -1], ctx.C, reverse=True, out=r[:, :-1], g=g[:, 1:])
        dg = dh0 = None
        if ctx.needs_input_grad[0]:
            dg = empty((B, T, D), h)
            torch.mul(r[:, 1:], h[:, :-1], out=dg[:, 1:])
            if h0 is None:
                dg[:, 0].zero_()
            else:
                torch.mul(r[:, 0], h0, out=dg[:, 0])
            dg.mul_(a)
        if h0 is not None and ctx.needs_input_grad[2]:
            dh0 = a[:, 0] * r[:, 0]
        return dg, r, dh0, None


def diagonal_recurrence(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor | None = None,
    chunk_size: int = 64,
) -> Tensor:
    """h_t = exp(g_t) * h_{t-1} + x_t element-wise along dim 1 (spec section 10's scalar decay
    with one number per channel; HGRN, Qin, Yang and Zhong 2023), by the chunk form of the module
    docstring; differentiable in x, g and the initial state.

    Args:
        x: [B, T, ...] the values written. g: log-decays (<= 0) of x's shape, or broadcast to it
            by ``expand`` (a decay constant over the tokens: stride 0 over T, exp taken once).
        initial_state: h_0 [B, ...] (x's shape without T), or None (zeros).
        chunk_size: the chunk length C >= 1 (any; the result does not depend on it beyond
            rounding).

    Returns:
        h [B, T, ...] in x's dtype (h_T is h[:, -1]).
    """
    checks.tensor("x", x, x.dim() if isinstance(x, Tensor) else 0)
    if x.dim() < 2:
        raise ValueError(f"x must have shape [B, T, ...], got {tuple(x.shape)}")
    checks.tensor("g", g, x.dim(), finite=False)
    if g.shape != x.shape or g.dtype != x.dtype:
        raise ValueError(
            f"g must have x's shape {tuple(x.shape)} and dtype {x.dtype}, got {tuple(g.shape)}, "
            f"{g.dtype}"
        )
    if g.numel():
        low, high = (
            float(t) for t in torch.aminmax(g.detach()[:, :1] if g.stride(1) == 0 else g.detach())
        )
        if math.isnan(low) or math.isnan(high):
            raise ValueError("g contains NaN")
        if high > 0:
            raise ValueError(f"g is a log-decay and must be <= 0; got max {high}")
    if initial_state is not None:
        checks.tensor("initial_state", initial_state, x.dim() - 1)
        if initial_state.shape != x.shape[:1] + x.shape[2:] or initial_state.dtype != x.dtype:
            raise ValueError(
                f"initial_state must have shape {(x.shape[0], *x.shape[2:])} and dtype "
                f"{x.dtype}, got {tuple(initial_state.shape)}, {initial_state.dtype}"
            )
    chunk_size = checks.options("chunk", chunk_size)
    B, T = x.shape[:2]
    if T == 0:
        return x + g  # empty, in the graph of both
    h0 = None if initial_state is None else initial_state.reshape(B, -1)
    h = _Diagonal.apply(_rows(g), _rows(x), h0, chunk_size)
    return h.view(x.shape)
