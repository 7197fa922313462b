"""The fused C++ chunk form on every layout the public ops accept, and its entry points' own checks.

A 1-token slice of an expanded tensor has time stride 0, which the fused loop
passed to the BLAS as a leading dimension (MKL refused the call and the output was uninitialised
memory). Every layout here (expanded in any dimension, transposed, sliced, offset, overlapping rows,
size-1 dimensions with odd strides) is checked against the float64 recurrence, forward and
gradients, and so is a direct call of the compiled op. Defect 6: chunks of 46,341 tokens and more
overflowed an int in the kernel's scratch sizes; such chunks are refused before any work.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn.ops import _engine, _native, delta_rule, linear_attention

from .cases import oracle, rel_rms

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)


def _expand(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x's first slice along ``dim`` repeated (stride 0 there)."""
    return x.narrow(dim, 0, 1).expand_as(x)


def _strided(x: torch.Tensor, strides: list[int]) -> torch.Tensor:
    """x's values in a tensor of the given strides (a big enough buffer, offset by 3)."""
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, strides, strict=True))
    out = torch.empty(span + 3, dtype=x.dtype).as_strided(x.shape, strides, 3)
    return out.copy_(x)


def _odd_size_one(x: torch.Tensor) -> torch.Tensor:
    """Contiguous strides, except 0 and 1234 alternately for the dimensions of size 1."""
    strides, step, odd = [0] * x.dim(), 1, itertools.cycle([0, 1234])
    for d in reversed(range(x.dim())):
        strides[d] = step if x.shape[d] > 1 else next(odd)
        step *= x.shape[d]
    return _strided(x, strides)


