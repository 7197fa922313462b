"""Inputs on fla's test recipes and comparisons of (o, state) pairs and their gradients."""

from __future__ import annotations

import math

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


def dplr_recipe(B=1, T=40, H=2, HV=None, K=16, V=8, dtype=torch.float32, seed=0, mask_p=0.0):
    """``recipe`` plus the generalized delta rule's inputs on fla's recipes (tests/ops/
    test_dplr_delta.py, test_rwkv7.py, test_comba.py, test_gdn2.py): fla's DPLR a =
    normalize(U(0, 1)) (it reads) and b = -a; gk = logsigmoid(N(0, 1)), a fraction ``mask_p``
    of it 0; RWKV-7's kk = normalize(U(-1, 1)), a_scale ~ U(0, 0.1) (its a = -kk, b = kk *
    a_scale) and w = -exp(-0.5) sigmoid(N(0, 1)); Comba's p = normalize(N(0, 1)) [B, T, H, K];
    GDN-2's erase and write gates ~ U(0, 1), [B, T, HV, K] and [B, T, HV, V]."""
    x = recipe(B, T, H, HV, K, V, torch.float64, seed)
    HV = H if HV is None else HV
    gen = torch.Generator().manual_seed(seed + 100)

    def rand(*shape, low=0.0, high=1.0):
        return low + (high - low) * torch.rand(*shape, generator=gen, dtype=torch.float64)

    a = F.normalize(rand(B, T, HV, K), dim=-1)
    gk = F.logsigmoid(torch.randn(B, T, HV, K, generator=gen, dtype=torch.float64))
    kk = F.normalize(rand(B, T, HV, K, low=-1.0), dim=-1)
    x.update(
        a=a, b=-a, gk=gk * (rand(B, T, HV, K) >= mask_p), kk=kk,
        a_scale=rand(B, T, HV, K, high=0.1),
        w=-math.exp(-0.5) * torch.randn(B, T, HV, K, generator=gen, dtype=torch.float64).sigmoid(),
        p=F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1),
        erase=rand(B, T, HV, K), write=rand(B, T, HV, V),
    )  # fmt: skip
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


def compare(ours, theirs, leaves: dict, tol: float) -> None:
    """ours(**leaves) and theirs(**leaves) agree, outputs and the gradients of every leaf."""
    a, da = outputs_and_grads(ours, leaves)
    b, db = outputs_and_grads(theirs, leaves)
    assert_same(a, b, tol, "outputs")
    for n in leaves:
        assert_same([da[n]], [db[n]], tol, f"d{n}")
