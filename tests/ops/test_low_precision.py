"""bfloat16 and float16 inputs read by the chunk kernels in their dtype.

The chunk form converts each chunk's rows into float32 blocks inside the fused kernels and writes
o (and, backward, every input's gradient) in the input dtype from its blocks: no whole-tensor
float32 copy. The arithmetic is float32 either way, so the results are those of converting the
inputs to float32 first and the outputs back at the end (the former path): each test compares the
two, for every mechanism, forward and gradients, with initial states, packed sequences, grouped
value heads, odd strides, both schedules and the PyTorch loop: to the last unit of the low
dtype, up to float32's rounding at each tensor's scale (``assert_rounded``: the BLAS may sum the
same products in another order for rows at another stride, which a gradient that cancels to a
small value shows in more than one of its own units). The ops' registration (schema, fake
kernels, autograd) is checked with these dtypes too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.ops import _native, delta_rule, generalized_delta_rule, library, linear_attention
from tests.ops.test_library import FAST, PLAIN, _backward_args, _forward_args, _inputs

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)
LOW = [torch.bfloat16, torch.float16]
# (name, op, the inputs it reads after q, k, v)
MECHANISMS = {
    "linear": ((), linear_attention),
    "scalar_decay": (("g",), linear_attention),
    "gla": (("gk",), linear_attention),
    "delta": (("beta",), delta_rule),
    "gated_deltanet": (("beta", "g"), delta_rule),
    "kda": (("beta", "gk"), delta_rule),
    "dplr": (("a", "b", "gk"), generalized_delta_rule),
}


def make(dtype, *, B=1, T=37, H=2, G=1, K=8, V=6, seed=0, layout="public") -> dict:
    """Inputs [B, T, heads, ...] in ``dtype`` (float32 values rounded once); value heads G H.
    ``layout`` "odd": every tensor a strided view (heads-major storage, rows of a wider one)."""
    gen = torch.Generator().manual_seed(seed)
    HV = G * H

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x = {
        "q": randn(B, T, H, K), "k": F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, HV, V), "beta": torch.rand(B, T, HV, generator=gen),
        "g": F.logsigmoid(randn(B, T, HV) + 2), "gk": F.logsigmoid(randn(B, T, HV, K) + 2),
        "a": -0.3 * F.normalize(randn(B, T, HV, K), dim=-1),
        "b": 0.3 * F.normalize(randn(B, T, HV, K), dim=-1),
    }  # fmt: skip
    x = {n: t.to(dtype) for n, t in x.items()}
    if layout == "odd":
        x = {n: _odd(t) for n, t in x.items()}
    return x


def _odd(t: torch.Tensor) -> torch.Tensor:
    """t's values as a strided view: [B, H, T, 2 D] storage, the first D of each row, seen as
    [B, T, H, D] (a time stride 2 D, a head stride 2 T D); [B, T, H] tensors heads-major."""
    if t.dim() == 3:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    wide = torch.cat([t, torch.full_like(t, float("nan"))], dim=-1)  # never read
    return wide.transpose(1, 2).contiguous().transpose(1, 2)[..., : t.shape[-1]]


def call(mech: str, x: dict, **options):
    names, op = MECHANISMS[mech]
    return op(x["q"], x["k"], x["v"], *(x[n] for n in names), output_final_state=True, **options)


def run(mech: str, x: dict, S0, seed: int = 1, **options):
    """o, the final state and the gradients of every input (and S0) from one weighted sum of o
    and S, in the inputs' dtype."""
    names = ("q", "k", "v", *MECHANISMS[mech][0])
    leaves = {n: x[n].detach().requires_grad_() for n in names}
    S0 = None if S0 is None else S0.detach().requires_grad_()
    o, S = call(mech, {**x, **leaves}, initial_state=S0, **options)
    gen = torch.Generator().manual_seed(seed)
    w_o = torch.randn(o.shape, generator=gen).to(o.dtype)
    w_S = torch.randn(S.shape, generator=gen)
    ((o * w_o).sum() + (S * w_S).sum()).backward()
    grads = {n: t.grad for n, t in leaves.items()}
    if S0 is not None:
        grads["S0"] = S0.grad
    return o, S, grads