def _overlapping_rows(x: torch.Tensor) -> torch.Tensor:
    """A sliding window along time ([B, T, H, D] with time stride 1 < D): the rows overlap."""
    if x.dim() < 4:
        return x
    B, T, H, D = x.shape
    n = B * H * (T + D)
    flat = x.flatten().repeat(n // x.numel() + 1)[:n]  # x's values, as many as the window needs
    return flat.as_strided((B, T, H, D), (H * (T + D), 1, T + D, 1))


# Each layout maps a contiguous float32 tensor to one with that layout; the values may change
# (an expansion repeats a slice), and the reference is computed from the tensor it returns.
LAYOUTS = {
    "contiguous": lambda x: x,
    "expanded time": lambda x: _expand(x, 1),
    "expanded batch": lambda x: _expand(x, 0),
    "expanded heads": lambda x: _expand(x, 2),
    "expanded last": lambda x: _expand(x, x.dim() - 1),
    "heads before time": lambda x: x.transpose(1, 2).contiguous().transpose(1, 2),
    "reversed dimensions": lambda x: (
        x.permute(*reversed(range(x.dim()))).contiguous().permute(*reversed(range(x.dim())))
    ),
    "every second element": lambda x: torch.empty([2 * n for n in x.shape], dtype=x.dtype)[
        tuple(slice(None, None, 2) for _ in x.shape)
    ].copy_(x),
    "storage offset": lambda x: (
        torch.empty(x.numel() + 5, dtype=x.dtype)[5:].view(x.shape).copy_(x)
    ),
    "size-1 dims, odd strides": _odd_size_one,
    "overlapping rows": _overlapping_rows,
}
MECHANISMS = list(itertools.product(["additive", "delta"], [None, "scalar", "channel"]))


def _inputs(T: int, rule: str, gate: str | None, layout, seed: int = 0, B: int = 2, H: int = 3,
            K: int = 4, V: int = 5):  # fmt: skip
    """float32 q, k, v, beta, g, S0 ([B, T, H, K], v [B, T, H, V]) in ``layout``."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    x = {"q": randn(B, T, H, K), "k": randn(B, T, H, K) / K**0.5, "v": randn(B, T, H, V)}
    x["beta"] = 2 * torch.rand(B, T, H, generator=gen) if rule == "delta" else None
    shape = {None: None, "scalar": (B, T, H), "channel": (B, T, H, K)}[gate]
    x["g"] = None if shape is None else torch.nn.functional.logsigmoid(randn(*shape) + 2)
    x["S0"] = randn(B, H, K, V)
    return {n: None if t is None else layout(t) for n, t in x.items()}


def _run(x: dict, rule: str, mode: str, C: int, cu_seqlens=None):
    """o and the final state of the public op on x (scale 0.5)."""
    args = dict(
        scale=0.5,
        mode=mode,
        chunk_size=C,
        initial_state=x["S0"],
        output_final_state=True,
        cu_seqlens=cu_seqlens,
    )
    if rule == "delta":
        return delta_rule(x["q"], x["k"], x["v"], x["beta"], x["g"], **args)
    return linear_attention(x["q"], x["k"], x["v"], x["g"], **args)


def _canonical(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy of t in dtype with the contiguous strides of its shape (size-1 dimensions too)."""
    return torch.empty(t.shape, dtype=dtype).copy_(t)


def _gradients(x: dict, rule: str, mode: str, C: int, d_o: torch.Tensor, dtype=None):
    """o, S and the gradients of every input (d_o for o, ones for S); in ``dtype`` (contiguous
    copies) when given, else on x's own tensors and layouts."""
    leaves = {
        n: None if t is None else (t if dtype is None else _canonical(t, dtype)).detach()
        for n, t in x.items()
    }
    for t in leaves.values():
        if t is not None:
            t.requires_grad_()
    o, S = _run(leaves, rule, mode, C)
    torch.autograd.backward([o, S], [d_o.to(o.dtype), torch.ones_like(S)])
    grads = {n: t.grad for n, t in leaves.items() if t is not None}
    return o.detach(), S.detach(), grads


def _check_against_float64(x: dict, rule: str, C: int, d_o: torch.Tensor) -> None:
    """Forward against the independent float64 recurrence (``oracle``); every gradient (d_o for
    the output, in its own layout) against float64 autograd of the recurrent form."""
    o, S, grads = _gradients(x, rule, "chunk", C, d_o)
    o64, S64 = oracle(*(x[n] for n in ("q", "k", "v", "beta", "g", "S0")), rule=rule, scale=0.5)
    assert rel_rms(o, o64) < 2e-6 and rel_rms(S, S64) < 2e-6
    *_, exact = _gradients(x, rule, "recurrent", C, d_o, torch.float64)
    for n, grad in grads.items():
        assert rel_rms(grad, exact[n]) < 1e-5, n


@needs_native
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("rule", "gate"), MECHANISMS)
@pytest.mark.parametrize("T", [1, 9])
def test_every_layout_equals_the_float64_recurrence(layout, rule, gate, T):
    # Chunks of 4 tokens (the last of 9 has one row: its stride is never a valid leading
    # dimension unless fixed) and 16 (one chunk, longer than T).
    for C in (4, 16):
        x = _inputs(T, rule, gate, LAYOUTS[layout])
        d_o = LAYOUTS[layout](torch.randn(*x["v"].shape, generator=torch.Generator()))
        _check_against_float64(x, rule, C, d_o)


@needs_native
@pytest.mark.parametrize(("K", "V"), [(16, 32), (32, 16), (16, 24), (20, 16)])
@pytest.mark.parametrize(("rule", "gate"), [("additive", "scalar"), ("delta", "channel")])
def test_rows_of_whole_cache_lines_written_past_the_cache(K, V, rule, gate):
    # [B, T, H, D] outputs and gradients whose rows are whole 64-byte lines (D a multiple of 16
    # floats) are written with non-temporal stores (csrc/convert.h, ``stream_rows``) on AVX-512
    # machines; 24 and 20 are not (ordinary stores). Either way, the float64 recurrence's values.
    x = _inputs(37, rule, gate, lambda t: t, K=K, V=V)
    d_o = torch.randn(*x["v"].shape, generator=torch.Generator().manual_seed(1))
    _check_against_float64(x, rule, 16, d_o)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("rule", "gate"), MECHANISMS)
