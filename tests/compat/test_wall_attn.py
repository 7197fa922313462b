"""fla's ``parallel_wall_attn`` against fla's naive reference and its Triton kernel under the
interpreter (T = 1, T = 37, packed sequences with a length-1 piece; scalar gate, sink, window,
GQA), forward and backward; linattn's op against its float64 loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import compat
from linattn.ops.softmax_variants import wall_attention
from linattn.reference.wall import wall_attention as wall_loop

fla_wall = pytest.importorskip("fla.ops.wall_attn")
from fla.ops.wall_attn.naive import naive_wall_attn  # noqa: E402

HQ, H, K, V = 4, 2, 16, 16
NAMES = ("q", "k", "v", "g", "g_scalar", "sink_bias")


def _inputs(T, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {"q": randn(1, T, HQ, K), "k": randn(1, T, H, K), "v": randn(1, T, H, V),
         "g": F.logsigmoid(randn(1, T, HQ, K) + 2.0), "g_scalar": F.logsigmoid(randn(1, T, HQ)),
         "sink_bias": randn(HQ)}  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}


def _run(fn, x, **kw):
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], g_scalar=leaves["g_scalar"],
           sink_bias=leaves["sink_bias"], **kw)  # fmt: skip
    (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()
    return [o.detach()] + [leaves[n].grad for n in NAMES]


def _close(ours, theirs, tol, skip=()):
    for name, a, b in zip(("o", *NAMES), ours, theirs, strict=True):
        if name not in skip:
            torch.testing.assert_close(a, b.to(a.dtype), rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("window_size", [None, 6])
def test_parallel_wall_attn_matches_fla_s_naive(window_size):
    """fla's naive computes in float32, its cumulative gates by fla's (Triton) cumsum, which
    has no gradient: the gates' gradients are pinned by the kernel test below."""
    x = _inputs(29)
    kw = dict(scale=K**-0.5, window_size=window_size)
    theirs = _run(naive_wall_attn, x, **kw)
    assert theirs[4] is None and theirs[5] is None
    _close(_run(compat.parallel_wall_attn, x, **kw), theirs, 2e-5, skip=("g", "g_scalar"))


@pytest.mark.parametrize(
    ("T", "cu_seqlens"), [(1, None), (37, torch.tensor([0, 1, 20, 37]))], ids=["T1", "varlen"]
)
def test_parallel_wall_attn_matches_fla_s_kernel(T, cu_seqlens):
    x = _inputs(T)
    kw = dict(window_size=9, cu_seqlens=cu_seqlens)
    _close(_run(compat.parallel_wall_attn, x, **kw), _run(fla_wall.parallel_wall_attn, x, **kw),
           2e-5)  # fmt: skip


def test_the_op_equals_the_float64_loop():
    x = _inputs(23, torch.float64)
    cu = torch.tensor([0, 1, 9, 23])
    o = wall_attention(x["q"], x["k"], x["v"], x["g"], g_scalar=x["g_scalar"],
                       sink_bias=x["sink_bias"], window_size=7, cu_seqlens=cu)  # fmt: skip
    for a, b in ((0, 1), (1, 9), (9, 23)):
        for h in range(HQ):
            args = [x[n][0, a:b, h // 2 if n in "kv" else h].numpy() for n in ("q", "k", "v", "g")]
            want = wall_loop(*args, x["g_scalar"][0, a:b, h].numpy(), window_size=7,
                             sink=float(x["sink_bias"][h]))  # fmt: skip
            torch.testing.assert_close(o[0, a:b, h], torch.from_numpy(want), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("window_size", "scalar", "sink"), [(None, False, False), (5, True, True)])
def test_decode_matches_fla_s_kernel_and_the_parallel_form(window_size, scalar, sink):
    """The last 3 positions of 21 against fla's cache (build_wall_kv_cache, blocks of 8)."""
    from fla.ops.utils.cumsum import chunk_global_cumsum

    x = _inputs(21)
    g, gs = x["g"], x["g_scalar"]
    P = chunk_global_cumsum(g, scale=compat.wall_attn.RCP_LN2)
    Cs = chunk_global_cumsum(gs, scale=compat.wall_attn.RCP_LN2) if scalar else None
    k_tilde, r_cache = fla_wall.build_wall_kv_cache(x["k"], P, 8)
    s = x["sink_bias"] if sink else None
    args = (x["q"][:, -3:], x["v"], P[:, -3:].contiguous(), k_tilde, r_cache, s, 0.25, 8, Cs,
            window_size)  # fmt: skip
    ours, theirs = (
        compat.parallel_wall_attn_decode(*args),
        fla_wall.parallel_wall_attn_decode(*args),
    )
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)
    full = compat.parallel_wall_attn(x["q"], x["k"], x["v"], g, g_scalar=gs if scalar else None,
                                     sink_bias=s, scale=0.25, window_size=window_size)  # fmt: skip
    torch.testing.assert_close(ours[0], full[:, -3:], rtol=2e-5, atol=2e-5)


def test_refusals_name_the_argument():
    x = _inputs(5)
    q, k, v, g = x["q"], x["k"], x["v"], x["g"]
    with pytest.raises(ValueError, match="^g must have"):
        compat.parallel_wall_attn(q, k, v, g[..., :8])
    with pytest.raises(ValueError, match="^g_scalar must have"):
        compat.parallel_wall_attn(q, k, v, g, g_scalar=x["g_scalar"][..., :2])
    with pytest.raises(ValueError, match="^sink_bias must have"):
        compat.parallel_wall_attn(q, k, v, g, sink_bias=torch.zeros(2))
    with pytest.raises(TypeError, match="^g must be"):
        compat.parallel_wall_attn(q, k, v, None)
