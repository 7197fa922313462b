"""delta_rule (delta rule, Gated DeltaNet, KDA) against the float64 oracle (issue 4)."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import delta_rule

from .cases import make_inputs, oracle, rel_rms

MODES = [
    ("recurrent", 64),
    ("parallel", 64),
    ("chunk", 1),
    ("chunk", 5),
    ("chunk", 16),
    ("chunk", 64),
]


def expected(x, scale=1.0):
    return oracle(x["q"], x["k"], x["v"], x["beta"], x["g"], x["S0"], rule="delta", scale=scale)


def run(x, mode, C, **kw):
    return delta_rule(
        x["q"],
        x["k"],
        x["v"],
        x["beta"],
        x["g"],
        mode=mode,
        chunk_size=C,
        initial_state=x["S0"],
        output_final_state=True,
        scale=kw.pop("scale", 1.0),
        **kw,
    )


@pytest.mark.parametrize("mode,C", MODES)
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("state", [False, True])
def test_float64_matches_oracle(mode, C, gate, state):
    x = make_inputs(T=65, gate=gate, rule="delta", state=state)
    o, S = run(x, mode, C)
    o_ref, S_ref = expected(x)
    assert o.dtype == torch.float64
    assert (o - o_ref).abs().max() < 1e-10
    assert (S - S_ref).abs().max() < 1e-10


@pytest.mark.parametrize("T", [1, 63, 64, 65, 1000])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_lengths(T, gate):
    x = make_inputs(B=1, T=T, gate=gate, rule="delta", state=True)
    o_ref, S_ref = expected(x)
    modes = [("chunk", 5), ("chunk", 64)] + ([("recurrent", 1), ("parallel", 1)] if T < 100 else [])
    for mode, C in modes:
        o, S = run(x, mode, C)
        assert (o - o_ref).abs().max() < 1e-10, (mode, C)
        assert (S - S_ref).abs().max() < 1e-10, (mode, C)


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)]
)
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_low_precision(dtype, tol, gate):
    x64 = make_inputs(B=1, T=300, K=8, V=8, gate=gate, rule="delta", state=True)
    x = {n: (None if t is None else t.to(dtype)) for n, t in x64.items()}
    o_ref, S_ref = expected({n: (None if t is None else t.double()) for n, t in x.items()})
    for mode, C in [("chunk", 16), ("chunk", 64), ("parallel", 1), ("recurrent", 1)]:
        o, S = run(x, mode, C)
        assert o.dtype == dtype
        assert S.dtype == torch.float32
        assert rel_rms(o, o_ref) < tol, (mode, C)
        assert rel_rms(S, S_ref) < tol, (mode, C)


def test_default_scale_and_l2norm():
    x = make_inputs(T=20, K=9, gate="scalar", rule="delta", state=True)
    q, k = x["q"] * 3.0, x["k"] * 0.5  # not unit length: use_qk_l2norm must fix both
    o, _ = delta_rule(q, k, x["v"], x["beta"], x["g"], initial_state=x["S0"], use_qk_l2norm=True)
    # l2norm is x / sqrt(|x|^2 + 1e-6); the default scale is 1 / sqrt(K) = 1 / 3.
    qn, kn = (x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() for x in (q, k))
    o_ref, _ = oracle(qn, kn, x["v"], x["beta"], x["g"], x["S0"], rule="delta", scale=1 / 3.0)
    assert (o - o_ref).abs().max() < 1e-10
    assert (qn.norm(dim=-1) - 1).abs().max() < 1e-4