def former(mech: str, x: dict, S0, dtype, **options):
    """The former path: the inputs converted to float32 first and o converted to ``dtype`` at
    the end (so that the weighted sum and d_o are those of ``run``); o and the gradients as the
    float32 arithmetic left them, before their rounding to ``dtype``."""
    x32 = {n: t.float() for n, t in x.items()}
    names = ("q", "k", "v", *MECHANISMS[mech][0])
    leaves = {n: x32[n].detach().requires_grad_() for n in names}
    S0 = None if S0 is None else S0.detach().requires_grad_()
    o, S = call(mech, {**x32, **leaves}, initial_state=S0, **options)
    gen = torch.Generator().manual_seed(1)
    w_o = torch.randn(o.shape, generator=gen).to(dtype)
    w_S = torch.randn(S.shape, generator=gen)
    ((o.to(dtype) * w_o).sum() + (S * w_S).sum()).backward()
    grads = {n: t.grad for n, t in leaves.items()}
    if S0 is not None:
        grads["S0"] = S0.grad
    return o, S, grads


MANTISSA = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}
FLOAT32_SCALE = 2.0**-17  # float32 rounding at a tensor's scale: 64 units of 2^-23


def assert_rounded(low: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    """low is the float32 ``ref`` rounded to low's dtype: within one unit in the last place of
    low's dtype at each element, plus float32's rounding at the tensor's scale (the BLAS may sum a
    product of the same values in another order for rows at another stride, and a gradient that
    cancels to a small value magnifies that in units of its own last place)."""
    assert low.dtype in MANTISSA and ref.dtype == torch.float32, name
    _, exponent = torch.frexp(ref)
    unit = torch.ldexp(torch.ones_like(ref), exponent - 1 - MANTISSA[low.dtype])
    if low.dtype == torch.float16:
        unit = unit.clamp(min=2.0**-24)  # float16's subnormal step
    bound = unit + FLOAT32_SCALE * ref.abs().max()
    err = (low.float() - ref).abs()
    assert bool((err <= bound).all()), f"{name}: {float((err / bound).max()):.2f} x the bound"


def assert_same(mech, x, S0, dtype, **options):
    o, S, grads = run(mech, x, S0, **options)
    o_ref, S_ref, grads_ref = former(mech, x, S0, dtype, **options)
    assert o.dtype == dtype and S.dtype == torch.float32
    assert_rounded(o, o_ref, "o")
    assert_rounded(S, S_ref, "S")
    for name, d in grads.items():
        assert d.dtype == (torch.float32 if name == "S0" else dtype), name
        assert_rounded(d, grads_ref[name], name)


def state(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@needs_native
@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("mech", list(MECHANISMS))
def test_low_precision_equals_converting_first(mech, dtype):
    x = make(dtype)
    S0 = state(1, 2, 8, 6)
    assert_same(mech, x, S0, dtype, chunk_size=16)


@needs_native
@pytest.mark.parametrize("mech", ["linear", "gla", "kda", "dplr"])
def test_grouped_heads_odd_strides_and_states(mech):
    x = make(torch.bfloat16, B=2, G=2, layout="odd", seed=3)
    S0 = state(2, 4, 8, 6).transpose(2, 3).contiguous().transpose(2, 3)  # strided too
    assert_same(mech, x, S0, torch.bfloat16, chunk_size=8)


@needs_native
@pytest.mark.parametrize("mech", ["gated_deltanet", "gla"])
def test_packed_sequences(mech):
    x = make(torch.bfloat16, T=41, seed=5)
    cu = torch.tensor([0, 5, 22, 41])
    S0 = state(3, 2, 8, 6)
    assert_same(mech, x, S0, torch.bfloat16, chunk_size=8, cu_seqlens=cu)


@needs_native
@pytest.mark.parametrize("schedule", ["split", "fused"])
@pytest.mark.parametrize("mech", ["delta", "kda"])
def test_both_schedules(mech, schedule, monkeypatch):
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    x = make(torch.float16, T=50, seed=7)
    assert_same(mech, x, None, torch.float16, chunk_size=16)


@needs_native
@pytest.mark.parametrize("schedule", ["split", "fused"])
def test_two_threads(schedule, monkeypatch):
    """Each thread converts into its own blocks."""
    monkeypatch.setenv("LINATTN_SCHEDULE", schedule)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = make(torch.bfloat16, B=2, T=45, seed=8)
        assert_same("kda", x, state(2, 2, 8, 6), torch.bfloat16, chunk_size=8)
    finally:
        torch.set_num_threads(threads)


@needs_native
@pytest.mark.parametrize(("dtype", "tiny"), [(torch.float16, 3e-6), (torch.bfloat16, 1e-39)])
def test_subnormal_inputs_convert_exactly(dtype, tiny):
    """Subnormals of the input dtype are exact float32 values in the blocks, as they are in a
    float32 copy (the kernels flush float32 subnormals, none of which these are for float16)."""
    x = make(dtype, seed=2)
    for name in ("q", "k", "v"):
        x[name] = x[name].clone()
        x[name].view(-1)[::3] = tiny
    assert_same("gla", x, None, dtype, chunk_size=16)


@pytest.mark.parametrize("mech", ["linear", "kda"])
def test_the_pytorch_loop_takes_low_precision_too(mech, pytorch_loop):
    x = make(torch.bfloat16, seed=9)
    assert_same(mech, x, state(1, 2, 8, 6), torch.bfloat16, chunk_size=16)


@needs_native
def test_mixed_dtypes_l2norm_keys():
    """use_qk_l2norm computes q and k in float32, v, beta and g stay bfloat16: each input is
    read in its own dtype."""
    x = make(torch.bfloat16, seed=11)
    o, S = delta_rule(x["q"], x["k"], x["v"], x["beta"], x["gk"], use_qk_l2norm=True,
                      output_final_state=True, chunk_size=16)  # fmt: skip
    y = {n: t.float() for n, t in x.items()}
    o_ref, S_ref = delta_rule(y["q"], y["k"], y["v"], y["beta"], y["gk"], use_qk_l2norm=True,
                              output_final_state=True, chunk_size=16)  # fmt: skip
    assert o.dtype == torch.bfloat16
    assert_rounded(o, o_ref, "o")
    assert_rounded(S, S_ref, "S")


@pytest.mark.parametrize("mech", ["gla", "kda"])
def test_double_backward(mech):
    """create_graph=True: the all-blocks form's gradients on the inputs in float32, each
    returned in its input's dtype, and differentiable again."""
    x = make(torch.bfloat16, T=20, seed=12)
    names = ("q", "k", "v", *MECHANISMS[mech][0])

    def grads(dtype):
        leaves = {n: x[n].to(dtype).detach().requires_grad_() for n in names}
        o, _ = call(mech, {**x, **leaves}, chunk_size=8)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1))
        first = torch.autograd.grad((o.to(torch.bfloat16) * w.bfloat16()).sum(),
                                    list(leaves.values()), create_graph=True)  # fmt: skip
        rounded = [d.to(torch.bfloat16) for d in first]  # as the bfloat16 call rounds them
        second = torch.autograd.grad(sum(d.float().square().sum() for d in rounded),
                                     leaves["q"])  # fmt: skip
        return [*first, *second]

    for a, b in zip(grads(torch.bfloat16), grads(torch.float32), strict=True):
        assert_rounded(a, b, "gradient")