@pytest.mark.parametrize("T", [1, 9])
def test_every_layout_in_the_pytorch_loop(layout, rule, gate, T):
    # The same layouts through the PyTorch group loop (float64's path; float32's under
    # LINATTN_NATIVE=0 is the same code).
    x = _inputs(T, rule, gate, lambda t: LAYOUTS[layout](t.double()))
    o, S = _run(x, rule, "chunk", 4)
    o64, S64 = oracle(*(x[n] for n in ("q", "k", "v", "beta", "g", "S0")), rule=rule, scale=0.5)
    assert rel_rms(o, o64) < 1e-12 and rel_rms(S, S64) < 1e-12


@needs_native
def test_a_one_token_slice_of_an_expanded_input():
    # The report's case: time stride 0 with one token; MKL printed "Parameter 8 was incorrect on
    # entry to SGEMM" and returned garbage.
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 1, 3, 4, generator=gen).expand(2, 6, 3, 4)[:, 2:3] for _ in range(3))
    assert q.stride(1) == 0
    o, _ = linear_attention(q, k, v, scale=1.0)
    o64, _ = oracle(q, k, v)
    assert rel_rms(o, o64) < 2e-6


@needs_native
@pytest.mark.parametrize("rule", ["additive", "delta"])
def test_cu_seqlens_with_a_one_token_sequence_over_an_expanded_input(rule):
    gen = torch.Generator().manual_seed(2)
    T, H = 7, 2
    q, k, v = (torch.randn(1, 1, H, 4, generator=gen).expand(1, T, H, 4) for _ in range(3))
    beta = torch.rand(1, 1, H, generator=gen).expand(1, T, H)
    cu = torch.tensor([0, 1, 5, 6, 7])  # sequences of 1, 4, 1 and 1 tokens
    x = {"q": q, "k": k, "v": v, "beta": beta if rule == "delta" else None, "g": None}
    x["S0"] = torch.randn(4, H, 4, 4, generator=gen)
    o, S = _run(x, rule, "chunk", 2, cu)
    bounds = cu.tolist()
    for n, (s, e) in enumerate(itertools.pairwise(bounds)):
        part = [None if x[m] is None else x[m][:, s:e] for m in ("q", "k", "v", "beta", "g")]
        o64, S64 = oracle(*part, x["S0"][n : n + 1], rule=rule, scale=0.5)
        assert rel_rms(o[:, s:e], o64) < 2e-6 and rel_rms(S[n], S64[0]) < 2e-6


def _random_layout(x: torch.Tensor, draw) -> torch.Tensor:
    """x's values (one slice of them, expanded, for a drawn dimension) in a drawn layout: any order
    of the dimensions in memory, gaps between elements, a storage offset, and odd strides (0, 1,
    7, 1000) for dimensions of size 1."""
    expand = draw(st.sampled_from([None, *range(x.dim())]))
    base = x if expand is None else x.narrow(expand, 0, 1)
    order = draw(st.permutations(range(x.dim())))  # outermost first
    strides, step = [0] * x.dim(), 1
    for d in reversed(order):
        if base.shape[d] == 1:
            strides[d] = draw(st.sampled_from([0, 1, 7, 1000]))
        else:
            strides[d] = step * draw(st.integers(1, 3))
            step = strides[d] * base.shape[d]
    offset = draw(st.integers(0, 7))
    span = 1 + sum((n - 1) * t for n, t in zip(base.shape, strides, strict=True))
    out = torch.empty(span + offset).as_strided(base.shape, strides, offset).copy_(base)
    return out if expand is None else out.expand_as(x)


LAYOUT_PROBLEMS = dict(
    shape=st.tuples(st.integers(1, 2), st.integers(1, 12), st.integers(1, 3)),
    mechanism=st.sampled_from(MECHANISMS),
    chunk_size=st.integers(1, 14),
    data=st.data(),
)


