"""``float64_casts()``: run another library's pure-PyTorch layer in float64 end to end.

Reference layers (transformers' ``Mamba2Mixer``, fla's naive paths) cast to float32 inside
(``x.float()``, ``x.to(torch.float32)``), which caps a float64 comparison near 1e-7. Inside this
context a float64 tensor asked for float32 stays float64; every other cast is unchanged. The
float64 comparisons then reach 1e-12; if a cast escaped the patch, the tolerance would fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_TO = torch.Tensor.to
_FLOAT = torch.Tensor.float


def _promoted_to(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    if self.dtype == torch.float64:
        args = tuple(torch.float64 if a is torch.float32 else a for a in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
    return _TO(self, *args, **kwargs)


def _promoted_float(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return self if self.dtype == torch.float64 else _FLOAT(self, *args, **kwargs)


@contextlib.contextmanager
def float64_casts() -> Iterator[None]:
    """Within: ``t.float()`` and ``t.to(torch.float32)`` of a float64 ``t`` return float64."""
    torch.Tensor.to, torch.Tensor.float = _promoted_to, _promoted_float
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float = _TO, _FLOAT
