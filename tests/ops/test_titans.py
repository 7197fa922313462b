"""linattn.ops.titans: both forms against the float64 loop of
linattn.reference.titans with a short last chunk, eta = 0 and alpha = 1 (no logarithms), packed
sequences against the sequences one by one, a gradcheck, refusals by name. (tests/registry runs
the forms against the oracle and their gradients against each other too.)"""

from __future__ import annotations

import pytest
import torch

from linattn.ops.titans import titans_linear
from linattn.registry.cases import titans_case

NAMES = ("q", "k", "v", "w", "b", "theta", "alpha", "eta")
CASE = titans_case(chunk_size=4)


def _args(x):
    return [x[n] for n in NAMES]


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
@pytest.mark.parametrize("T", [1, 3, 10])
def test_forms_equal_the_reference(mode, T):
    x = CASE.inputs(2, T, 2, 4, 4, seed=T)
    if T == 10:  # a momentum reset and a full forgetting inside a chunk
        x["eta"][:, 5], x["alpha"][:, 6] = 0.0, 1.0
    o_ref, S_ref = CASE.oracle(x, 1.0)
    o, S = CASE.call(x, mode, 0, 1.0)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_packed_sequences_equal_the_sequences_one_by_one(mode):
    x = CASE.inputs(1, 11, 2, 4, 4, seed=8)
    S0 = (torch.cat([x["S0_M"], -x["S0_M"], 2 * x["S0_M"]]), torch.cat([x["S0_S"]] * 3))
    cu = torch.tensor([0, 1, 6, 11])
    kw = dict(chunk_size=4, mode=mode, output_final_state=True)
    o, S = titans_linear(*_args(x), initial_state=S0, cu_seqlens=cu, **kw)
    for n, (a, c) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        piece = [t if t.dim() == 2 else t[:, a:c] for t in _args(x)]
        o_n, S_n = titans_linear(*piece, initial_state=tuple(s[n : n + 1] for s in S0), **kw)
        torch.testing.assert_close(o[:, a:c], o_n, rtol=0, atol=1e-13)
        for s, s_n in zip(S, S_n, strict=True):
            torch.testing.assert_close(s[n : n + 1], s_n, rtol=0, atol=1e-13)


def test_gradcheck_of_the_chunk_form():
    x = CASE.inputs(1, 5, 1, 3, 3, seed=9)
    leaves = [t.clone().requires_grad_(True) for t in (*_args(x), x["S0_M"], x["S0_S"])]

    def f(*t):
        o, S = titans_linear(*t[:8], chunk_size=2, initial_state=t[8:], output_final_state=True)
        return o, *S

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize(
    ("name", "bad", "match"),
    [
        ("v", torch.zeros(1, 5, 1, 2), "v must have the keys' width"),
        ("w", torch.zeros(2, 3), "w must have shape"),
        ("alpha", torch.zeros(1, 5, 1), "alpha must have 4 dimensions"),
        ("theta", torch.zeros(1, 5, 1, 3), "theta must have shape"),
    ],
)
def test_bad_input_is_refused_by_name(name, bad, match):
    x = CASE.inputs(1, 5, 1, 3, 3, seed=1)
    x[name] = bad.double()
    with pytest.raises(ValueError, match=match):
        titans_linear(*_args(x))


def test_bad_options_are_refused_by_name():
    x = CASE.inputs(1, 5, 1, 3, 3, seed=1)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        titans_linear(*_args(x), chunk_size=0)
    with pytest.raises(ValueError, match=r"initial_state\[1\] \(S\) must have shape"):
        titans_linear(*_args(x), initial_state=(x["S0_M"], x["S0_S"][..., :2]))