def _random_layout_case(shape, mechanism, chunk_size, data) -> None:
    """Forward against the float64 recurrence; forward and gradients (d_o in a layout of its own)
    against the same call on contiguous copies."""
    (B, T, H), (rule, gate) = shape, mechanism
    x = _inputs(T, rule, gate, lambda t: _random_layout(t, data.draw), B=B, H=H)
    d_o = _random_layout(torch.randn(*x["v"].shape), data.draw)
    o, S, grads = _gradients(x, rule, "chunk", chunk_size, d_o)
    o64, S64 = oracle(*(x[n] for n in ("q", "k", "v", "beta", "g", "S0")), rule=rule, scale=0.5)
    # float32's tolerance of the property suite (test_properties): keys are not normalised here
    assert rel_rms(o, o64) < 1e-5 and rel_rms(S, S64) < 1e-5
    o_c, S_c, grads_c = _gradients(x, rule, "chunk", chunk_size, d_o, torch.float32)
    assert rel_rms(o, o_c) < 1e-6 and rel_rms(S, S_c) < 1e-6
    for n, grad in grads.items():
        assert rel_rms(grad, grads_c[n]) < 1e-6, n


@needs_native
@settings(max_examples=40, deadline=None)
@given(**LAYOUT_PROBLEMS)
def test_random_layouts_match_the_oracle(shape, mechanism, chunk_size, data):
    _random_layout_case(shape, mechanism, chunk_size, data)


@needs_native
@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(**LAYOUT_PROBLEMS)
def test_many_random_layouts_match_the_oracle(shape, mechanism, chunk_size, data):
    _random_layout_case(shape, mechanism, chunk_size, data)


KDA = ("delta", "channel")  # the direct calls' mechanism: the ops' rule and gate arguments


def _internal(x: dict) -> list:
    """The public [B, T, H, ...] tensors as the kernel takes them: [B, H, T, ...] views."""
    out = [x[n].transpose(1, 2) for n in ("q", "k", "v")]
    out.append(None if x["beta"] is None else x["beta"].transpose(1, 2))
    g = x["g"]
    if g is not None:
        g = g.transpose(1, 2)
        out.append(g.unsqueeze(-1) if g.dim() == 3 else g)
    else:
        out.append(None)
    return out


@needs_native
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("B", "T", "H"), [(1, 1, 1), (2, 1, 3), (2, 9, 3)])
def test_a_direct_call_reads_every_layout(layout, B, T, H):
    # Through torch.ops, with no Python wrapper in between: the kernel itself copies what its BLAS
    # cannot read in place. Against the same call on contiguous copies, forward and backward.
    x = _inputs(T, "delta", "channel", LAYOUTS[layout], seed=3, B=B, H=H)
    y = {n: None if t is None else t.contiguous() for n, t in x.items()}
    op = torch.ops.linattn_native
    out = op.chunk_forward(*_internal(x), x["S0"], 0.5, 4, True, *KDA)
    ref = op.chunk_forward(*_internal(y), y["S0"], 0.5, 4, True, *KDA)
    for a, b in zip(out, ref, strict=True):
        assert rel_rms(a, b) < 1e-6
    d_o = LAYOUTS[layout](torch.randn_like(y["v"])).transpose(1, 2)
    dS = LAYOUTS[layout](torch.randn_like(y["S0"]))
    grads = op.chunk_backward(*_internal(x), out[2], d_o, dS, 0.5, 4, *KDA)
    ref = op.chunk_backward(*_internal(y), ref[2], d_o.contiguous(), dS.contiguous(), 0.5, 4, *KDA)
    for a, b in zip(grads, ref, strict=True):
        assert rel_rms(a, b) < 1e-6


def _good_call() -> dict:
    """Arguments of a valid direct call (the delta rule with one gate per channel)."""
    x = _inputs(9, "delta", "channel", LAYOUTS["contiguous"], seed=4)
    q, k, v, beta, g = _internal(x)
    return {"q": q, "k": k, "v": v, "beta": beta, "g": g, "S0": x["S0"]}


def _forward(a: dict, C: int = 4):
    return torch.ops.linattn_native.chunk_forward(
        a["q"], a["k"], a["v"], a["beta"], a["g"], a["S0"], 0.5, C, True, *KDA
    )


