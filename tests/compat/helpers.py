"""Inputs on fla's test recipes and comparisons of (o, state) pairs and their gradients."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def recipe(B=1, T=40, H=2, HV=None, K=16, V=8, dtype=torch.float32, seed=0):
    """fla's test inputs: q, k, v ~ N(0, 1) (k l2-normalised), g = logsigmoid(N(0, 1)) per head
    (gk per key channel, gv per value channel), beta = sigmoid(U(0, 1)), h0 ~ N(0, 1)."""
    HV = H if HV is None else HV
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, H, K),
        "k": F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, HV, V),
        "g": F.logsigmoid(randn(B, T, HV)),
        "gk": F.logsigmoid(randn(B, T, HV, K)),
        "gv": F.logsigmoid(randn(B, T, HV, V)),
        "beta": torch.rand(B, T, HV, generator=gen, dtype=torch.float64).sigmoid(),
        "h0": randn(B, HV, K, V),
    }
    return {n: t.to(dtype) for n, t in x.items()}


def flatten(result):
    """(o, S), (o, (kv, z)), (o, S, h) -> a flat list of tensors (None kept)."""
    out = []
    for x in result if isinstance(result, tuple) else (result,):
        out.extend(flatten(x) if isinstance(x, tuple) else [x])
    return out


def outputs_and_grads(fn, leaves: dict, seed=1):
    """fn() -> its outputs, and the gradients of a random projection of them w.r.t. leaves."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in leaves.items()}
    outs = flatten(fn(**leaves))
    gen = torch.Generator().manual_seed(seed)
    loss = sum(
        (o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64)).sum()
        for o in outs
        if o is not None and o.requires_grad
    )
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return [None if o is None else o.detach() for o in outs], dict(zip(leaves, grads, strict=True))


def assert_same(a, b, tol, what=""):
    """Lists of tensors (or None) equal to a relative tolerance of the larger's scale."""
    assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} outputs"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert (x is None) == (y is None), f"{what}[{i}]: one is None"
        if x is None:
            continue
        assert x.shape == y.shape, f"{what}[{i}]: shapes {tuple(x.shape)} vs {tuple(y.shape)}"
        x, y = x.double(), y.double()
        scale = max(float(y.abs().max()), 1.0)
        err = float((x - y).abs().max())
        assert err <= tol * scale, f"{what}[{i}]: max error {err:.3g} > {tol:.1g} x {scale:.3g}"


class Promoted:
    """``torch`` seen with float32 (and ``float``) read as float64: a reference module's
    float32 casts promoted (``monkeypatch.setattr(module, "torch", Promoted())``)."""

    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)
