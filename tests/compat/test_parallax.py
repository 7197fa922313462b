"""fla's ``parallel_parallax`` against fla's naive reference (float64) and its Triton kernel
under the interpreter (float16: fla's kernel takes half precision only; T = 1, T = 37, packed
sequences with a length-1 piece), forward and backward; and linattn's op against its float64
loop."""

from __future__ import annotations

import pytest
import torch

from linattn import compat
from linattn.ops.softmax_variants import parallax_attention
from linattn.reference.parallax import parallax as parallax_loop

fla_parallax = pytest.importorskip("fla.ops.parallax")
from fla.ops.parallax.naive import naive_parallax  # noqa: E402

HQ, H, K, V = 4, 2, 16, 16


def _inputs(T, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = {n: torch.randn(1, T, h, K, generator=gen, dtype=torch.float64) for n, h in
         (("q", HQ), ("r", HQ), ("k", H), ("v", H))}  # fmt: skip
    x["r"] = 0.3 * x["r"]
    return {n: t.to(dtype) for n, t in x.items()}


def _run(fn, x):
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o = fn(leaves)
    (o.float() * torch.linspace(-1, 1, o.numel()).view_as(o)).sum().backward()
    return [o.detach()] + [leaves[n].grad for n in ("q", "r", "k", "v")]


def _call(fn, **kw):
    return lambda t: fn(t["q"], t["r"], t["k"], t["v"], **kw)


@pytest.mark.parametrize("window_size", [None, 6])
def test_parallel_parallax_matches_fla_s_naive_in_float64(window_size):
    """fla's naive computes in float32: agreement to float32's rounding."""
    x = _inputs(29)
    ours = _run(_call(compat.parallel_parallax, window_size=window_size), x)
    theirs = _run(_call(naive_parallax, window_size=window_size), x)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("window_size", [None, 5])
def test_the_op_equals_the_float64_loop(window_size):
    x = _inputs(23)
    cu = torch.tensor([0, 1, 9, 23])
    o = parallax_attention(x["q"], x["r"], x["k"], x["v"], window_size=window_size, cu_seqlens=cu)
    for a, b in ((0, 1), (1, 9), (9, 23)):
        for h in range(HQ):
            want = parallax_loop(
                *(x[n][0, a:b, h // 2 if n in "kv" else h].numpy() for n in ("q", "r", "k", "v")),
                window_size=window_size,
            )
            torch.testing.assert_close(o[0, a:b, h], torch.from_numpy(want), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("T", "cu_seqlens"), [(1, None), (37, torch.tensor([0, 1, 20, 37]))], ids=["T1", "varlen"]
)
def test_parallel_parallax_matches_fla_s_kernel(T, cu_seqlens):
    x = _inputs(T, torch.float16)
    kw = dict(window_size=9, cu_seqlens=cu_seqlens)
    ours = _run(_call(compat.parallel_parallax, **kw), x)
    theirs = _run(_call(fla_parallax.parallel_parallax, **kw), x)
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype == torch.float16
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-3, atol=5e-3)


def test_refusals_name_the_argument():
    x = _inputs(5)
    with pytest.raises(ValueError, match="^r must have"):
        compat.parallel_parallax(x["q"], x["r"][:, :4], x["k"], x["v"])
    with pytest.raises(TypeError, match="^r must be"):
        compat.parallel_parallax(x["q"], None, x["k"], x["v"])
    with pytest.raises(ValueError, match="query heads"):
        compat.parallel_parallax(x["q"][:, :, :3], x["r"][:, :, :3], x["k"], x["v"])
    with pytest.raises(ValueError, match="^window_size"):
        compat.parallel_parallax(x["q"], x["r"], x["k"], x["v"], window_size=0)