# (argument, bad value, words of the error): each would have been read out of bounds.
BAD_FORWARD = [
    ("q", lambda a: a["q"][0], "q must be of shape"),
    ("k", lambda a: a["k"][:, :, :5], "k must be of shape"),
    ("v", lambda a: a["v"][:1], "v must be of shape"),
    ("beta", lambda a: a["beta"][:, :, :3], "beta must be of shape"),
    ("beta", lambda a: a["beta"].double(), "beta must be float32, bfloat16 or float16"),
    ("g", lambda a: a["g"][..., :2], "g must be of shape"),
    ("g", lambda a: a["g"][:, :, :1], "g must be of shape"),
    ("S0", lambda a: a["S0"][:, :, :2], "S0 must be of shape"),
    ("q", lambda a: a["q"].to(torch.int32), "q must be float32, bfloat16 or float16"),
    ("S0", lambda a: a["S0"].to(torch.bfloat16), "S0 must be float32"),
]


@needs_native
@pytest.mark.parametrize(("name", "bad", "words"), BAD_FORWARD)
def test_a_direct_forward_call_checks_its_arguments(name, bad, words):
    a = _good_call()
    a[name] = bad(a)
    with pytest.raises(RuntimeError, match=f"chunk_forward: {words}"):
        _forward(a)


@needs_native
def test_a_direct_call_off_the_cpu_is_refused():
    # A CPU kernel alone is registered (the fake kernel is the traced op's, linattn::chunk_forward):
    # a meta tensor among CPU ones is refused by the dispatcher before any work.
    a = _good_call()
    a["k"] = a["k"].to("meta")
    with pytest.raises(
        NotImplementedError, match="linattn_native::chunk_forward: .* no fake impl or Meta kernel"
    ):
        _forward(a)


@needs_native
@pytest.mark.parametrize("C", [0, -3])
def test_a_direct_call_checks_the_chunk_size(C):
    with pytest.raises(RuntimeError, match="C \\(the chunk size\\) must be >= 1"):
        _forward(_good_call(), C)


@needs_native
@pytest.mark.parametrize(
    ("name", "words"),
    [("states", "states must be of shape"), ("d_o", "d_o must be of shape"),
     ("dS_final", "dS_final must be of shape")],
)  # fmt: skip
def test_a_direct_backward_call_checks_its_arguments(name, words):
    a = _good_call()
    _, _, states = _forward(a)
    grads = {"states": states, "d_o": torch.randn_like(a["v"]), "dS_final": a["S0"].clone()}
    grads[name] = grads[name][:1, :1]
    with pytest.raises(RuntimeError, match=f"chunk_backward: {words}"):
        torch.ops.linattn_native.chunk_backward(
            a["q"], a["k"], a["v"], a["beta"], a["g"], grads["states"], grads["d_o"],
            grads["dS_final"], 0.5, 4, *KDA,
        )  # fmt: skip


@needs_native
@pytest.mark.parametrize(
    ("name", "bad", "words"),
    [
        ("state", lambda s: s.transpose(2, 3), "state must be a contiguous"),
        ("state", lambda s: s[0], "state must be a contiguous"),
        ("q", lambda s: s[:, :, 0, :3], "q must be of shape"),
        ("k", lambda s: s[:1, :, 0], "k must be of shape"),
        ("v", lambda s: s[:, :, :, 0, None], "v must be of shape"),
        ("beta", lambda s: s[:, :1, 0, 0], "beta must be of shape"),
        ("g", lambda s: s[:, :, :2, 0], "g must be of shape"),
    ],
)
def test_a_direct_step_checks_its_arguments(name, bad, words):
    gen = torch.Generator().manual_seed(5)
    state = torch.randn(2, 3, 4, 5, generator=gen)
    args = {
        "state": state.clone(),
        "q": state[:, :, :, 0].clone(),
        "k": state[:, :, :, 1].clone(),
        "v": state[:, :, 0].clone(),
        "beta": torch.rand(2, 3, generator=gen),
        "g": -torch.rand(2, 3, 4, generator=gen),
    }
    args[name] = bad(state.clone()) if name == "state" else bad(state).contiguous()
    before = args["state"].clone()
    with pytest.raises(RuntimeError, match=f"recurrent_step: {words}"):
        torch.ops.linattn_native.recurrent_step(*args.values(), 0.5, "delta", "channel")
    assert torch.equal(args["state"], before)


