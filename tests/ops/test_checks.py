"""Bad input: a clear ValueError/TypeError naming the argument, raised before any work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.ops import delta_rule, linear_attention

from .cases import make_inputs


@pytest.fixture
def x():
    return make_inputs(B=1, T=8, gate="scalar", rule="delta", dtype=torch.float32)


def lin(x, **kw):
    args = {n: x[n] for n in ("q", "k", "v")}
    return linear_attention(**{**args, **kw})


def delta(x, **kw):
    args = {n: x[n] for n in ("q", "k", "v", "beta")}
    return delta_rule(**{**args, **kw})


def poison(t, value):
    t = t.clone()
    t.view(-1)[3] = value
    return t


CASES = [
    # (argument named in the message, keyword overrides)
    ("k", lambda x: {"k": x["k"][..., :3]}),
    ("v", lambda x: {"v": x["v"][:, :5]}),
    ("q", lambda x: {"q": x["q"][0]}),
    ("q", lambda x: {"q": poison(x["q"], float("nan"))}),
    ("k", lambda x: {"k": poison(x["k"], float("inf"))}),
    ("v", lambda x: {"v": poison(x["v"], float("-inf"))}),
    ("g", lambda x: {"g": -x["g"] + 0.1}),
    ("g", lambda x: {"g": poison(x["g"], float("nan"))}),
    ("g", lambda x: {"g": poison(x["g"], float("inf"))}),
    ("g", lambda x: {"g": x["g"][:, :4]}),
    ("g", lambda x: {"g": torch.zeros(1, 8, 2, 3)}),
    ("mode", lambda x: {"mode": "fused"}),
    ("chunk_size", lambda x: {"chunk_size": 0}),
    ("chunk_size", lambda x: {"chunk_size": -3}),
    ("cu_seqlens", lambda x: {"cu_seqlens": torch.tensor([0, 5, 3, 8])}),
    ("cu_seqlens", lambda x: {"cu_seqlens": torch.tensor([0, 5, 7])}),
    ("cu_seqlens", lambda x: {"cu_seqlens": torch.tensor([1, 5, 8])}),
    ("initial_state", lambda x: {"initial_state": torch.zeros(1, 2, 4, 4)}),
    ("initial_state", lambda x: {"initial_state": torch.full((1, 2, 4, 3), float("nan"))}),
]


@pytest.mark.parametrize("name,bad", CASES)
@pytest.mark.parametrize("op", [lin, delta])
def test_value_errors_name_the_argument(op, name, bad, x):
    with pytest.raises(ValueError, match=name):
        op(x, **bad(x))


@pytest.mark.parametrize("bad", [-0.1, 2.1, float("nan")], ids=["negative", "above-two", "nan"])
def test_beta_range(bad, x):
    with pytest.raises(ValueError, match="beta"):
        delta(x, beta=poison(x["beta"], bad))
    with pytest.raises(ValueError, match="beta"):
        delta(x, beta=x["beta"][..., :1])


def test_type_errors(x):
    with pytest.raises(TypeError, match="chunk_size"):
        lin(x, chunk_size=4.0)
    with pytest.raises(TypeError, match="q"):
        lin(x, q=x["q"].numpy())
    with pytest.raises(TypeError, match="dtype"):
        lin(x, v=x["v"].double())
    with pytest.raises(TypeError, match="cu_seqlens"):
        lin(x, cu_seqlens=torch.tensor([0.0, 8.0]))
    with pytest.raises(TypeError, match="q"):
        lin(x, q=x["q"].to(torch.int64))


def test_cu_seqlens_needs_batch_one():
    y = make_inputs(B=2, T=8)
    with pytest.raises(ValueError, match="cu_seqlens"):
        linear_attention(y["q"], y["k"], y["v"], cu_seqlens=torch.tensor([0, 8]))


def test_checks_run_before_work(x, monkeypatch):
    # Patch the engine to fail loudly: bad input must never reach it.
    from linattn.ops import _engine

    def boom(*args, **kwargs):
        raise AssertionError("work started before validation")

    monkeypatch.setattr(_engine, "run", boom)
    with pytest.raises(ValueError, match="beta"):
        delta(x, beta=x["beta"] + 3)
    with pytest.raises(ValueError, match="mode"):
        lin(x, mode="fused")


@pytest.mark.parametrize(
    "dtype,big", [(torch.float16, 3e4), (torch.bfloat16, 3e38), (torch.float32, 3e38),
                  (torch.float64, 1e308)],
)  # fmt: skip
def test_all_finite_settles_an_overflowing_sum_entry_by_entry(dtype, big):
    """Finite entries whose sum overflows are finite; a NaN or an Inf anywhere is not, in a
    contiguous tensor or a strided one, at its first, middle or last entry."""
    from linattn.ops.checks import all_finite

    huge = torch.full((4, 1001), big, dtype=dtype)
    assert not torch.isfinite(huge.sum())
    assert all_finite(huge) and all_finite(-huge) and all_finite(huge[:, ::3])
    for bad in (float("nan"), float("inf"), float("-inf")):
        for at in (0, 2002, 4003):
            x = huge.clone()
            x.view(-1)[at] = bad
            assert not all_finite(x)
            strided = torch.full((4004, 3), big, dtype=dtype)
            strided[at, 1] = bad
            assert not all_finite(strided[:, 1])


def test_a_float16_input_whose_sum_overflows_is_accepted_and_its_nan_refused():
    """A float16 v in [1, 2) in every entry (a positive-mean activation) sums past 65,504: the op
    takes it, as the float32 copy of the same numbers, and still names a NaN in it."""
    q, k = (torch.randn(1, 1024, 2, 32).mul(0.1).half() for _ in range(2))
    v = (torch.rand(1, 1024, 2, 32) + 1).half()  # 65,536 entries >= 1: a sum past 65,504
    assert not torch.isfinite(v.sum())
    o, _ = linear_attention(q, k, v, mode="chunk")
    o32, _ = linear_attention(q.float(), k.float(), v.float(), mode="chunk")
    assert o.dtype == torch.float16
    torch.testing.assert_close(o.float(), o32, rtol=2e-3, atol=2e-3)
    v[0, 1000, 1, 7] = float("nan")
    with pytest.raises(ValueError, match="v contains non-finite values"):
        linear_attention(q, k, v, mode="chunk")


@pytest.mark.parametrize("op", [lin, delta])
@pytest.mark.parametrize("mode", ["chunk", "parallel", "recurrent"])
def test_a_reset_is_accepted(op, mode, x):
    """g = -inf (a reset: the decay is exactly 0) is a valid log-decay; NaN is not."""
    g = poison(x["g"], float("-inf"))
    o, _ = op(x, g=g, mode=mode)
    assert torch.isfinite(o).all()
    with pytest.raises(ValueError, match="g contains NaN"):
        op(x, g=poison(x["g"], float("nan")), mode=mode)


@pytest.mark.parametrize("value", ["no", "yes", "", 1, 0, None, torch.tensor(True)])
@pytest.mark.parametrize(
    "op,name",
    [(lin, "normalize"), (lin, "output_final_state"), (delta, "use_qk_l2norm"),
     (delta, "output_final_state")],
)  # fmt: skip
def test_flags_must_be_bools(x, op, name, value):
    """A truthy string ("no") or an int would silently switch the option on (or off)."""
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        op(x, **{name: value})


@pytest.mark.parametrize("name", ["fused", "causal"])
def test_softmax_flags_must_be_bools(x, name):
    from linattn.ops import softmax_attention

    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        softmax_attention(x["q"], x["k"], x["v"], **{name: "no"})


def test_numpy_bools_are_bools(x):
    import numpy as np

    o_np, S_np = delta(x, use_qk_l2norm=np.bool_(True), output_final_state=np.True_)
    o, S = delta(x, use_qk_l2norm=True, output_final_state=True)
    assert torch.equal(o_np, o) and torch.equal(S_np, S)


@pytest.mark.parametrize(
    "chunk_size", [np.int64(4), np.int32(4), np.uint8(4), torch.tensor(4)], ids=repr
)
@pytest.mark.parametrize("op", [lin, delta])
def test_chunk_size_of_any_integer_type(x, op, chunk_size):
    assert torch.equal(op(x, chunk_size=chunk_size)[0], op(x, chunk_size=4)[0])


@pytest.mark.parametrize("chunk_size", [True, np.bool_(True), 4.0, np.float64(4.0), "4"])
def test_chunk_size_must_be_an_integer(x, chunk_size):
    with pytest.raises(TypeError, match="chunk_size must be an int"):
        lin(x, chunk_size=chunk_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_range_messages_show_a_value_just_out_of_range(x, dtype):
    """2 + 1 ulp printed as "2" (``.3g``) made a refused beta look allowed."""
    two_plus = torch.nextafter(torch.tensor(2.0, dtype=dtype), torch.tensor(3.0, dtype=dtype))
    beta = x["beta"].to(dtype).clone()
    beta.view(-1)[0] = two_plus
    args = {n: x[n].to(dtype) for n in ("q", "k", "v")}
    shown = "2.0000002" if dtype == torch.float32 else "2.0000000000000004"
    with pytest.raises(ValueError, match=rf"beta must lie in \[0, 2\]; got range \[.*, {shown}\]"):
        delta_rule(**args, beta=beta)
