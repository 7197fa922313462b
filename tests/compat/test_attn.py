"""fla's softmax entry points (``parallel_attn``, ``parallel_forgetting_attn``,
``parallel_stickbreaking_attn``) against fla's naive references and its Triton kernels under
the interpreter (tests/fla_interpreter): T = 1, T not a multiple of the blocks, packed sequences
with a length-1 piece; forward and backward; GQA, windows, gates and sinks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import compat

fla_attn = pytest.importorskip("fla.ops.attn")
fla_fox = pytest.importorskip("fla.ops.forgetting_attn")
fla_sb = pytest.importorskip("fla.ops.stickbreaking_attn")
from fla.ops.attn.naive import naive_parallel_attn  # noqa: E402
from fla.ops.forgetting_attn.naive import naive_forgetting_attn  # noqa: E402
from fla.ops.stickbreaking_attn.naive import naive_stickbreaking_attn  # noqa: E402

HQ, H, K, V = 4, 2, 16, 16


def _inputs(T, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    return {
        "q": randn(1, T, HQ, K),
        "k": randn(1, T, H, K),
        "v": randn(1, T, H, V),
        "g": F.logsigmoid(randn(1, T, HQ) + 1.0),
        "sink_bias": randn(HQ),
    }


def _run(fn, x, names):
    """fn's outputs and the gradients of a weighted sum of them w.r.t. ``names``."""
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    out = fn(leaves)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.linspace(-1, 1, o.numel()).view_as(o)).sum() for o in outs)
    loss.backward()
    return [o.detach() for o in outs], [leaves[n].grad for n in names]


def _close(ours, theirs, tol, loose=()):
    """Outputs and gradients to ``tol``; the gradients at the positions ``loose`` to 1e-5 (fla's
    naive references compute the cumulative gates in float32, so their gate gradients are
    float32's)."""
    for a, b in zip(ours[0], theirs[0], strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=tol, atol=tol)
    for i, (a, b) in enumerate(zip(ours[1], theirs[1], strict=True)):
        t = 1e-5 if i in loose else tol
        torch.testing.assert_close(a, b.to(a.dtype), rtol=t, atol=t)


def _dyadic(g):
    """Gates that are multiples of 1/16 (exact in float32, and so are their cumulative sums):
    fla's naive references sum the gates in float32."""
    return (g * 16).round() / 16


@pytest.mark.parametrize("window_size", [None, 6])
@pytest.mark.parametrize("sink", [False, True])
def test_parallel_attn_matches_fla_s_naive(window_size, sink):
    x = _inputs(29, torch.float64)
    x["g"] = _dyadic(x["g"])
    names = ("q", "k", "v", "g") + (("sink_bias",) if sink else ())

    def ours(t):
        return compat.parallel_attn(
            t["q"],
            t["k"],
            t["v"],
            t["g"],
            window_size=window_size,
            sink_bias=t["sink_bias"] if sink else None,
        )

    def naive(t):
        return naive_parallel_attn(
            t["q"],
            t["k"],
            t["v"],
            window_size=window_size,
            g=t["g"],
            sink_bias=t["sink_bias"] if sink else None,
        )[0]

    _close(_run(ours, x, names), _run(naive, x, names), 1e-10, loose=(3,))


def test_parallel_forgetting_attn_matches_fla_s_naive():
    """fla's naive forgetting attention computes in float32 throughout: float32's agreement."""
    x = _inputs(29, torch.float64)
    names = ("q", "k", "v", "g")

    def ours(t):
        return compat.parallel_forgetting_attn(t["q"], t["k"], t["v"], t["g"], window_size=11)

    def naive(t):
        return naive_forgetting_attn(t["q"], t["k"], t["v"], t["g"], window_size=11).to(t["q"])

    _close(_run(ours, x, names), _run(naive, x, names), 1e-5)


