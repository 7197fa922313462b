"""Helpers for comparing our layers with transformers' layers on the CPU, in float64 and float32.

- ``torch_fallbacks(modeling)``: transformers binds fla's Triton kernels when fla is installed
  (they fail on the CPU); the module-level names are pointed back at the pure-PyTorch functions of
  the modeling file (``__wrapped__``, the function the kernel decorator wrapped).
- ``promoted(modeling)``: inside the block, the modeling file's ``torch.float32`` and every
  ``Tensor.float()`` keep float64 tensors in float64, so that a float64 comparison is not limited
  by their float32 casts (the issue: "promote their float32 casts for the comparison").
- ``perturb(module)``: every parameter moved off its initial value (ones, zeros), so that a weight
  copied to the wrong place cannot go unnoticed.
- ``relative_error(a, b)``: ||a - b|| / ||b||.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

KERNELS = (
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
    "chunk_kimi_delta_attention",
    "recurrent_kimi_delta_attention",
    "causal_conv1d_fn",
    "causal_conv1d_update",
)


def torch_fallbacks(monkeypatch, modeling) -> None:
    for name in KERNELS:
        function = getattr(modeling, name, None)
        if function is not None and hasattr(function, "__wrapped__"):
            monkeypatch.setattr(modeling, name, function.__wrapped__)


class _Float64Torch:
    """``torch``, with ``float32`` (and its alias ``float``) standing for float64."""

    def __getattr__(self, name):
        return torch.float64 if name in ("float32", "float") else getattr(torch, name)


@contextlib.contextmanager
def promoted(modeling):
    original_float = torch.Tensor.float

    def keep_float64(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else original_float(self, *args, **kwargs)

    saved = modeling.torch
    modeling.torch, torch.Tensor.float = _Float64Torch(), keep_float64
    try:
        yield
    finally:
        modeling.torch, torch.Tensor.float = saved, original_float


def perturb(module: nn.Module, seed: int = 0, scale: float = 0.2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm())


def gradients_as_module(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters hold its gradients: a converter run on it gives the
    gradients in our layout (the converters only copy and reshape)."""
    grads = copy.deepcopy(module)
    with torch.no_grad():
        for p, q in zip(grads.parameters(), module.parameters(), strict=True):
            p.copy_(q.grad)
    return grads


def gradients(layer: nn.Module, x: torch.Tensor, w: torch.Tensor) -> tuple:
    """The layer's output y for x, and the gradients of sum(y w) for x and for every parameter
    (by name)."""
    x = x.clone().requires_grad_()
    y = layer(x)[0]
    (y * w).sum().backward()
    return y, x.grad, {n: p.grad for n, p in layer.named_parameters()}


def check_from_fla(module: nn.Module, cls: type, shape: tuple[int, ...]) -> tuple:
    """``cls.from_fla(module)`` against fla's layer ``module`` (float32) with the same weights,
    on random x and output weights w of ``shape`` ([B, T, D], drawn after the conversions): as
    many parameters; fla's forward, input and weight gradients (the weights' in our layout: the
    converter run on a copy holding them) and ours in float32 each within 1e-5 (relative) of ours
    in float64. Returns (ours in float64, x, fla's output), for a decoding check."""
    ours32 = cls.from_fla(module)
    count = sum(p.numel() for p in ours32.parameters())
    assert count == sum(p.numel() for p in module.parameters())
    ours64 = cls.from_fla(module).double()
    x, w = torch.randn(2, *shape)
    truth = gradients(ours64, x.double(), w.double())
    y_fla, dx_fla, _ = gradients(module, x, w)
    grads = cls.from_fla(gradients_as_module(module))
    for y, dx, dw in ((y_fla, dx_fla, dict(grads.named_parameters())), gradients(ours32, x, w)):
        assert relative_error(y.double(), truth[0]) < 1e-5, "forward"
        assert relative_error(dx.double(), truth[1]) < 1e-5, "input gradient"
        for n, g in truth[2].items():
            assert relative_error(dw[n].double(), g) < 1e-5, n
    return ours64, x, y_fla
