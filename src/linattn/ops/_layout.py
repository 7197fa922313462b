"""The relayouts of the chunk form, in one place: public [B, T, H, D] <-> internal [B, H, T, D],
and internal sequences <-> chunks [N, B H groups, C, D] (spec section 5.1).

Internal layout: q, k [B, H, T, K]; v [B, HV, T, V]; beta [B, HV, T] or None; g None,
[B, HV, T, 1] (a gate per head) or [B, HV, T, K] (per channel). Grouped value heads: HV = groups H,
value head j reading q/k head j // groups; chunked, q's and k's heads are broadcast to the value
heads, so that every tensor of a group of chunks has the same P = B HV rows. Chunks are laid out
``[n, P, C, D]``, so that chunk j of every head, ``x[j]``, is one contiguous batch for the state
loop; a partial last chunk is zero-padded (k = v = 0, g = 0, beta = 0: the state is unchanged).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linattn.dtypes import LOW_DTYPES, compute_dtype


def to_internal(
    *tensors: Tensor | None,
    beta: Tensor | None = None,
    g: Tensor | None = None,
    keep_low: bool = False,
) -> tuple[Tensor | None, ...]:
    """Public [B, T, H, ...] tensors -> internal [B, H, T, ...] views in the compute dtype
    (float64 for float64 inputs, float32 otherwise: no copy in that dtype): ``tensors`` (q, k, v,
    ...), then beta [B, H, T] and g [B, H, T, 1 | K] (a gate per head [B, T, H] as one shared
    channel). ``keep_low``: bfloat16 and float16 tensors stay in their dtype (views, no copy),
    for the fused chunk kernels, which convert them chunk by chunk (csrc/convert.h)."""
    dtype = compute_dtype(tensors[0].dtype)

    def internal(x: Tensor) -> Tensor:
        keep = keep_low and dtype == torch.float32 and x.dtype in LOW_DTYPES
        return (x if keep else x.to(dtype)).transpose(1, 2)

    out = [internal(x) for x in tensors]
    if beta is not None:
        beta = internal(beta)  # [B, H, T]
    if g is not None:
        g = internal(g)
        g = g.unsqueeze(-1) if g.dim() == 3 else g  # [B, H, T, 1 | K]
    return (*out, beta, g)


def chunks(x: Tensor | None, C: int, groups: int = 1) -> Tensor | None:
    """[B, H, T, ...] -> [N, B H groups, C, ...], zero-padded at the end to N C tokens; head h
    broadcast to the value heads h groups, ..., h groups + groups - 1. A new tensor that autograd
    records (the all-blocks form); ``gather`` is the group loop's copy into a buffer."""
    if x is None:
        return None
    B, H, tail = x.shape[0], x.shape[1], x.shape[3:]
    pad = -x.shape[2] % C
    if pad:
        x = F.pad(x, [0, 0] * (x.dim() - 3) + [0, pad])  # F.pad lists the last dimension first
    # [B, H, N C, ...] -> [B, H, 1, N, C, ...] -> (groups, broadcast) -> [N, B, H, groups, C, ...]
    x = x.unflatten(2, (-1, C)).unsqueeze(2).expand(B, H, groups, -1, C, *tail)
    # one copy into the chunks' layout: [N, B H groups, C, ...]
    return x.movedim(3, 0).reshape(-1, B * H * groups, C, *tail)


def gather(
    x: Tensor | None, t0: int, t1: int, n: int, C: int, out: Tensor, scale=None, groups: int = 1
) -> Tensor | None:
    """Tokens [t0, t1) of x [B, H, T, ...] as chunks [n, B H groups, C, ...] in ``out`` (a reused
    buffer), zero-padded to n C, head h broadcast to its ``groups`` value heads: one strided copy
    (times ``scale`` if given)."""
    if x is None:
        return None
    B, H, tail = x.shape[0], x.shape[1], x.shape[3:]
    dst = out[:n].view(n, B, H, groups, C, *tail)
    full, rem = divmod(t1 - t0, C)
    # [B, H, full C, ...] -> [B, H, full, C, ...] -> [full, B, H, 1, C, ...] -> (groups, broadcast)
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


def scatter(dst: Tensor, y: Tensor, t0: int, t1: int) -> None:
    """Write chunks y [n, B H groups, C, ...] into tokens [t0, t1) of dst [B, H, T, ...], summing
    each head's ``groups`` value heads (the gradient of ``gather``'s broadcast; 1: a copy)."""
    B, H, tail = dst.shape[0], dst.shape[1], dst.shape[3:]
    n, C = y.shape[0], y.shape[2]
    groups = y.shape[1] // (B * H)
    src = y.view(n, B, H, groups, C, *tail)
    src = src[:, :, :, 0] if groups == 1 else src.sum(3)  # [n, B, H, C, ...]
    full, rem = divmod(t1 - t0, C)
    # [B, H, full C, ...] -> [full, B, H, C, ...], written in one strided copy
    dst[:, :, t0 : t0 + full * C].unflatten(2, (full, C)).movedim(2, 0).copy_(src[:full])
    if rem:
        dst[:, :, t0 + full * C : t1] = src[full, :, :, :rem]
