"""Forgetting attention (FoX) and stick-breaking attention: both forms against the float64 loops
of ``linattn.reference``, with windows, sinks, grouped heads and packed sequences; gradients;
the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops import softmax_attention
from linattn.ops.softmax_variants import forgetting_attention, stickbreaking_attention
from linattn.reference.forgetting import forgetting_attention as fox_reference
from linattn.reference.stickbreaking import stickbreaking_attention as sb_reference

B, T, HQ, H, K, V = 2, 37, 4, 2, 8, 5
FORMS = [("parallel", 64), ("chunk", 16), ("chunk", 7), ("chunk", 64)]


def _inputs(dtype=torch.float64, seed=0, T=T, B=B):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, HQ, K),
        "k": randn(B, T, H, K),
        "v": randn(B, T, H, V),
        "g": F.logsigmoid(randn(B, T, HQ) + 2.0),
        "sink": randn(HQ),
    }
    return {n: t.to(dtype) for n, t in x.items()}


def _fox_oracle(x, scale, window_size=None, sink=False, cu_seqlens=None):
    Bn, Tn = x["q"].shape[:2]
    bounds = [0, Tn] if cu_seqlens is None else cu_seqlens.tolist()
    o = np.zeros((Bn, Tn, HQ, V))
    for b in range(Bn):
        for h in range(HQ):
            for a, e in zip(bounds[:-1], bounds[1:], strict=True):
                o[b, a:e, h] = fox_reference(
                    *(
                        x[n][b, a:e, h // (HQ // H) if n in "kv" else h].double().numpy()
                        for n in ("q", "k", "v", "g")
                    ),
                    scale=scale,
                    window_size=window_size,
                    sink=float(x["sink"][h]) if sink else None,
                )
    return torch.from_numpy(o)


def _sb_oracle(x, scale, attend_current, cu_seqlens=None):
    Bn, Tn = x["q"].shape[:2]
    bounds = [0, Tn] if cu_seqlens is None else cu_seqlens.tolist()
    o, rem = np.zeros((Bn, Tn, HQ, V)), np.zeros((Bn, Tn, HQ))
    for b in range(Bn):
        for h in range(HQ):
            for a, e in zip(bounds[:-1], bounds[1:], strict=True):
                o[b, a:e, h], rem[b, a:e, h] = sb_reference(
                    *(
                        x[n][b, a:e, h // (HQ // H) if n in "kv" else h].double().numpy()
                        for n in ("q", "k", "v")
                    ),
                    scale=scale,
                    attend_current=attend_current,
                )
    return torch.from_numpy(o), torch.from_numpy(rem)


@pytest.mark.parametrize(("mode", "C"), FORMS)
@pytest.mark.parametrize("window_size", [None, 5, 20])
@pytest.mark.parametrize("sink", [False, True])
def test_forgetting_forms_equal_the_reference_in_float64(mode, C, window_size, sink):
    x = _inputs()
    ref = _fox_oracle(x, 0.3, window_size, sink)
    o = forgetting_attention(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        scale=0.3,
        window_size=window_size,
        sink_bias=x["sink"] if sink else None,
        mode=mode,
        chunk_size=C,
    )
    torch.testing.assert_close(o, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mode", "C"), FORMS)
def test_forgetting_packed_sequences_with_a_length_one_piece(mode, C):
    x = _inputs(B=1)
    cu = torch.tensor([0, 1, 20, 20, 37])
    ref = _fox_oracle(x, None, 9, True, cu)
    o = forgetting_attention(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        window_size=9,
        sink_bias=x["sink"],
        cu_seqlens=cu,
        mode=mode,
        chunk_size=C,
    )
    torch.testing.assert_close(o, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mode", "C"), FORMS)
def test_forgetting_with_zero_gates_is_softmax_attention(mode, C):
    x = _inputs()
    kv = {n: x[n].repeat_interleave(HQ // H, dim=2) for n in ("k", "v")}
    o = forgetting_attention(
        x["q"], x["k"], x["v"], torch.zeros_like(x["g"]), mode=mode, chunk_size=C
    )
    torch.testing.assert_close(o, softmax_attention(x["q"], kv["k"], kv["v"]), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mode", "C"), FORMS)
@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_forms_equal_the_reference_in_float64(mode, C, attend_current):
    x = _inputs()
    ref_o, ref_rem = _sb_oracle(x, 0.3, attend_current)
    o, rem = stickbreaking_attention(
        x["q"], x["k"], x["v"], scale=0.3, attend_current=attend_current, mode=mode, chunk_size=C
    )
    torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(rem, ref_rem, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mode", "C"), FORMS)
def test_stickbreaking_packed_sequences_with_a_length_one_piece(mode, C):
    x = _inputs(B=1)
    cu = torch.tensor([0, 1, 20, 20, 37])
    ref_o, ref_rem = _sb_oracle(x, None, False, cu)
    o, rem = stickbreaking_attention(x["q"], x["k"], x["v"], cu_seqlens=cu, mode=mode, chunk_size=C)
    torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(rem, ref_rem, rtol=0, atol=1e-12)


def _grads(fn, x, names):
    leaves = {n: x[n].clone().requires_grad_(True) for n in names}
    out = fn(leaves)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum() for o in outs)
    loss.backward()
    return [leaves[n].grad for n in names]


def _small(t, name):
    """One sequence of 7 tokens, 2 query heads on 1 key/value head: gradcheck's size."""
    if name == "sink":
        return t[:2].clone()
    return t[:1, :7, : (1 if name in "kv" else 2)].clone()


