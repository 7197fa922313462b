"""The small formulas the ops, layers, compat and integrations share, each written once.

- ``l2norm``: the query/key normalisation of DeltaNet-style layers (``use_qk_l2norm``);
- ``step_size`` and ``decay_gate``: Mamba-2's step size ``softplus(x + dt_bias)`` and the log-decay
  ``g = log(alpha) = -exp(A_log) * softplus(x + dt_bias)`` of Mamba-2, Gated DeltaNet and KDA
  (spec section 10); ``write_strength``: the delta rule's ``beta = sigmoid(x)``;
- ``causal_conv1d``: the short causal depthwise convolution in front of those mixers, with its
  generation state (the last inputs), so that prefill and decoding are one function, and
  ``conv_activation``, what follows it.

Each computes in the dtype of what it is given: the callers keep their own rules for casting
(the compute dtype, the weight's dtype) before and after.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def l2norm(x: Tensor, eps: float = 1e-6, *, divide: bool = False) -> Tensor:
    """``x / sqrt(|x|^2 + eps)`` along the last dimension, eps inside the root.

    ``divide=False`` computes it as ``x * rsqrt(...)`` (fla's kernels, transformers' Gated
    DeltaNet fallbacks, linattn's ``use_qk_l2norm``); ``divide=True`` as ``x / sqrt(...)``
    (transformers' KDA fallbacks): the two round differently, and each caller keeps the one of
    the code it matches.
    """
    sum_sq = (x * x).sum(dim=-1, keepdim=True)
    if divide:
        return x / torch.sqrt(sum_sq + eps)
    return x * torch.rsqrt(sum_sq + eps)


def step_size(
    x: Tensor,
    dt_bias: Tensor | None = None,
    *,
    softplus: bool = True,
    dtype: torch.dtype | None = None,
    limit: tuple[float, float] = (0.0, math.inf),
) -> Tensor:
    """Mamba-2's step size ``dt = clamp(softplus(x + dt_bias), *limit)`` (``dt_limit``).

    ``x + dt_bias`` is added in torch's promotion of the two, then cast to ``dtype`` (None:
    kept) before the softplus (``softplus=False``: without it). The default limit (0, inf)
    clamps nothing, since softplus is >= 0 already, and is skipped.
    """
    if dt_bias is not None:
        x = x + dt_bias
    if dtype is not None:
        x = x.to(dtype)
    if softplus:
        x = F.softplus(x)
    low, high = limit
    return x if (low, high) == (0.0, math.inf) else x.clamp(low, high)


def decay_gate(x: Tensor, A_log: Tensor, dt_bias: Tensor | None = None) -> Tensor:
    """The log-decay ``g = log(alpha) = -exp(A_log) * softplus(x + dt_bias) <= 0``.

    Mamba-2's ``dt A`` with ``A = -exp(A_log)``, as Gated DeltaNet (per head) and KDA (per key
    channel) compute their gates (spec section 10). ``A_log`` and ``dt_bias`` broadcast against
    x: A_log [H] for x [B, T, H], A_log [H, 1] and dt_bias [H, K] for x [B, T, H, K].
    """
    return -torch.exp(A_log) * step_size(x, dt_bias)


def write_strength(x: Tensor, allow_neg_eigval: bool = False) -> Tensor:
    """The delta rule's ``beta = sigmoid(x)`` in (0, 1), or ``2 sigmoid(x)`` in (0, 2) with
    ``allow_neg_eigval``: the transition ``I - beta k k^T`` (unit k) then has the eigenvalue
    ``1 - beta`` in (-1, 1) (Grazzi et al., 2025), not only in (0, 1) (spec section 7)."""
    beta = torch.sigmoid(x)
    return 2.0 * beta if allow_neg_eigval else beta


def causal_conv1d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The causal depthwise convolution, channels first, and its generation state.

    ``y[:, c, t] = bias[c] + sum_{j < W} weight[c, j] xs[:, c, t + S - W + 1 + j]`` over
    ``xs = cat(state, x)`` along time: x [B, D, T], weight [D, W], bias [D] or None; state
    [B, D, S], the S >= W - 1 inputs before x (None: zeros, S = W - 1; its first S - W + 1 are
    not read). Returns y [B, D, T] and the new state [B, D, S], the last S entries of xs (a
    view), so that a sequence convolved in pieces, passing the state along, gives the outputs of
    one call on the whole of it (decoding: T = 1).
    """
    D, W = weight.shape
    if state is None:
        state = x.new_zeros(x.shape[0], D, W - 1)
    S = state.shape[-1]
    if S < W - 1:
        raise ValueError(f"state holds {S} inputs; a kernel of width {W} needs at least {W - 1}")
    xs = torch.cat([state, x], dim=-1)  # [B, D, S + T]
    new_state = xs[..., xs.shape[-1] - S :]
    if xs.shape[-1] < W:  # T = 0 with S = W - 1: one window of zeros, so that conv1d runs
        xs = F.pad(xs, (W - xs.shape[-1], 0))
    y = F.conv1d(xs, weight.unsqueeze(1), bias, groups=D)  # weight [D, 1, W]: one per channel
    return y[..., y.shape[-1] - x.shape[-1] :], new_state  # the last T outputs


def conv_activation(y: Tensor, activation: str | None) -> Tensor:
    """The short convolution's activation: none, or SiLU (``"silu"``, or ``"swish"`` as fla and
    mamba-ssm also call it)."""
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
