"""linattn.ops.ttt: both forms against the float64 loop of linattn.reference.ttt with a
short last mini-batch, packed sequences against the sequences one by one, a gradcheck, refusals.
(tests/registry runs the forms against the oracle and their gradients against each other too.)"""

from __future__ import annotations

import pytest
import torch

from linattn.ops.ttt import ttt_linear
from linattn.registry.cases import ttt_case

NAMES = ("q", "k", "v", "w", "b", "eta")
CASE = ttt_case(mini_batch_size=4)


def _args(x):
    return [x[n] for n in NAMES]


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
@pytest.mark.parametrize("T", [1, 3, 9])
def test_forms_equal_the_reference(mode, T):
    x = CASE.inputs(2, T, 2, 4, 4, seed=T)
    o_ref, S_ref = CASE.oracle(x, 0.5)
    o, S = CASE.call(x, mode, 0, 0.5)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_packed_sequences_equal_the_sequences_one_by_one(mode):
    x = CASE.inputs(1, 11, 2, 4, 4, seed=8)
    S0 = (torch.cat([x["S0_W"], -x["S0_W"], 2 * x["S0_W"]]), torch.cat([x["S0_h"]] * 3))
    cu = torch.tensor([0, 1, 6, 11])
    kw = dict(scale=0.4, mini_batch_size=4, mode=mode, output_final_state=True)
    o, S = ttt_linear(*_args(x), initial_state=S0, cu_seqlens=cu, **kw)
    for n, (a, c) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        piece = [t if t.dim() == 2 else t[:, a:c] for t in _args(x)]
        o_n, S_n = ttt_linear(*piece, initial_state=tuple(s[n : n + 1] for s in S0), **kw)
        torch.testing.assert_close(o[:, a:c], o_n, rtol=0, atol=1e-13)
        for s, s_n in zip(S, S_n, strict=True):
            torch.testing.assert_close(s[n : n + 1], s_n, rtol=0, atol=1e-13)


def test_gradcheck_of_the_chunk_form():
    x = CASE.inputs(1, 5, 1, 3, 3, seed=9)
    leaves = [t.clone().requires_grad_(True) for t in (*_args(x), x["S0_W"], x["S0_h"])]

    def f(*t):
        o, S = ttt_linear(*t[:6], scale=0.5, mini_batch_size=2, initial_state=t[6:],
                          output_final_state=True)  # fmt: skip
        return o, *S

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize(
    ("name", "bad", "match"),
    [
        ("v", torch.zeros(1, 5, 1, 2), "v must have the keys' width"),
        ("b", torch.zeros(1, 2), "b must have shape"),
        ("eta", torch.zeros(1, 5, 1, 3), "eta must have shape"),
    ],
)
def test_bad_input_is_refused_by_name(name, bad, match):
    x = CASE.inputs(1, 5, 1, 3, 3, seed=1)
    x[name] = bad.double()
    with pytest.raises(ValueError, match=match):
        ttt_linear(*_args(x))


def test_bad_options_are_refused_by_name():
    x = CASE.inputs(1, 5, 1, 3, 3, seed=1)
    with pytest.raises(ValueError, match="mode must be one of"):
        ttt_linear(*_args(x), mode="parallel")
    with pytest.raises(TypeError, match="mini_batch_size must be an int"):
        ttt_linear(*_args(x), mini_batch_size=2.0)
