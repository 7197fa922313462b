"""Property tests (hypothesis): any shape, chunk size, gate shape, rule and dtype agrees with the
float64 oracle, and packed sequences equal separate runs."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn.ops import delta_rule, linear_attention

from .cases import make_inputs, oracle, rel_rms

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-2}

problems = st.fixed_dictionaries(
    {
        "B": st.integers(1, 2),
        "T": st.integers(1, 40),
        "H": st.integers(1, 2),
        "K": st.integers(1, 6),
        "V": st.integers(1, 5),
        "gate": st.sampled_from([None, "scalar", "channel"]),
        "rule": st.sampled_from(["additive", "delta"]),
        "state": st.booleans(),
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=60, deadline=None)
@given(
    problem=problems,
    mode=st.sampled_from(["chunk", "chunk", "recurrent", "parallel"]),
    chunk_size=st.integers(1, 45),
    dtype=st.sampled_from(list(TOLERANCE)),
)
def test_any_problem_matches_the_oracle(problem, mode, chunk_size, dtype):
    x = make_inputs(**problem, dtype=dtype)
    kw = dict(mode=mode, chunk_size=chunk_size, initial_state=x["S0"], output_final_state=True,
              scale=0.5)  # fmt: skip
    if problem["rule"] == "delta":
        o, S = delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], **kw)
    else:
        o, S = linear_attention(x["q"], x["k"], x["v"], x["g"], **kw)
    as64 = {n: (None if t is None else t.double()) for n, t in x.items()}
    o_ref, S_ref = oracle(as64["q"], as64["k"], as64["v"], as64["beta"], as64["g"], as64["S0"],
                          rule=problem["rule"], scale=0.5)  # fmt: skip
    assert o.dtype == dtype and o.shape == o_ref.shape
    if dtype == torch.float64:
        assert (o - o_ref).abs().max() < 1e-10 and (S - S_ref).abs().max() < 1e-10
    elif o_ref.abs().max() > 1e-3:  # relative error is meaningful only for a nonzero output
        assert rel_rms(o, o_ref) < TOLERANCE[dtype]
        assert rel_rms(S, S_ref) < TOLERANCE[dtype]


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=4),
    chunk_size=st.integers(1, 8),
    gate=st.sampled_from([None, "scalar", "channel"]),
    rule=st.sampled_from(["additive", "delta"]),
)
def test_packed_sequences_run_independently(lengths, chunk_size, gate, rule):
    T = sum(lengths)
    x = make_inputs(B=1, T=T, gate=gate, rule=rule)
    bounds = torch.tensor([0] + lengths).cumsum(0)

    def run(sl, **kw):
        g = None if x["g"] is None else x["g"][:, sl]
        if rule == "delta":
            return delta_rule(
                x["q"][:, sl],
                x["k"][:, sl],
                x["v"][:, sl],
                x["beta"][:, sl],
                g,
                chunk_size=chunk_size,
                output_final_state=True,
                **kw,
            )
        return linear_attention(
            x["q"][:, sl],
            x["k"][:, sl],
            x["v"][:, sl],
            g,
            chunk_size=chunk_size,
            output_final_state=True,
            **kw,
        )

    o, S = run(slice(None), cu_seqlens=bounds)
    for n in range(len(lengths)):
        a, b = int(bounds[n]), int(bounds[n + 1])
        o_n, S_n = run(slice(a, b))
        torch.testing.assert_close(o[:, a:b], o_n, rtol=0, atol=1e-12)
        torch.testing.assert_close(S[n : n + 1], S_n, rtol=0, atol=1e-12)
