"""The layers' short convolution on rows of channels, fused with its SiLU on the CPU.

    z[b, t, c] = sum_{j < W} w[c, j] xs[b, t + j - (W - 1), c],   y = silu(z) or z

xs: the last W - 1 inputs of ``state`` [B, C, S] (zeros without one), then x [B, T, C]. This is
``functional.causal_conv1d`` (channels first) and ``conv_activation`` in the layout the layers
hold ([B, T, C], as the projections write it), which DeltaNet's, Gated DeltaNet's, KDA's and
Mamba-2's ``ShortConvolution`` run on q, k and v before the mixer. In float32 on the CPU it is
one pass of ``csrc/conv.cpp`` forward and one backward (z recomputed there, nothing saved but the
inputs): no transposes and no SiLU pass of its own, which PyTorch's convolution for a depthwise
filter of 3 or 4 taps needs (``benchmarks/README.md``). Elsewhere (float64,
bfloat16, GPUs, a trace, the extension unavailable, T = 0, a second derivative) the PyTorch
formula runs; both are tested against it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linattn.ops import _native
from linattn.ops.functional import causal_conv1d, conv_activation


def short_conv(
    x: Tensor, weight: Tensor, state: Tensor | None = None, activation: str | None = "silu"
) -> tuple[Tensor, Tensor]:
    """x [B, T, C], weight [C, W], state [B, C, S >= W - 1] or None -> (y [B, T, C], new state).

    The new state is the last S inputs of xs, [B, C, S] (S = W - 1 without a state), so that a
    sequence convolved in pieces, passing the state along, gives one call's outputs.
    ``activation``: ``"silu"`` (``"swish"``) or None.
    """
    if activation not in ("silu", "swish", None):
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    if _fused_applies(x, weight, state):
        y = _ShortConv.apply(x, weight, state, activation is not None)
        return y, _new_state(x, weight.shape[1], state)
    y, new_state = causal_conv1d(x.transpose(1, 2), weight, state=state)  # [B, C, T]
    return conv_activation(y, activation).transpose(1, 2), new_state


def _fused_applies(x: Tensor, weight: Tensor, state: Tensor | None) -> bool:
    """float32 CPU tensors of the op's shapes, outside a trace, the extension loaded."""
    tensors = [x, weight] + ([] if state is None else [state])
    return (
        not torch.compiler.is_compiling()
        and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
        and x.dim() == 3
        and x.shape[1] > 0
        and weight.dim() == 2
        and _native.available()
    )


def _new_state(x: Tensor, W: int, state: Tensor | None) -> Tensor:
    """The last S entries of xs = cat(state, x) along time, [B, C, S], a tensor of its own (a
    cache that updates it in place must not write into x, which the backward reads)."""
    S = W - 1 if state is None else state.shape[-1]
    T = x.shape[1]
    if T >= S:
        return x[:, T - S :].transpose(1, 2).clone()  # [B, S, C] -> [B, C, S]
    head = x.new_zeros(x.shape[0], x.shape[2], S - T) if state is None else state[..., T:]
    return torch.cat([head, x.transpose(1, 2)], dim=-1)


def _reference(x: Tensor, weight: Tensor, state: Tensor | None, silu: bool) -> Tensor:
    """The PyTorch formula (``causal_conv1d`` and the SiLU), differentiable to any order."""
    y, _ = causal_conv1d(x.transpose(1, 2), weight, state=state)
    return conv_activation(y, "silu" if silu else None).transpose(1, 2)


class _ShortConv(torch.autograd.Function):
    """``short_conv``'s output through ``csrc/conv.cpp``, forward and backward; a second
    derivative (``create_graph=True``) differentiates the PyTorch formula instead."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, state: Tensor | None, silu: bool) -> Tensor:
        ctx.save_for_backward(x, weight, state)
        ctx.silu = silu
        return _native.kernel("short_conv_forward")(x.contiguous(), weight, None, state, silu)

    @staticmethod
    def backward(ctx, dy: Tensor):
        x, weight, state = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the formula's graph, differentiable again
            wanted = [t for t in (x, weight, state) if t is not None and t.requires_grad]
            y = _reference(x, weight, state, ctx.silu)
            grads = iter(torch.autograd.grad(y, wanted, dy, create_graph=True))
            out = [next(grads) if t is not None and t.requires_grad else None
                   for t in (x, weight, state)]  # fmt: skip
            return out[0], out[1], out[2], None
        dx, dw, _, dstate = _native.kernel("short_conv_backward")(
            dy, x.contiguous(), weight, None, state, ctx.silu
        )
        return dx, dw, (dstate if state is not None else None), None