@needs_native
def test_a_direct_step_reads_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(6)
    state = torch.randn(2, 3, 4, 5, generator=gen)
    q, k = (torch.randn(2, 4, 3, generator=gen).transpose(1, 2) for _ in range(2))
    v = torch.randn(2, 3, 1, generator=gen).expand(2, 3, 5)
    beta = torch.rand(3, 2, generator=gen).t()
    g = -torch.rand(2, 3, 1, generator=gen).expand(2, 3, 4)
    s1, s2 = state.clone(), state.clone()
    o1 = torch.ops.linattn_native.recurrent_step(s1, q, k, v, beta, g, 0.5, *KDA)
    args = (x.contiguous() for x in (q, k, v, beta, g))
    o2 = torch.ops.linattn_native.recurrent_step(s2, *args, 0.5, *KDA)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


@needs_native
@pytest.mark.parametrize("sizes", [[-1, 4], [2**40, 2**40]])
def test_empty_huge_checks_its_sizes(sizes):
    with pytest.raises(RuntimeError, match="empty_huge: sizes"):
        torch.ops.linattn_native.empty_huge(sizes, torch.float32)


# Defect 6: chunks of 46,341 tokens or more overflowed an int in the kernel's scratch sizes (a
# std::vector length error at 46,341, a segmentation fault at 65,536). A chunk is C x C blocks
# (16 GiB at 65,536 in float32): longer chunks than MAX_CHUNK are refused before any work.


@pytest.mark.parametrize("C", [_engine.MAX_CHUNK + 1, 46_341, 65_536])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_chunk_longer_than_the_limit_is_refused_before_any_work(C, dtype):
    q = torch.zeros(1, C, 1, 1, dtype=dtype)
    with pytest.raises(ValueError, match=f"chunk_size: .* = {C} tokens .* at most 8192"):
        linear_attention(q, q, q, chunk_size=C)
    with pytest.raises(ValueError, match="chunk_size"):
        delta_rule(q, q, q, q[..., 0], chunk_size=2 * C)


def test_the_longest_packed_sequence_decides():
    q = torch.zeros(1, _engine.MAX_CHUNK + 11, 1, 1)
    cu = torch.tensor([0, 10, _engine.MAX_CHUNK + 11])  # 10 tokens, then MAX_CHUNK + 1
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention(q, q, q, chunk_size=65_536, cu_seqlens=cu)


@needs_native
@pytest.mark.parametrize("C", [_engine.MAX_CHUNK + 1, 46_341, 65_536])
def test_a_direct_call_refuses_a_chunk_longer_than_the_limit(C):
    q = torch.zeros(1, 1, C, 1)
    with pytest.raises(RuntimeError, match=f"= {C} exceeds 8192"):
        torch.ops.linattn_native.chunk_forward(
            q, q, q, None, None, q[0, :, :1], 1.0, C, False, "additive", "none"
        )


@needs_native
@pytest.mark.parametrize("chunk_size", [46_341, 65_536])
def test_a_chunk_size_beyond_t_is_t(chunk_size):
    # min(chunk_size, T): the same one chunk, bit for bit, in the op and in a direct call.
    x = _inputs(50, "delta", "scalar", LAYOUTS["contiguous"], seed=7)
    o1, S1 = _run(x, "delta", "chunk", chunk_size)
    o2, S2 = _run(x, "delta", "chunk", 50)
    assert torch.equal(o1, o2) and torch.equal(S1, S2)
    a = _good_call()
    for big, small in zip(_forward(a, chunk_size), _forward(a, 9), strict=True):
        assert torch.equal(big, small)


