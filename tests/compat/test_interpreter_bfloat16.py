"""tests/fla_interpreter's ``bfloat16_dots_and_casts``: the two bfloat16 operations triton 3.9's
interpreter gets wrong, each in a one-op kernel against torch, without and with the repair."""

from __future__ import annotations

import pytest
import torch

fla_interpreter = pytest.importorskip("tests.fla_interpreter")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _dot(a, b, c, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(a + o[:, None] * N + o[None, :])
    y = tl.load(b + o[:, None] * N + o[None, :])
    tl.store(c + o[:, None] * N + o[None, :], tl.dot(x, y))


@triton.jit
def _round(a, c, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(c + o, tl.load(a + o).to(tl.bfloat16).to(tl.float32))


def _dot_error():
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=gen).bfloat16() for _ in range(2))
    c = torch.empty(16, 16)
    _dot[(1,)](a, b, c, 16)
    want = a.float() @ b.float()
    return fla_interpreter.relative(c, want)


def _rounded():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    c = torch.empty(4096)
    _round[(1,)](x, c, 4096)
    return x, c


def test_the_interpreter_alone_gets_bfloat16_dots_and_casts_wrong():
    assert _dot_error() > 1e3  # the bit patterns multiplied as integers
    x, c = _rounded()
    truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32)
    assert torch.equal(c, truncated) and not torch.equal(c, x.bfloat16().float())


def test_the_repair_computes_them_as_compiled_triton_does(monkeypatch):
    fla_interpreter.bfloat16_dots_and_casts(monkeypatch)
    assert _dot_error() < 1e-6  # float32 accumulation of exact products: sum order only
    x, c = _rounded()
    torch.testing.assert_close(c, x.bfloat16().float(), rtol=0, atol=0)
    nan = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0] * 4)
    out = torch.empty(16)
    _round[(1,)](nan, out, 16)
    torch.testing.assert_close(out, nan, rtol=0, atol=0, equal_nan=True)
