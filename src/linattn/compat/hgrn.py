"""fla's HGRN: ``chunk_hgrn`` and ``fused_recurrent_hgrn``, the element-wise gated recurrence
h_t = exp(g_t) h_{t-1} + x_t, o_t = h_t (x, g [B, T, D]; Qin et al. 2023, eq. 3-4, in fla's
parametrisation).

It is linear attention with one head per channel d and K = V = 1 (q = k = 1, v = x[d], the
scalar decay g[d], scale 1): linattn's scalar-decay recurrence (spec section 10), exactly.
``hgrn`` runs it in any form; the registry's entry "hgrn" is this reparametrisation. Its chunk
form is ``linattn.ops.diagonal``'s (the same chunks, each step one operation over every channel,
where a matrix chunk kernel would spend its blocks on K = V = 1 heads); the parallel and recurrent
forms are ``linear_attention``'s. fla's ``chunk_hgrn`` kernel differentiates the output alone (its
final state is o's last row outside the graph, and it returns no gradient for the initial state);
here every gradient is autograd's (those of fla's naive reference and of its
``fused_recurrent_hgrn``).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from linattn.compat import _core
from linattn.dtypes import compute_dtype
from linattn.ops import checks as _checks
from linattn.ops.diagonal import diagonal_recurrence
from linattn.ops.diagonal import empty as _empty


def hgrn(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    mode: str = "recurrent",
    chunk_size: int = _core.CHUNK,
) -> tuple[Tensor, Tensor | None]:
    """HGRN in the form ``mode`` ("parallel", "recurrent" or "chunk"): h_t = exp(g_t) h_{t-1} + x_t
    per channel, o_t = h_t; x, g [B, T, D], states [N, D] (float32, float64 for float64 inputs)."""
    for name, t in (("x", x), ("g", g)):
        _core.check_tensor(name, t)
        if t.dim() != 3 or t.shape != x.shape:
            raise ValueError(f"{name} must have shape [B, T, D] as x, got {tuple(t.shape)}")
    _core.check_varlen(x, initial_state, cu_seqlens, "[N, D]")
    if mode == "chunk":
        return _chunk(x, g, initial_state, output_final_state, cu_seqlens, chunk_size)
    ones = torch.ones_like(x, dtype=_core.promote(x, g)).unsqueeze(-1)  # q = k = 1: [B, T, D, 1]
    S0 = None if initial_state is None else initial_state[..., None, None]  # [N, D, 1, 1]
    o, S = _core.run(
        ones, ones, x.unsqueeze(-1), delta=False, mode=mode, g=g, scale=1.0,
        initial_state=S0, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        chunk_size=chunk_size,
    )  # fmt: skip
    return o.squeeze(-1), None if S is None else S[..., 0, 0]  # [B, T, D], [N, D]


def _chunk(x, g, initial_state, output_final_state, cu_seqlens, chunk_size):
    """The chunk form by ``diagonal_recurrence``, sequence by sequence where packed; o in the
    promoted dtype of x and g (as the other forms), the state in the compute dtype."""
    chunk_size = _checks.options("chunk", chunk_size)
    out_dtype = _core.promote(x, g)
    dtype = compute_dtype(out_dtype)
    x, g = x.to(dtype), g.to(dtype)
    S0 = None if initial_state is None else initial_state.to(dtype)
    B, T, D = x.shape
    if cu_seqlens is None:
        pieces = [(slice(None), S0)]
    else:
        ends = cu_seqlens.tolist()
        pieces = [(slice(a, b), None if S0 is None else S0[n : n + 1])
                  for n, (a, b) in enumerate(itertools.pairwise(ends))]  # fmt: skip
    outs, states = [], []
    for rows, h0 in pieces:
        h = diagonal_recurrence(x[:, rows], g[:, rows], h0, chunk_size)
        outs.append(h)
        if h.shape[1]:
            states.append(h[:, -1])
        else:  # an empty sequence keeps its initial state (zeros without one)
            states.append(x.new_zeros(h.shape[0], D) if h0 is None else h0 + 0 * h.sum())
    o = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
    return o.to(out_dtype), torch.cat(states) if output_final_state else None


def fused_recurrent_hgrn(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_hgrn``: h_t = exp(g_t) h_{t-1} + x_t, per channel; states [N, D]."""
    return hgrn(x, g, initial_state, output_final_state, cu_seqlens, mode="recurrent")


def chunk_hgrn(
    x: Tensor,
    g: Tensor,
    initial_state: Tensor = None,
    output_final_state: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_hgrn`` (``fla.ops.hgrn`` only): ``fused_recurrent_hgrn`` in chunks of 128
    tokens (fla's block), without packed sequences; states [B, D]."""
    return hgrn(x, g, initial_state, output_final_state, mode="chunk", chunk_size=128)


class _ForgetGate(torch.autograd.Function):
    """(1 - f, log f) and the gradient df = dg / f - dk, each a single ``out=`` pass into the
    extension's cached pages."""

    @staticmethod
    def forward(ctx, f: Tensor):
        k, g = _empty(tuple(f.shape), f), _empty(tuple(f.shape), f)
        torch.add(f.new_ones(()).expand_as(f), f, alpha=-1, out=k)
        torch.log(f, out=g)
        ctx.save_for_backward(f)
        return k, g

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dk: Tensor | None, dg: Tensor | None):
        (f,) = ctx.saved_tensors
        df = _empty(tuple(f.shape), f)
        if dg is None:
            df.zero_()
        else:
            torch.div(dg, f, out=df)
        return df if dk is None else df.sub_(dk)


def hgrn2_gate(f: Tensor) -> tuple[Tensor, Tensor]:
    """HGRN2's keys and log-decays from its forget gate f in (0, 1] (Qin et al. 2024b): GLA with
    k_t = 1 - f_t and g_t = log f_t (spec section 10), both from one read of f."""
    _core.check_tensor("f", f)
    return _ForgetGate.apply(f)