@needs_native
@pytest.mark.slow
def test_a_chunk_at_the_limit():
    # C = T = MAX_CHUNK, K = V = 1: a few 256 MiB blocks per thread, against the float64
    # recurrence. One chunk sums 8,192 terms in each product: float32 rounding of about sqrt(T)
    # ulps (measured 4e-7 for o, 1.9e-6 for S; the PyTorch loop 4e-7 and 4e-7).
    T = _engine.MAX_CHUNK
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, T, 1, 1, generator=gen) for _ in range(3))
    k = torch.sign(k)
    o, S = linear_attention(q, k, v, scale=1.0, chunk_size=T, output_final_state=True)
    o64, S64 = oracle(q, k, v, None, None, None, scale=1.0)
    assert rel_rms(o, o64) < 1e-5 and rel_rms(S, S64) < 1e-5


# Random direct calls, most of them with some argument of a wrong shape (or transposed, or of a
# chunk size below 1): each must raise our RuntimeError or run; run in a child process, so that a
# crash (an out-of-bounds access, a division by zero) fails the test instead of ending pytest.
FUZZ = """
import random, sys, torch
op = torch.ops.linattn_native
from linattn.ops import _native
assert _native.available()
rng = random.Random(int(sys.argv[1]))

def tensor(shape):
    if rng.random() < 0.1:
        shape = [rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.choice([2, 3, 4, 5]))]
    t = torch.randn(*shape)
    return t.transpose(-1, -2) if rng.random() < 0.2 and t.dim() >= 2 else t

ran = refused = 0
for _ in range(int(sys.argv[2])):
    B, H, T, K, V = (rng.choice([1, 2, 3]) for _ in range(5))
    q, k, v = tensor([B, H, T, K]), tensor([B, H, T, K]), tensor([B, H, T, V])
    beta = tensor([B, H, T]).abs().clamp(max=2) if rng.random() < 0.5 else None
    g = -tensor([B, H, T, rng.choice([1, K, 2])]).abs() if rng.random() < 0.5 else None
    C = rng.choice([-1, 0, 1, 2, 3, 100])
    rule = "additive" if beta is None else "delta"
    gate = "none" if g is None else rng.choice(["head", "channel"])
    if rng.random() < 0.1:  # a mechanism the inputs may not have
        rule, gate = rng.choice(["additive", "delta"]), rng.choice(["none", "head", "channel"])
    try:
        o, S, states = op.chunk_forward(
            q, k, v, beta, g, tensor([B, H, K, V]), 0.5, C, True, rule, gate
        )
        ran += 1
        if rng.random() < 0.2:
            states = tensor([*states.shape[:-1], states.shape[-1] + 1])
        op.chunk_backward(q, k, v, beta, g, states, tensor([B, H, T, V]), tensor([B, H, K, V]),
                          0.5, C, rule, gate)
    except RuntimeError as error:
        assert "linattn_native." in str(error), error
        refused += 1
    step = [tensor([B, H, K]), tensor([B, H, K]), tensor([B, H, V])]
    beta = tensor([B, H]).abs().clamp(max=2) if rng.random() < 0.5 else None
    g = -tensor([B, H, rng.choice([1, K, 2])]).abs() if rng.random() < 0.5 else None
    rule = "additive" if beta is None else "delta"
    gate = "none" if g is None else rng.choice(["head", "channel"])
    try:
        op.recurrent_step(tensor([B, H, K, V]).contiguous(), *step, beta, g, 0.5, rule, gate)
    except RuntimeError as error:
        assert "linattn_native.recurrent_step" in str(error), error
print(ran, refused)
"""


def _fuzz(seed: int, calls: int) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    import linattn

    env = dict(os.environ, PYTHONPATH=str(Path(linattn.__file__).parents[1]), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", FUZZ, str(seed), str(calls)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    ran, refused = map(int, done.stdout.split())
    assert ran > 0 and refused > 0


@needs_native
def test_random_direct_calls_raise_or_run():
    _fuzz(seed=0, calls=300)


@needs_native
@pytest.mark.slow
def test_many_random_direct_calls_raise_or_run():
    _fuzz(seed=1, calls=20_000)
