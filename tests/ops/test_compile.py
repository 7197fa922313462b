"""torch.compile with dynamic shapes and torch.export.

``dynamic=True`` traces T (and B) as symbols: one graph serves a second and a third sequence
length, forward and backward, where the form allows it. The chunk form is one registered op whose
chunk size is passed as given (``library.chunk``), so T stays symbolic; the parallel form with a
gate per channel and the recurrent form are loops whose structure depends on T (the halving levels,
one step per token): they compile, once per length. The compiled code is eager's ("aot_eager"): the
graph capture, the fake kernels and the registered backward are what is tested, fast enough here.
Inductor and the layers/models sweep are slow-marked.

Errors: under ``torch.compile`` (fullgraph off, the default) a refused argument raises the op's
own ValueError/TypeError naming it (dynamo falls back to eager for the frame and the check runs
there); under ``fullgraph=True`` PyTorch reports any exception raised while tracing as
``torch._dynamo.exc.Unsupported``, whose text carries ours.
"""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _native, delta_rule, linear_attention, recurrent_step, softmax_attention

from . import entry_cases

LENGTHS = (7, 9, 13)  # three lengths, none a multiple of the chunk size


def _counter():
    """A compile counter with the aot_eager backend. torch._dynamo.testing is imported here, not
    at collection: it imports triton, which must come after tests.fla_interpreter (the fla tests
    collected earlier in a session would then fail)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend("aot_eager")


def _inputs(T: int, gate: str | None, dtype: torch.dtype = torch.float32) -> list:
    B, H, K, V = 1, 2, 4, 3
    gen = torch.Generator().manual_seed(T)
    q, k = (torch.randn(B, T, H, K, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen, dtype=dtype)
    beta = torch.rand(B, T, H, generator=gen, dtype=dtype)
    g = None
    if gate == "head":
        g = -torch.rand(B, T, H, generator=gen, dtype=dtype)
    elif gate == "channel":
        g = -torch.rand(B, T, H, K, generator=gen, dtype=dtype)
    return [None if x is None else x.requires_grad_() for x in (q, k, v, beta, g)]


def _delta(mode: str):
    def fn(q, k, v, beta, g):
        return delta_rule(q, k, v, beta, g, mode=mode, chunk_size=4, output_final_state=True)

    return fn


def _linear(mode: str):
    def fn(q, k, v, beta, g):
        return linear_attention(q, k, v, g, mode=mode, chunk_size=4, output_final_state=True)

    return fn


def _softmax(q, k, v, beta, g):
    return softmax_attention(q, k, v), None


def _outputs_and_grads(fn, inputs: list) -> list:
    inputs = [None if x is None else x.detach().clone().requires_grad_() for x in inputs]
    o, S = fn(*inputs)
    (o.square().sum() + (0 if S is None else S.sum())).backward()
    return [o.detach(), *(x.grad for x in inputs if x is not None)]


def _compare(fn, gate: str | None, frames: int | None, dtype=torch.float32, tol=1e-5) -> None:
    """fn compiled with dynamic=True gives eager's outputs and gradients at every length, in
    ``frames`` compiled frames (None: any number, a loop over T compiles once per length)."""
    torch._dynamo.reset()
    counter = _counter()
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    for T in LENGTHS:
        x = _inputs(T, gate, dtype)
        for a, b in zip(_outputs_and_grads(compiled, x), _outputs_and_grads(fn, x), strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    if frames is not None:
        assert counter.frame_count == frames


needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)
BACKENDS = [pytest.param("1", id="fused", marks=needs_native), pytest.param("0", id="loop")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("op", "gate"), [(_delta, "channel"), (_linear, "head"), (_delta, None), (_linear, None)]
)
def test_the_chunk_form_compiles_once_for_three_lengths(op, gate, backend, monkeypatch):
    # The blocker: max(lengths, default=0) in _engine.check_chunk stopped dynamo, and
    # min(chunk_size, T) in the op's arguments specialised T (one graph per length).
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    _compare(op("chunk"), gate, frames=1)


def test_softmax_compiles_once_for_three_lengths():
    _compare(_softmax, None, frames=1)


@pytest.mark.slow  # a minute here: the recurrent form compiles once per length
@pytest.mark.parametrize("op", [_delta, _linear])
@pytest.mark.parametrize("mode", ["parallel", "recurrent"])
@pytest.mark.parametrize("gate", [None, "head", "channel"])
def test_every_form_compiles_with_dynamic_shapes(op, mode, gate, monkeypatch):
    # The parallel form's gates are unknown while tracing: no data-dependent branch (the subnormal
    # floor, the direct block size) may end the graph. Compiled, a gate per channel takes the
    # halving down to single tokens, eager direct blocks: float64, where both are exact to 1e-12
    # (float32 gradients that cancel to 1e-5 differ in their rounding).
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    frames = 1 if mode == "parallel" and gate != "channel" else None
    _compare(op(mode), gate, frames, torch.float64, 1e-12)


def test_the_generation_step_compiles_once_for_three_batch_sizes():
    def step(S, q, k, v, beta, g):
        return recurrent_step(S, q, k, v, beta, g)  # S advanced in place

    torch._dynamo.reset()
    counter = _counter()
    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend=counter)
    for B in (5, 6, 7):  # none equal to H = 2, K = 4 or V = 3 (duck sizing would tie them)
        gen = torch.Generator().manual_seed(B)
        q, k = (torch.randn(B, 2, 4, generator=gen) for _ in range(2))
        v, S = torch.randn(B, 2, 3, generator=gen), torch.randn(B, 2, 4, 3, generator=gen)
        beta, g = torch.rand(B, 2, generator=gen), -torch.rand(B, 2, generator=gen)
        S_eager = S.clone()
        torch.testing.assert_close(compiled(S, q, k, v, beta, g), step(S_eager, q, k, v, beta, g))
        torch.testing.assert_close(S, S_eager)
    assert counter.frame_count == 1


def test_a_refused_argument_is_named_under_compile():
    # fullgraph off (the default): the op's own error, as in eager.
    fn = torch.compile(_delta("chunk"), dynamic=True, backend="eager")
    q, k, v, beta, _ = _inputs(8, None)
    with pytest.raises(ValueError, match=r"^beta must have shape \[B, T, H\]"):
        fn(q, k, v, beta[..., :1], None)
    with pytest.raises(TypeError, match="^q, k, v must share one dtype"):
        fn(q, k, v.double(), beta, None)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_refused_argument_is_named_under_fullgraph(dynamic):
    # fullgraph=True: PyTorch's Unsupported, whose text carries our message (with dynamic=True
    # the sizes in it are the trace's symbols).
    torch._dynamo.reset()
    fn = torch.compile(_delta("chunk"), fullgraph=True, dynamic=dynamic, backend="eager")
    q, k, v, beta, _ = _inputs(8, None)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="beta must have shape"):
        fn(q, k, v, beta[..., :1], None)


def test_a_refused_value_is_named_by_the_compiled_graph():
    # Values are unknown while tracing: the range checks are assertions in the graph.
    torch._dynamo.reset()
    fn = torch.compile(_delta("chunk"), fullgraph=True, dynamic=True, backend="aot_eager")
    q, k, v, beta = (x.detach() for x in _inputs(8, None)[:4])
    with pytest.raises(RuntimeError, match=r"beta must lie in \[0, 2\]"):
        fn(q, k, v, beta * 3, None)


@pytest.mark.parametrize("layer", ["GatedDeltaNet", "KimiDeltaAttention", "LinearAttention"])
def test_torch_export_of_a_layer_with_a_dynamic_length(layer, monkeypatch):
    # One exported program for any T in [2, 4096]: no guard on the number of chunks.
    from linattn import layers

    monkeypatch.setenv("LINATTN_NATIVE", "0")
    torch.manual_seed(0)
    module = getattr(layers, layer)(16, 2).eval()
    T = torch.export.Dim("T", min=2, max=4096)
    with torch.no_grad():
        program = torch.export.export(module, (torch.randn(2, 9, 16),), dynamic_shapes=({1: T},))
        for length in (5, 70):  # one chunk and two (chunk_size 64)
            x = torch.randn(2, length, 16)
            torch.testing.assert_close(program.module()(x)[0], module(x)[0])


@pytest.mark.parametrize(
    "op",
    [
        op if op in ("delta_rule", "rwkv7") else pytest.param(op, marks=pytest.mark.slow)
        for op in entry_cases.OPS
    ],
)
def test_a_variable_scale_compiles_under_fullgraph(op):
    # dynamic=True traces a float argument as a symbol: the finiteness of scale went through
    # math.isfinite(float(s)), which dynamo cannot trace under fullgraph. It is traced into the
    # graph now; the chunk op's schema still takes scale as a constant (a guard per value).
    torch._dynamo.reset()
    run = entry_cases.call(op)

    def fn(x, scale):
        return run(x, scale=scale, mode="chunk", chunk_size=4, output_final_state=True)

    compiled = torch.compile(fn, dynamic=True, fullgraph=True, backend=_counter())
    x = entry_cases.inputs(op, 8, dtype=torch.float32)
    for scale in (0.5, 0.7):
        for a, b in zip(compiled(x, scale), fn(x, scale), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
