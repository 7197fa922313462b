"""State passing, packed sequences (cu_seqlens) and dtypes, shared by both ops (_engine.py)."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import delta_rule, linear_attention

from .cases import make_inputs

OPS = ["linear", "linear_normalized", "delta"]


def call(op, x, sl=slice(None), **kw):
    """Run op on the tokens sl of x ([B, T, ...] slices)."""
    q, k, v = (x[n][:, sl] for n in ("q", "k", "v"))
    g = None if x["g"] is None else x["g"][:, sl]
    if op == "delta":
        return delta_rule(q, k, v, x["beta"][:, sl], g, output_final_state=True, **kw)
    return linear_attention(
        q, k, v, g, normalize=op == "linear_normalized", output_final_state=True, **kw
    )


def inputs(op, gate, **kw):
    x = make_inputs(
        gate=gate,
        rule="delta" if op == "delta" else "additive",
        positive=op == "linear_normalized",
        **kw,
    )
    return x


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_split_sequence_with_state_passing(op, gate, mode):
    x = inputs(op, gate, T=30)
    o, S = call(op, x, mode=mode, chunk_size=4)
    o1, S1 = call(op, x, slice(0, 13), mode=mode, chunk_size=4)
    o2, S2 = call(op, x, slice(13, None), mode=mode, chunk_size=4, initial_state=S1)
    torch.testing.assert_close(torch.cat([o1, o2], dim=1), o, rtol=0, atol=1e-12)
    torch.testing.assert_close(S2, S, rtol=0, atol=1e-12)


@pytest.mark.parametrize("op", OPS)
def test_generation_steps_equal_one_pass(op):
    # T = 1 with the previous state, token after token, in recurrent mode: the generation step.
    x = inputs(op, "channel", T=9)
    o, S = call(op, x, mode="chunk", chunk_size=4)
    state = None
    for t in range(9):
        o_t, state = call(op, x, slice(t, t + 1), mode="recurrent", initial_state=state)
        torch.testing.assert_close(o_t, o[:, t : t + 1], rtol=0, atol=1e-12)
    torch.testing.assert_close(state, S, rtol=0, atol=1e-12)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
@pytest.mark.parametrize("with_state", [False, True])
def test_cu_seqlens_equals_each_sequence_alone(op, gate, mode, with_state):
    x = inputs(op, gate, B=1, T=23)
    bounds = [0, 5, 6, 23]
    H, K, V = 2, 4, 3 + (op == "linear_normalized")
    S0 = torch.rand(3, H, K, V, dtype=torch.float64) if with_state else None
    o, S = call(op, x, mode=mode, chunk_size=4, initial_state=S0, cu_seqlens=torch.tensor(bounds))
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        init = None if S0 is None else S0[n : n + 1]
        o_n, S_n = call(op, x, slice(a, b), mode=mode, chunk_size=4, initial_state=init)
        torch.testing.assert_close(o[:, a:b], o_n, rtol=0, atol=1e-12)
        torch.testing.assert_close(S[n : n + 1], S_n, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", OPS)
def test_dtypes(dtype, op):
    x = {n: (None if t is None else t.to(dtype)) for n, t in inputs(op, "scalar").items()}
    o, S = call(op, x)
    assert o.dtype == dtype
    assert S.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert torch.isfinite(o).all()


def test_final_state_is_none_unless_asked():
    x = make_inputs(rule="delta")
    assert linear_attention(x["q"], x["k"], x["v"])[1] is None
    assert delta_rule(x["q"], x["k"], x["v"], x["beta"])[1] is None


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("packed", [False, True])
def test_chunk_output_is_contiguous_in_the_public_layout(op, packed):
    """[B, T, H, V] contiguous, so that a layer's reshape to [B, T, H V] needs no copy."""
    x = inputs(op, "channel", B=1, T=23)
    cu = torch.tensor([0, 9, 23]) if packed else None
    o, _ = call(op, x, mode="chunk", chunk_size=4, cu_seqlens=cu)
    assert o.is_contiguous()
