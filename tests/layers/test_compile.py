"""Every layer under torch.compile(dynamic=True): three sequence lengths, forward and backward, as
eager. Slow: each layer's graph takes seconds to capture on two cores."""

from __future__ import annotations

import pytest
import torch

from linattn import layers

LAYERS = [
    "Comba",
    "DeltaNet",
    "GatedAttention",
    "GatedConvolution",
    "GatedDeltaNet",
    "GatedDeltaNet2",
    "GatedLinearAttention",
    "KimiDeltaAttention",
    "LinearAttention",
    "Mamba2",
    "MultiHeadLatentAttention",
    "RWKV7",
    "SoftmaxAttention",
]


def _counter():
    """A compile counter with the aot_eager backend. torch._dynamo.testing is imported here, not
    at collection: it imports triton, which must come after tests.fla_interpreter (the fla tests
    collected earlier in a session would then fail)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend("aot_eager")


def _make(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cls = getattr(layers, name)
    if name == "Mamba2":
        return cls(16, d_state=8, head_dim=8)
    if name == "GatedConvolution":
        return cls(16)
    return cls(16, 2)


def _outputs_and_grads(layer: torch.nn.Module, fn, x: torch.Tensor) -> list:
    layer.zero_grad()
    x = x.clone().requires_grad_()
    y = fn(x)
    y = y[0] if isinstance(y, tuple) else y
    y.square().sum().backward()
    return [y.detach(), x.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYERS)
def test_a_layer_compiles_once_for_three_lengths(name, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    layer = _make(name)
    torch._dynamo.reset()
    counter = _counter()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=counter)
    frames = []
    for T in (7, 9, 13):
        x = torch.randn(2, T, 16, generator=torch.Generator().manual_seed(T))
        got, want = _outputs_and_grads(layer, compiled, x), _outputs_and_grads(layer, layer, x)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        frames.append(counter.frame_count)
    assert frames[1] == frames[2]  # no new graph for the third length