@pytest.mark.parametrize("attend_current", [False, True])
def test_parallel_stickbreaking_attn_matches_fla_s_naive(attend_current):
    x = _inputs(29, torch.float64)
    names = ("q", "k", "v")

    def ours(t):
        return compat.parallel_stickbreaking_attn(
            t["q"], t["k"], t["v"], attend_current=attend_current
        )

    def naive(t):
        return naive_stickbreaking_attn(t["q"], t["k"], t["v"], attend_current=attend_current)

    _close(_run(ours, x, names), _run(naive, x, names), 1e-10)


@pytest.mark.parametrize(
    ("T", "cu_seqlens"), [(1, None), (37, torch.tensor([0, 1, 20, 37]))], ids=["T1", "varlen"]
)
def test_parallel_attn_matches_fla_s_kernel(T, cu_seqlens):
    """fla's Triton kernel (interpreted): gates, a window, sinks, GQA; o and every gradient."""
    x = _inputs(T)
    names = ("q", "k", "v", "g", "sink_bias")

    def call(fn):
        return lambda t: fn(
            t["q"],
            t["k"],
            t["v"],
            t["g"],
            window_size=9,
            cu_seqlens=cu_seqlens,
            sink_bias=t["sink_bias"],
        )

    _close(
        _run(call(compat.parallel_attn), x, names),
        _run(call(fla_attn.parallel_attn), x, names),
        2e-5,
    )


def test_parallel_forgetting_attn_matches_fla_s_kernel():
    x = _inputs(37)
    cu = torch.tensor([0, 1, 37])
    names = ("q", "k", "v", "g")

    def call(fn):
        return lambda t: fn(t["q"], t["k"], t["v"], t["g"], cu_seqlens=cu)

    theirs = _run(call(fla_fox.parallel_forgetting_attn), x, names)
    _close(_run(call(compat.parallel_forgetting_attn), x, names), theirs, 2e-5)


@pytest.mark.slow
def test_parallel_stickbreaking_attn_matches_fla_s_kernel():
    """T = 1 and a packed batch (pieces of 1, 19 and 17 tokens) in one call of each."""
    x = _inputs(37)
    names = ("q", "k", "v")
    for cu in (torch.tensor([0, 1, 20, 37]),):

        def call(fn, cu=cu):
            return lambda t: fn(t["q"], t["k"], t["v"], cu_seqlens=cu)

        theirs = _run(call(fla_sb.parallel_stickbreaking_attn), x, names)
        _close(_run(call(compat.parallel_stickbreaking_attn), x, names), theirs, 2e-5)
    one = {n: t[:, :1] if t.dim() > 1 else t for n, t in x.items()}
    theirs = fla_sb.parallel_stickbreaking_attn(one["q"], one["k"], one["v"], attend_current=True)
    ours = compat.parallel_stickbreaking_attn(one["q"], one["k"], one["v"], attend_current=True)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


def test_refusals_name_the_argument_before_any_work():
    x = _inputs(5)
    q, k, v = x["q"], x["k"], x["v"]
    with pytest.raises(ValueError, match="query heads"):
        compat.parallel_attn(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="cu_seqlens"):
        compat.parallel_attn(
            q.expand(2, -1, -1, -1),
            k.expand(2, -1, -1, -1),
            v.expand(2, -1, -1, -1),
            cu_seqlens=torch.tensor([0, 5]),
        )
    with pytest.raises(ValueError, match="sink_bias"):
        compat.parallel_attn(q, k, v, sink_bias=torch.zeros(3))
    with pytest.raises(ValueError, match="^g must have"):
        compat.parallel_forgetting_attn(q, k, v, x["g"][..., :2])
    with pytest.raises(TypeError, match="^q must be"):
        compat.parallel_stickbreaking_attn(None, k, v)
    with pytest.raises(ValueError, match="q, k, v: expected shapes"):
        compat.parallel_stickbreaking_attn(q[:, :4], k, v)
    with pytest.raises(TypeError, match="^attend_current"):
        compat.parallel_stickbreaking_attn(q, k, v, attend_current="yes")
