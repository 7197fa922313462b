"""linear_attention against the float64 oracle, in every mode, gate shape and dtype."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import linear_attention

from .cases import make_inputs, oracle, rel_rms

MODES = [
    ("recurrent", 64),
    ("parallel", 64),
    ("chunk", 1),
    ("chunk", 7),
    ("chunk", 16),
    ("chunk", 64),
]


def expected(x, normalize, scale=1.0):
    """Oracle output and state; with normalize, the ones column is one more value column."""
    v = x["v"]
    if normalize:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    o, S = oracle(x["q"], x["k"], v, None, x["g"], x["S0"], scale=scale)
    if normalize:
        o = o[..., :-1] / o[..., -1:]
    return o, S


def run(x, mode, C, normalize, **kw):
    return linear_attention(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        normalize=normalize,
        mode=mode,
        chunk_size=C,
        initial_state=x["S0"],
        output_final_state=True,
        scale=1.0,
        **kw,
    )


@pytest.mark.parametrize("mode,C", MODES)
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("state", [False, True])
def test_float64_matches_oracle(mode, C, gate, normalize, state):
    x = make_inputs(T=65, gate=gate, state=state, positive=normalize)
    if normalize and state:
        x["S0"] = torch.cat([x["S0"].abs(), torch.rand(2, 2, 4, 1, dtype=torch.float64)], -1)
    o, S = run(x, mode, C, normalize)
    o_ref, S_ref = expected(x, normalize)
    assert o.dtype == torch.float64
    assert (o - o_ref).abs().max() < 1e-10
    assert (S - S_ref).abs().max() < 1e-10


@pytest.mark.parametrize("T", [1, 63, 64, 65, 1000])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_lengths(T, gate):
    x = make_inputs(B=1, T=T, gate=gate, state=True)
    o_ref, S_ref = expected(x, False)
    modes = [("chunk", 7), ("chunk", 64)] + ([("recurrent", 1), ("parallel", 1)] if T < 100 else [])
    for mode, C in modes:
        o, S = run(x, mode, C, False)
        assert (o - o_ref).abs().max() < 1e-10, (mode, C)
        assert (S - S_ref).abs().max() < 1e-10, (mode, C)


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)]
)
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("normalize", [False, True])
def test_low_precision(dtype, tol, gate, normalize):
    x64 = make_inputs(B=1, T=300, K=8, V=8, gate=gate, state=True, positive=normalize)
    if normalize:
        x64["S0"] = torch.cat([x64["S0"].abs(), torch.rand(1, 2, 8, 1, dtype=torch.float64)], -1)
    # Low-precision inputs are the float64 ones rounded; the oracle sees the rounded values.
    x = {n: (None if t is None else t.to(dtype)) for n, t in x64.items()}
    o_ref, S_ref = expected(
        {n: (None if t is None else t.double()) for n, t in x.items()}, normalize
    )
    for mode, C in [("chunk", 16), ("chunk", 64), ("parallel", 1), ("recurrent", 1)]:
        o, S = run(x, mode, C, normalize)
        assert o.dtype == dtype
        assert S.dtype == torch.float32
        assert rel_rms(o, o_ref) < tol, (mode, C)
        assert rel_rms(S, S_ref) < tol, (mode, C)


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 3)])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("normalize", [False, True])
def test_gradcheck(mode, C, gate, normalize):
    x = make_inputs(B=1, T=7, H=1, K=3, V=2, gate=gate, state=True, positive=normalize)
    if normalize:
        x["S0"] = torch.cat([x["S0"].abs(), torch.rand(1, 1, 3, 1, dtype=torch.float64)], -1)
    names = [n for n in ("q", "k", "v", "g", "S0") if x[n] is not None]

    def f(*tensors):
        y = dict(x, **dict(zip(names, tensors, strict=True)))
        o, S = run(y, mode, C, normalize)
        return o, S

    inputs = [x[n].clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)
