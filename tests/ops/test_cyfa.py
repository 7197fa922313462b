"""linattn.ops.cyfa: every form against the float64 loop of linattn.reference.cyfa,
packed sequences against the sequences one by one, a gradcheck, and refusals by name.
(tests/registry runs the forms against the oracle and their gradients against each other too.)"""

from __future__ import annotations

import pytest
import torch

from linattn.ops.cyfa import cyfa
from linattn.registry.cases import cyfa_case

NAMES = ("q", "k", "v", "g", "delta", "beta", "readout", "q_norm_weight", "k_norm_weight")
CASE = cyfa_case()


def _args(x):
    return [x[n] for n in NAMES]


def _state(x):
    return (x["S0_k"], x["S0_v"], x["S0_lambda"])


@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_forms_equal_the_reference_with_a_long_clock(mode):
    x = CASE.inputs(1, 11, 2, 4, 3, seed=7)
    x["S0_lambda"] = x["S0_lambda"] + 1234.5  # whole periods reduced before the cosine
    o_ref, S_ref = CASE.oracle(x, 0.5)
    o, S = CASE.call(x, mode, 4, 0.5)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-10)  # lambda ~ 1e3: its last bits


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_packed_sequences_equal_the_sequences_one_by_one(mode):
    x = CASE.inputs(1, 9, 2, 4, 3, seed=8)
    S0 = tuple(torch.cat([s] * 3) + i for i, s in enumerate(_state(x)))
    cu = torch.tensor([0, 1, 5, 9])
    o, S = cyfa(*_args(x), scale=0.4, mode=mode, chunk_size=2, initial_state=S0,
                output_final_state=True, cu_seqlens=cu)  # fmt: skip
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        piece = {k: (t[:, a:b] if t.dim() >= 3 and t.shape[1] == 9 and k not in ("readout",)
                     else t) for k, t in x.items()}  # fmt: skip
        o_n, S_n = cyfa(
            *_args(piece),
            scale=0.4,
            mode=mode,
            chunk_size=2,
            initial_state=tuple(s[n : n + 1] for s in S0),
            output_final_state=True,
        )
        torch.testing.assert_close(o[:, a:b], o_n, rtol=0, atol=1e-13)
        for s, s_n in zip(S, S_n, strict=True):
            torch.testing.assert_close(s[n : n + 1], s_n, rtol=0, atol=1e-13)


def test_gradcheck_of_the_chunk_form():
    x = CASE.inputs(1, 5, 1, 3, 2, seed=9)
    leaves = [t.clone().requires_grad_(True) for t in (*_args(x), *_state(x))]

    def f(*t):
        o, S = cyfa(*t[:9], scale=0.5, mode="chunk", chunk_size=2, initial_state=t[9:],
                    output_final_state=True)  # fmt: skip
        return o, *S

    assert torch.autograd.gradcheck(f, leaves)


@pytest.mark.parametrize(
    ("name", "bad", "match"),
    [
        ("delta", torch.zeros(1, 4, 2), "delta must have shape"),
        ("readout", torch.zeros(2, 5, 5), "readout must have shape"),
        ("k_norm_weight", torch.zeros(3, 1), "k_norm_weight must have 1 dimensions"),
        ("g", torch.ones(1, 5, 1), "g must be <= 0"),
    ],
)
def test_bad_input_is_refused_by_name(name, bad, match):
    x = CASE.inputs(1, 5, 1, 3, 2, seed=1)
    x[name] = bad.double()
    with pytest.raises(ValueError, match=match):
        cyfa(*_args(x))


def test_a_bad_initial_state_is_refused_by_name():
    x = CASE.inputs(1, 5, 1, 3, 2, seed=1)
    S0 = (x["S0_k"], x["S0_v"], x["S0_lambda"][:, :, None])
    with pytest.raises(ValueError, match=r"initial_state\[2\] \(the clock lambda\)"):
        cyfa(*_args(x), initial_state=S0)
