"""Shared by the fused-loop tests (TTT-Linear's and Titans'): a float32 answer against float64,
and the outputs with the gradients of a random weighting of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 2e-5) -> None:
    """float32's rounding, relative to the largest entry of the float64 answer."""
    err = (got.double() - want).abs().max().item()
    assert err <= tol * max(1.0, want.abs().max().item()), (err, want.abs().max().item())


def outputs_and_gradients(
    call: Callable, t: Sequence[torch.Tensor], n_inputs: int, state: bool, seed: int = 0
) -> tuple:
    """``call(leaves)``'s outputs, and the gradients of sum(outputs x fixed random weights) with
    respect to the first ``n_inputs`` leaves, and the states' too when ``state``."""
    leaves = [x.clone().requires_grad_(True) for x in t]
    outs = call(leaves)
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outs, weights, strict=True))
    used = leaves if state else leaves[:n_inputs]
    return outs, torch.autograd.grad(loss, used)