def test_forgetting_gradients_agree_across_forms_and_with_gradcheck():
    x = _inputs(T=21)
    names = ("q", "k", "v", "g", "sink")

    def run(mode, C):
        return lambda t: forgetting_attention(
            t["q"],
            t["k"],
            t["v"],
            t["g"],
            window_size=8,
            sink_bias=t["sink"],
            mode=mode,
            chunk_size=C,
        )

    first = _grads(run("parallel", 64), x, names)
    for C in (4, 7):
        for a, b in zip(_grads(run("chunk", C), x, names), first, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    small = {n: _small(t, n) for n, t in x.items()}
    args = [small[n].requires_grad_(True) for n in names]
    torch.autograd.gradcheck(
        lambda q, k, v, g, s: forgetting_attention(
            q, k, v, g, window_size=4, sink_bias=s, mode="chunk", chunk_size=4
        ),
        args,
    )


def test_stickbreaking_gradients_agree_across_forms_and_with_gradcheck():
    x = _inputs(T=21)
    names = ("q", "k", "v")

    def run(mode, C):
        return lambda t: stickbreaking_attention(t["q"], t["k"], t["v"], mode=mode, chunk_size=C)

    first = _grads(run("parallel", 64), x, names)
    for C in (4, 7):
        for a, b in zip(_grads(run("chunk", C), x, names), first, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    args = [_small(x[n], n).requires_grad_(True) for n in names]
    torch.autograd.gradcheck(
        lambda q, k, v: stickbreaking_attention(q, k, v, mode="chunk", chunk_size=4), args
    )


@pytest.mark.parametrize(("mode", "C"), FORMS)
def test_float32_relative_rms_against_float64(mode, C):
    """float32 against the float64 oracle: a relative RMS of about 1e-7 (asserted < 1e-6)."""
    x = _inputs(torch.float32)
    ref = _fox_oracle(x, None, None, True)
    o = forgetting_attention(
        x["q"], x["k"], x["v"], x["g"], sink_bias=x["sink"], mode=mode, chunk_size=C
    )
    assert o.dtype == torch.float32
    assert ((o.double() - ref).norm() / ref.norm()) < 1e-6
    ref_o, _ = _sb_oracle(x, None, False)
    o, rem = stickbreaking_attention(x["q"], x["k"], x["v"], mode=mode, chunk_size=C)
    assert o.dtype == rem.dtype == torch.float32
    assert ((o.double() - ref_o).norm() / ref_o.norm()) < 1e-6


def test_t_one_and_empty():
    x = _inputs(T=1)
    o = forgetting_attention(x["q"], x["k"], x["v"], x["g"], mode="chunk")
    torch.testing.assert_close(o, x["v"].repeat_interleave(2, dim=2), rtol=0, atol=1e-15)
    o, rem = stickbreaking_attention(x["q"], x["k"], x["v"], mode="chunk")
    assert torch.equal(o, torch.zeros_like(o)) and torch.equal(rem, torch.ones_like(rem))
    e = _inputs(T=0)
    assert forgetting_attention(e["q"], e["k"], e["v"]).shape == (B, 0, HQ, V)
    assert stickbreaking_attention(e["q"], e["k"], e["v"])[0].shape == (B, 0, HQ, V)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"q": torch.zeros(2, 37, 3, 8, dtype=torch.float64)}, ValueError, "query heads"),
        ({"k": torch.zeros(2, 36, 2, 8, dtype=torch.float64)}, ValueError, "^k must have"),
        ({"v": torch.zeros(2, 37, 3, 5, dtype=torch.float64)}, ValueError, "^v must have"),
        ({"v": torch.zeros(2, 37, 2, 5)}, TypeError, "share one dtype"),
        ({"g": torch.zeros(2, 37, 2, dtype=torch.float64)}, ValueError, "^g must have"),
        ({"g": torch.full((2, 37, 4), float("nan"), dtype=torch.float64)}, ValueError, "^g "),
        ({"sink_bias": torch.zeros(3, dtype=torch.float64)}, ValueError, "^sink_bias"),
        ({"window_size": 0}, ValueError, "^window_size"),
        ({"window_size": 2.5}, TypeError, "^window_size"),
        ({"mode": "recurrent"}, ValueError, "^mode"),
        ({"chunk_size": 0}, ValueError, "^chunk_size"),
        ({"scale": "x"}, TypeError, "^scale"),
        ({"cu_seqlens": torch.tensor([0, 37])}, ValueError, "cu_seqlens needs batch size"),
    ],
)
def test_forgetting_refuses_bad_input_naming_the_argument(change, error, match):
    x = _inputs()
    args = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"], **change}
    with pytest.raises(error, match=match):
        forgetting_attention(**args)


def test_stickbreaking_refuses_bad_input_naming_the_argument():
    x = _inputs()
    with pytest.raises(TypeError, match="^attend_current"):
        stickbreaking_attention(x["q"], x["k"], x["v"], attend_current=1)
    with pytest.raises(ValueError, match="^mode"):
        stickbreaking_attention(x["q"], x["k"], x["v"], mode="scan")
    with pytest.raises(TypeError, match="^q must be a torch.Tensor"):
        stickbreaking_attention(None, x["k"], x["v"])
