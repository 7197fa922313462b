"""The chunk form's torch.library ops (``linattn.ops.library``) and the extension's own ops.

``torch.library.opcheck`` runs each registered op against its schema, its fake kernel (the shapes
and strides of the real outputs), its registered autograd and torch.compile's AOT dispatch; every
mechanism, with and without an initial state, on the fused C++ kernels and on the PyTorch loop
(``LINATTN_NATIVE=0``). Bad arguments passed to the ops directly raise, naming the argument.
``torch.compile(fullgraph=True)`` of a function and of a small ``linattn.models`` model in chunk
mode traces without a graph break and matches eager, forward and backward.
"""

from __future__ import annotations

import pytest
import torch

from linattn.models import CausalLM, LMConfig
from linattn.ops import _native, delta_rule, library, tuning

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)

# (rule, gate): the nine rows of the mechanism table (docs/design.md).
MECHANISMS = [(r, g) for r in ("additive", "delta", "dplr") for g in (None, "scalar", "channel")]
BACKENDS = [pytest.param("1", id="fused", marks=needs_native), pytest.param("0", id="loop")]
# opcheck's checks: schema, fake kernel and autograd registration for every mechanism in every
# run; AOT dispatch with dynamic shapes (about 5 s a call here) for KDA in every run, for every
# mechanism under -m slow.
FAST = ("test_schema", "test_autograd_registration", "test_faketensor")
PLAIN = FAST[:2]  # the checks of a kernel without a fake kernel (the extension's chunk ops)
UTILS = [
    pytest.param(rule, gate, utils, id=f"{rule}-{gate}-{name}", marks=marks)
    for rule, gate in MECHANISMS
    for name, utils, marks in (
        ("fast", FAST, ()),
        (
            "aot",
            ("test_aot_dispatch_dynamic",),
            () if gate == "channel" and rule == "delta" else pytest.mark.slow,
        ),
    )
]


def _inputs(rule, gate, *, B=1, H=2, T=10, K=4, V=3, G=1, grad=True, seed=0) -> dict:
    """Internal-layout float32 inputs [B, H, T, ...] (views of [B, T, H, ...]) and a state; v,
    beta, g and the state with HV = G H heads (grouped value heads; G = 1 the plain case)."""
    gen = torch.Generator().manual_seed(seed)
    HV = G * H

    def rows(*tail, heads=HV):
        return torch.randn(B, T, heads, *tail, generator=gen).transpose(1, 2)

    x = {"q": rows(K, heads=H), "k": torch.nn.functional.normalize(rows(K, heads=H), dim=-1)}
    x["v"] = rows(V)
    x["beta"] = torch.rand(B, T, HV, generator=gen).transpose(1, 2) if rule == "delta" else None
    if rule == "dplr":  # the rule's inputs [a | b] in the beta slot, [B, HV, T, 2K]
        x["beta"] = 0.5 * rows(2 * K)
    width = {"scalar": 1, "channel": K}.get(gate)
    x["g"] = None if width is None else -torch.rand(B, T, HV, width, generator=gen).transpose(1, 2)
    x["S0"] = torch.randn(B, HV, K, V, generator=gen)
    for value in x.values():
        if value is not None:
            value.requires_grad_(grad)
    return x


def _mechanism(x: dict) -> tuple[str, str]:
    """The ops' rule and gate for the inputs x (a gate of width 1: one per head)."""
    beta = x["beta"]
    rule = "additive" if beta is None else "delta" if beta.dim() == 3 else "dplr"
    g = x["g"]
    return rule, "none" if g is None else "head" if g.shape[-1] == 1 else "channel"


def _forward_args(x: dict, C: int = 4, keep: bool = True) -> tuple:
    return (x["q"], x["k"], x["v"], x["beta"], x["g"], x["S0"], 0.5, C, keep, *_mechanism(x))


