"""delta_rule (delta rule, Gated DeltaNet, KDA) against the float64 oracle."""

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


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 3)])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_gradcheck(mode, C, gate):
    x = make_inputs(B=1, T=7, H=1, K=3, V=2, gate=gate, rule="delta", state=True)
    x["beta"] = 0.1 + 0.9 * x["beta"]  # inside (0, 2), away from the edges gradcheck steps over
    names = [n for n in ("q", "k", "v", "beta", "g", "S0") if x[n] is not None]

    def f(*tensors):
        return run(dict(x, **dict(zip(names, tensors, strict=True))), mode, C)

    inputs = [x[n].clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_kda_with_equal_channels_is_gated_deltanet(mode):
    x = make_inputs(T=40, gate="scalar", rule="delta", state=True)
    o_gdn, S_gdn = run(x, mode, 16)
    y = dict(x, g=x["g"].unsqueeze(-1).expand(*x["g"].shape, 4).contiguous())
    o_kda, S_kda = run(y, mode, 16)
    torch.testing.assert_close(o_kda, o_gdn, rtol=0, atol=1e-12)
    torch.testing.assert_close(S_kda, S_gdn, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
@pytest.mark.parametrize("shape", ["scalar", "channel"])
def test_zero_gate_is_the_delta_rule(mode, shape):
    x = make_inputs(T=40, gate=shape, rule="delta", state=True)
    o_zero, S_zero = run(dict(x, g=torch.zeros_like(x["g"])), mode, 16)
    o_plain, S_plain = run(dict(x, g=None), mode, 16)
    torch.testing.assert_close(o_zero, o_plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(S_zero, S_plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_beta_one_overwrites(mode):
    # Figure 6: keys e1, e2, e1 with beta = 1; the repeated key reads back its newest value.
    keys = torch.tensor([[1.0, 0], [0, 1], [1, 0]], dtype=torch.float64)[None, :, None]
    values = torch.tensor([[3.0, 1], [-1, 2], [0, 4]], dtype=torch.float64)[None, :, None]
    beta = torch.ones(1, 3, 1, dtype=torch.float64)
    o, S = delta_rule(
        keys, keys, values, beta, scale=1.0, mode=mode, chunk_size=2, output_final_state=True
    )
    assert torch.equal(S[0, 0], torch.tensor([[0.0, 4], [-1, 2]], dtype=torch.float64))
    assert torch.equal(o[0, 2, 0], values[0, 2, 0])  # e1 reads back 0, 4: the newest value