def _low(x: dict, dtype) -> dict:
    """The inputs (not the state) in ``dtype``."""
    return {n: t if t is None or n == "S0" else t.detach().to(dtype) for n, t in x.items()}


@pytest.mark.parametrize("backend", [pytest.param("1", marks=needs_native), "0"])
@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize(("rule", "gate"), [("additive", "channel"), ("delta", "scalar"),
                                            ("dplr", "channel")])  # fmt: skip
def test_opcheck_low_precision(rule, gate, dtype, backend, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = {n: t if t is None or n == "S0" else t.requires_grad_() for n, t in
         _low(_inputs(rule, gate, G=2), dtype).items()}  # fmt: skip
    torch.library.opcheck(library.chunk_forward, _forward_args(x), test_utils=FAST)
    args = list(_backward_args(x))
    args[6] = args[6].to(dtype)  # d_o in o's dtype
    torch.library.opcheck(library.chunk_backward, tuple(args), test_utils=FAST)
    if backend == "1":
        ops = torch.ops.linattn_native
        y = _low(_inputs(rule, gate, grad=False), dtype)
        torch.library.opcheck(ops.chunk_forward, _forward_args(y), test_utils=PLAIN)


@needs_native
def test_outputs_in_the_input_dtype_from_the_kernel():
    x = _low(_inputs("delta", "channel", grad=False), torch.bfloat16)
    o, S, states = library.chunk_forward(*_forward_args(x))
    assert o.dtype == torch.bfloat16 and S.dtype == states.dtype == torch.float32
    d_o = torch.randn(o.shape).to(torch.float16)  # d_o in a dtype of its own: read as it is
    args = list(_backward_args(x))
    args[6] = d_o
    grads = library.chunk_backward(*args)
    assert [d.dtype for d in grads] == [torch.bfloat16] * 5 + [torch.float32]