def _backward_args(x: dict, C: int = 4) -> tuple:
    detached = {n: None if t is None else t.detach() for n, t in x.items()}
    _, _, states = library.chunk_forward(*_forward_args(detached, C))
    B, HV, T, V = x["v"].shape
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(B, T, HV, V, generator=gen).transpose(1, 2)
    dS = torch.randn(x["S0"].shape, generator=gen)
    d = detached
    return (d["q"], d["k"], d["v"], d["beta"], d["g"], states, d_o, dS, 0.5, C, *_mechanism(x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rule", "gate", "utils"), UTILS)
def test_opcheck_chunk_forward(rule, gate, utils, backend, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = _inputs(rule, gate)
    torch.library.opcheck(library.chunk_forward, _forward_args(x), test_utils=utils)
    without_state = {**x, "S0": torch.zeros_like(x["S0"])}
    args = _forward_args(without_state, C=3, keep=False)  # keep=False: its backward recomputes
    torch.library.opcheck(library.chunk_forward, args, test_utils=utils)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rule", "gate", "utils"), UTILS)
def test_opcheck_chunk_backward(rule, gate, utils, backend, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    args = _backward_args(_inputs(rule, gate))
    torch.library.opcheck(library.chunk_backward, args, test_utils=utils)


@needs_native
@pytest.mark.parametrize(("rule", "gate", "utils"), UTILS)
def test_opcheck_the_extension_ops(rule, gate, utils):
    # The extension's chunk kernels are plain kernels of the traced ops above, with no fake
    # kernel of their own: their schema is checked. The step (every rule, dplr's [a | b] in
    # beta's slot) has no Python op around it: its Meta kernel is its fake kernel, checked too.
    ops = torch.ops.linattn_native
    x = _inputs(rule, gate, grad=False)
    plain = tuple(u for u in utils if u in PLAIN)
    if plain:
        torch.library.opcheck(ops.chunk_forward, _forward_args(x), test_utils=plain)
        torch.library.opcheck(ops.chunk_backward, _backward_args(x), test_utils=plain)
    step = [None if t is None else t[:, :, 0].contiguous() for t in (x["q"], x["k"], x["v"])]
    beta = None if x["beta"] is None else x["beta"][:, :, 0].contiguous()
    g = None if x["g"] is None else x["g"][:, :, 0].contiguous()
    args = (x["S0"].clone(), *step, beta, g, 0.5, *_mechanism(x))
    torch.library.opcheck(ops.recurrent_step, args, test_utils=utils)
    # From a source (the state read there, the new one written into the first argument).
    out_of_place = (torch.empty_like(x["S0"]), *args[1:], x["S0"].clone())
    torch.library.opcheck(ops.recurrent_step, out_of_place, test_utils=utils)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rule", "gate"), MECHANISMS)
def test_opcheck_with_grouped_value_heads(rule, gate, backend, monkeypatch):
    """G = 2: v, beta, g and the states with twice q's heads, q and k read in place."""
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = _inputs(rule, gate, G=2)
    torch.library.opcheck(library.chunk_forward, _forward_args(x), test_utils=FAST)
    torch.library.opcheck(library.chunk_backward, _backward_args(x), test_utils=FAST)
    if backend == "1":
        ops = torch.ops.linattn_native
        y = _inputs(rule, gate, G=2, grad=False)
        torch.library.opcheck(ops.chunk_forward, _forward_args(y), test_utils=PLAIN)
        torch.library.opcheck(ops.chunk_backward, _backward_args(y), test_utils=PLAIN)
        step = [t[:, :, 0].contiguous() for t in (y["q"], y["k"], y["v"])]
        beta = None if y["beta"] is None else y["beta"][:, :, 0].contiguous()
        g = None if y["g"] is None else y["g"][:, :, 0].contiguous()
        args = (y["S0"].clone(), *step, beta, g, 0.5, *_mechanism(y))
        torch.library.opcheck(ops.recurrent_step, args, test_utils=FAST)


@needs_native
@pytest.mark.parametrize(("rule", "gate"), [("delta", "channel")])
def test_opcheck_aot_with_grouped_value_heads(rule, gate):
    x = _inputs(rule, gate, G=2)
    utils = ("test_aot_dispatch_dynamic",)
    torch.library.opcheck(library.chunk_forward, _forward_args(x), test_utils=utils)


def _bad(x: dict, name: str, value) -> dict:
    return {**{n: None if t is None else t.detach() for n, t in x.items()}, name: value}


# (argument, bad value from the good inputs, error type, words of the message)
BAD = [
    ("q", lambda x: x["q"][0], ValueError, "q must have shape \\[B, H, T, K\\]"),
    ("q", lambda x: x["q"].to(torch.int32), TypeError, "q must be a float32, float64, bfloat16"),
    ("k", lambda x: x["k"][:, :, :5], ValueError, "k must have shape"),
    ("k", lambda x: x["k"].double(), TypeError, "k must be torch.float32"),
    ("v", lambda x: x["v"][:, :1], ValueError, "v must have shape"),
    ("v", lambda x: torch.cat([x["v"]] * 3, 1)[:, :3], ValueError, "HV a multiple of .* H = 2"),
    ("beta", lambda x: torch.cat([x["beta"]] * 2, 1), ValueError, "beta must have shape"),
    ("beta", lambda x: x["beta"][:, :, :3], ValueError, "beta must have shape"),
    ("g", lambda x: x["g"][..., :2], ValueError, "g must have shape"),
    ("g", lambda x: x["g"][:, :, :1], ValueError, "g must have shape"),
    ("S0", lambda x: x["S0"][:, :, :2], ValueError, "S0 must have shape"),
    ("S0", lambda x: x["S0"].to(torch.bfloat16), TypeError, "S0 must be torch.float32 on"),
    ("beta", lambda x: x["beta"].double(), TypeError, "beta must be torch.float32 or"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "bad", "error", "words"), BAD)
def test_bad_arguments_to_the_forward_op_raise(name, bad, error, words, backend, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = _inputs("delta", "channel", grad=False)
    with pytest.raises(error, match=words):
        library.chunk_forward(*_forward_args(_bad(x, name, bad(x))))


# (rule, gate, beta given, g's width, words): a mechanism the inputs do not have, or none at all.
BAD_MECHANISMS = [
    ("delta", "channel", False, 4, "beta must be given for the delta rule"),
    ("additive", "channel", True, 4, "beta must be None for the additive rule"),
    ("delta", "none", True, 4, "g must be None"),
    ("delta", "head", True, None, "g must be given"),
    ("delta", "head", True, 4, "g must have shape \\[B, HV, T, 1\\]"),
    ("delta", "channel", True, 1, "g must have shape \\[B, HV, T, K\\]"),
    ("gated", "channel", True, 4, "rule must be one of"),
    ("delta", "scalar", True, 4, "gate must be one of"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rule", "gate", "beta", "width", "words"), BAD_MECHANISMS)
def test_the_mechanism_is_checked_against_the_inputs(
    rule, gate, beta, width, words, backend, monkeypatch
):
    # The mechanism is the schema's rule and gate, never read from the inputs: inputs that do
    # not match it are refused, by the op and by the extension's kernel called directly.
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = _inputs("delta", "channel", grad=False)
    x["beta"] = x["beta"] if beta else None
    x["g"] = None if width is None else x["g"][..., :width]
    args = (*_forward_args(x)[:9], rule, gate)
    with pytest.raises(ValueError, match=words):
        library.chunk_forward(*args)
    if backend == "1":
        native = words.replace("have shape", "be of shape").replace("one of", "")
        native = native.replace("\\[B, HV, T, 1\\]", "").replace("\\[B, HV, T, K\\]", "")
        with pytest.raises(RuntimeError, match=f"linattn_native.chunk_forward: {native}"):
            torch.ops.linattn_native.chunk_forward(*args)


@pytest.mark.parametrize("C", [0, -3, tuning.MAX_CHUNK + 1])
def test_a_chunk_size_out_of_range_is_refused(C):
    x = _inputs("additive", None, grad=False)
    with pytest.raises(ValueError, match="C \\(the chunk size\\) must be in"):
        library.chunk_forward(*_forward_args(x, C=C))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["states", "d_o", "dS"])
def test_bad_arguments_to_the_backward_op_raise(name, backend, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    args = list(_backward_args(_inputs("delta", "scalar")))
    at = {"states": 5, "d_o": 6, "dS": 7}[name]
    args[at] = args[at][:1, ..., :1]
    with pytest.raises(ValueError, match=f"{name} must have shape"):
        library.chunk_backward(*args)


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
@pytest.mark.parametrize("op", ["linattn", pytest.param("linattn_native", marks=needs_native)])
def test_a_non_finite_scale_is_refused(op, scale):
    # Before: the extension's ops took it, and every output was NaN without a word.
    args = list(_forward_args(_inputs("delta", "channel", grad=False)))
    args[6] = scale
    error = RuntimeError if op == "linattn_native" else ValueError
    with pytest.raises(error, match="scale must be finite"):
        getattr(torch.ops, op).chunk_forward(*args)
    backward = list(_backward_args(_inputs("delta", "channel", grad=False)))
    backward[8] = scale
    with pytest.raises(error, match="scale must be finite"):
        getattr(torch.ops, op).chunk_backward(*backward)


@needs_native
def test_the_tuning_constants_reach_the_kernels():
    # kMaxChunk is tuning.MAX_CHUNK, compiled in (-D): the kernel's own refusal names it.
    x = _inputs("additive", None, T=tuning.MAX_CHUNK + 1, H=1, K=1, V=1, grad=False)
    with pytest.raises(RuntimeError, match=f"exceeds {tuning.MAX_CHUNK} "):
        torch.ops.linattn_native.chunk_forward(*_forward_args(x, C=tuning.MAX_CHUNK + 1))


def _grads(fn, x: dict) -> tuple:
    o, S = fn(*(x[n] for n in ("q", "k", "v", "beta", "g", "S0")))
    (o.square().sum() + S.sum()).backward()
    grads = tuple(t.grad.clone() for t in x.values() if t is not None)
    return (o.detach(), S.detach(), *grads)


def _delta_rule_chunk(q, k, v, beta, g, S0):
    return delta_rule(
        q, k, v, beta, g=g, initial_state=S0, mode="chunk", chunk_size=4, output_final_state=True
    )


def _public(x: dict) -> dict:
    """The inputs in the public layout [B, T, H, ...], fresh leaves."""
    out = {n: None if t is None else t.detach().transpose(1, 2) for n, t in x.items()}
    out["S0"] = x["S0"].detach()
    return {n: None if t is None else t.clone().requires_grad_() for n, t in out.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_delta_rule_has_no_graph_break_and_matches_eager(backend, monkeypatch):
    # One graph each way: the forward holds the op chunk_forward (and the value checks as
    # assertions), the backward the op chunk_backward; outputs and gradients as eager's.
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    monkeypatch.setenv("LINATTN_NATIVE", backend)
    torch._dynamo.reset()
    x = _inputs("delta", "channel", T=11)
    eager = _grads(_delta_rule_chunk, _public(x))
    recorder = AotEagerAndRecordGraphs()
    compiled_fn = torch.compile(_delta_rule_chunk, fullgraph=True, backend=recorder)
    compiled = _grads(compiled_fn, _public(x))
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)

    def targets(graphs) -> set[str]:
        return {str(node.target) for gm in graphs for node in gm.graph.nodes}

    forward, backward = targets(recorder.fw_graphs), targets(recorder.bw_graphs)
    assert "linattn.chunk_forward.default" in forward and "aten._assert_async.msg" in forward
    assert "linattn.chunk_backward.default" in backward
    assert len(recorder.fw_graphs) == len(recorder.bw_graphs) == 1


def _model_loss_and_grads(model: CausalLM, fn, ids: torch.Tensor) -> tuple:
    model.zero_grad()
    loss = fn(ids)
    loss.backward()
    return (loss.detach(), *(p.grad.clone() for p in model.parameters()))


def _compare_model(mixers: tuple[str, ...], backend: str) -> None:
    torch.manual_seed(0)
    config = LMConfig(vocab_size=32, d_model=16, n_heads=2, mixers=mixers, chunk_size=4)
    model = CausalLM(config)
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(0))

    def loss(ids: torch.Tensor) -> torch.Tensor:
        return model(ids).logsumexp(-1).mean()

    torch._dynamo.reset()
    eager = _model_loss_and_grads(model, loss, ids)
    compiled = _model_loss_and_grads(
        model, torch.compile(loss, fullgraph=True, backend=backend), ids
    )
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("native", BACKENDS)
def test_a_compiled_model_matches_eager(native, monkeypatch):
    # The graph capture, the fake kernels and the registered backward (AOT autograd), with no
    # graph break; the compiled code itself is eager's ("aot_eager"): fast enough for every run.
    monkeypatch.setenv("LINATTN_NATIVE", native)
    _compare_model(("kda",), "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("native", BACKENDS)
def test_a_model_compiled_by_inductor_matches_eager(native, monkeypatch):
    monkeypatch.setenv("LINATTN_NATIVE", native)
    _compare_model(("gated_deltanet", "gla", "linear"), "inductor")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_of_some_inputs_only(backend, monkeypatch):
    # The PyTorch loop computes only the gradients asked for (eager); the others stay None, and
    # those asked for are the same as when every gradient is computed.
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = _inputs("delta", "channel", T=9)
    every = _grads(_delta_rule_chunk, _public(x))
    leaves = _public(x)
    for name in ("k", "beta", "g", "S0"):
        leaves[name].requires_grad_(False)
    o, S = _delta_rule_chunk(*(leaves[n] for n in ("q", "k", "v", "beta", "g", "S0")))
    (o.square().sum() + S.sum()).backward()
    assert all(leaves[n].grad is None for n in ("k", "beta", "g", "S0"))
    assert torch.equal(leaves["q"].grad, every[2]) and torch.equal(leaves["v"].grad, every[4])


def _zero_fills(fn) -> list[tuple[str, list]]:
    """The zero-filling aten ops ``fn()`` runs, with their input shapes (torch.profiler)."""
    with torch.profiler.profile(record_shapes=True) as prof:
        fn()
    fills = ("aten::zeros", "aten::zeros_like", "aten::new_zeros", "aten::zero_", "aten::fill_")
    return [(e.name, e.input_shapes) for e in prof.events() if e.name in fills]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("route", ["eager", "op"])
def test_the_backward_fills_no_tensor_of_the_states_size(route, backend, monkeypatch):
    # The chunk states are a non-differentiable output; autograd used to pass a zero tensor of
    # their size [ceil(T / C), B H, K, V] as their gradient (32 MiB at T = 16,384), unread.
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = _inputs("delta", "channel", B=1, H=2, T=10, K=4, V=3)
    if route == "eager":
        mech = library.mechanism(*_mechanism(x))
        o, S = library.chunk(*(x[n] for n in ("q", "k", "v", "beta", "g", "S0")), 4, 0.5, mech)
    else:
        o, S, _ = library.chunk_forward(*_forward_args(x, C=4))
    loss = o.square().sum() + S.sum()
    states_shape = [3, 2, 4, 3]
    fills = _zero_fills(loss.backward)
    assert x["q"].grad is not None
    assert not [f for f in fills if states_shape in f[1]], fills


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("unused", ["o", "S"])
@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("G", [1, 2], ids=["heads", "grouped"])
def test_an_unused_output_has_a_zero_gradient(unused, create_graph, backend, G, monkeypatch):
    # d_o or dS is None when that output is unused (the gradients are not materialised): the
    # gradients are those of an explicit zero seed for it.
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    names = ("q", "k", "v", "beta", "g", "S0")

    def grads(zero_seed: bool) -> tuple:
        x = _inputs("delta", "scalar", T=9, G=G)
        o, S = library.chunk(*(x[n] for n in names), 4, 0.5, library.mechanism("delta", "head"))
        loss = S.square().sum() if unused == "o" else o.square().sum()
        if zero_seed:
            loss = loss + (o if unused == "o" else S).sum() * 0
        return torch.autograd.grad(loss, [x[n] for n in names], create_graph=create_graph)

    for alone, seeded in zip(grads(False), grads(True), strict=True):
        torch.testing.assert_close(alone, seeded, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rule", "gate"), MECHANISMS)
def test_a_call_without_a_graph_skips_the_autograd_function(rule, gate, backend, monkeypatch):
    # No input requires grad, or grad mode is off: ``chunk`` calls the kernel directly (no graph
    # to record), with the bits of the recorded call; with a graph it goes through _EagerChunk.
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    x = _inputs(rule, gate, T=9)
    mech = library.mechanism(*_mechanism(x))
    args = [x[n] for n in ("q", "k", "v", "beta", "g", "S0")]
    recorded = library.chunk(*args, 4, 0.5, mech)
    assert all(t.requires_grad for t in recorded)
    applied = []
    monkeypatch.setattr(library._EagerChunk, "apply", lambda *a: applied.append(a))
    detached = [None if t is None else t.detach() for t in args]
    with torch.no_grad():
        no_grad = library.chunk(*args, 4, 0.5, mech)
    no_inputs = library.chunk(*detached, 4, 0.5, mech)
    assert not applied
    for outputs in (no_grad, no_inputs):
        assert not any(t.requires_grad for t in outputs)
        assert all(torch.equal(a, b.detach()) for a, b in zip(outputs, recorded, strict=True))


def _saved_numbers(fn) -> list[tuple[int, ...]]:
    """The shapes of the tensors autograd saves while ``fn()`` records its graph."""
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return shapes, out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("rule", "gate"), MECHANISMS)
@pytest.mark.parametrize("T", [1, 4, 9], ids=["T1", "one-chunk", "three-chunks"])
def test_one_chunk_saves_the_entering_state_once(rule, gate, T, backend, monkeypatch):
    # A call of one chunk (a decoding step with grad on) saves S0 and no chunk-state buffer
    # beside it (the state entering its only chunk is S0); its gradients are the bits of the
    # call that keeps the buffer. Longer calls keep the buffer of their chunks' states.
    monkeypatch.setenv("LINATTN_NATIVE", backend)
    names = ("q", "k", "v", "beta", "g", "S0")
    x = _inputs(rule, gate, B=2, T=T)  # S0 [2, 2, 4, 3], the buffer [chunks, 4, 4, 3]
    mech = library.mechanism(*_mechanism(x))
    saved, (o, S) = _saved_numbers(lambda: library.chunk(*(x[n] for n in names), 4, 0.5, mech))
    B, HV, K, V = x["S0"].shape
    buffers = [s for s in saved if len(s) == 4 and s[1:] == (B * HV, K, V)]
    assert buffers == ([] if T <= 4 else [(3, B * HV, K, V)]), saved
    leaves = [x[n] for n in names if x[n] is not None]
    grads = torch.autograd.grad(o.square().sum() + S.sum(), leaves)
    y = {n: None if t is None else t.detach().requires_grad_() for n, t in x.items()}
    kept = library._EagerChunk.apply(*_forward_args(y, C=4))
    leaves = [y[n] for n in names if y[n] is not None]
    expected = torch.autograd.grad(kept[0].square().sum() + kept[1].sum(), leaves)
    for got, want in zip(grads, expected, strict=True):
        assert torch.equal(got, want)
