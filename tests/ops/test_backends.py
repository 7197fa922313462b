"""linattn.ops.backend: the choice between fla's kernels, the fused CPU kernels and the loop.

Nothing here imports fla (that must wait for ``TRITON_INTERPRET=1``: tests/fla_interpreter.py):
the routes are run through ``linattn.compat``, whose functions have fla's signatures and map them
onto linattn's ops, so a route that agrees with its op there is compat inverted. fla's own
kernels on these routes: tests/compat/test_dispatch_vs_fla.py.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from linattn import compat, dispatch, ops, registry
from linattn.ops import _native, backends
from linattn.registry.cases import cyfa_case

given = dispatch.arguments  # the op's arguments by name for a registry case's inputs
call = dispatch.call  # the op called with them


def asymmetric(x):
    """The case's inputs with the generalized delta rule's a no longer along b: the registry's
    a = -beta b makes a b^T symmetric, and a route swapping a and b would compute the same."""
    if "a" in x and "b" in x:
        x["a"] = x["a"].roll(1, dims=1)  # -beta_t b_{t-1}: bounded as before
    return x


ROUTES = [(name, route) for name, found in dispatch.table().items() for route in found]
SHAPES = ((8, 4), (16, 16), (64, 16))  # (K, V): the first a route's kernel takes is used
CASES = {"cyfa": cyfa_case(num_slots=8)}  # fla's chunk kernel: a power of two of slots


def _query_groups(x, groups):
    """The case's inputs with ``groups`` query heads per key head: k and v keep the first
    H / groups heads (fla's grouped-query layout), the rest keep them all."""
    if groups == 1:
        return x
    H = x["q"].shape[2] // groups
    return {n: t[:, :, :H] if n in ("k", "v") else t for n, t in x.items()}


def _taken(entry, route):
    """The op's arguments for a call of the case that ``route`` takes (``dispatch.refusal``):
    the first of ``SHAPES`` its kernel takes, with fla's query groups, and without states where
    fla's are not the op's; and fla's keyword arguments for it."""
    groups = dispatch.FLA_QUERY_GROUPS.get(route.fla_name, 1)
    query = next(iter(inspect.signature(entry.op).parameters))
    for K, V in SHAPES:
        case = CASES.get(entry.name, entry.case)
        x = _query_groups(asymmetric(case.inputs(1, 12, 2 * groups, K, V, 3)), groups)
        arguments = given(entry, x)
        fla_kwargs = dispatch.refusal(route, arguments[query], arguments)
        if isinstance(fla_kwargs, str) and "state" in fla_kwargs:
            arguments = given(entry, x, initial_state=None, output_final_state=False)
            fla_kwargs = dispatch.refusal(route, arguments[query], arguments)
        if not (isinstance(fla_kwargs, str) and fla_kwargs.startswith(f"{route.fla_name}: ")):
            return arguments, fla_kwargs  # taken, or refused for more than its shape
    return arguments, fla_kwargs


def test_the_table_covers_every_registered_mechanism_fla_has_and_lists_the_gaps():
    table = dispatch.table()
    own = {e.name for e in registry.mechanisms() if dispatch.served_by(e) is None}
    have = {e.name for e in registry.mechanisms() if e.fla_names}
    assert set(table) == {e.name for e in registry.mechanisms() if dispatch.routed(e)} & have & own
    assert (
        set(dispatch.unrouted())
        == {e.name for e in registry.mechanisms() if not dispatch.routed(e)} & have
    )
    for e in registry.mechanisms():  # a reparametrisation is dispatched as its nearest
        assert dispatch.served_by(e) in (None, e.nearest), e.name
    assert all(table.values()), [name for name, found in table.items() if not found]
    # fla 0.6.0 has every other mechanism (log-linear attention over Mamba-2 only)
    assert dispatch.gaps() == ("softmax", "log_linear_gated_delta")
    for name, found in table.items():
        assert {r.fla_name for r in found} <= set(registry.get(name).fla_names)


def test_every_unrouted_mechanism_says_why():
    """A mechanism fla has stays on linattn's code only with its reason written down."""
    assert set(dispatch.unrouted()) == set(dispatch.UNROUTED)
    assert all(len(why) > 40 for why in dispatch.UNROUTED.values())
    assert not set(dispatch.UNROUTED) & set(dispatch.table())


@pytest.mark.parametrize("name,route", ROUTES, ids=[f"{n}-{r.fla_name}" for n, r in ROUTES])
def test_every_route_through_compat_is_the_op_itself(name, route):
    """A route's arguments, given to compat's function of its fla name, compute the op's call,
    and its return conversion gives the op's return: the route inverts compat (float64, so any
    difference is a different computation)."""
    entry = registry.get(name)
    arguments, fla_kwargs = _taken(entry, route)
    if isinstance(fla_kwargs, str):  # the mechanism's entry point for a constant gate
        assert route.fla_name in (
            "chunk_retention", "fused_recurrent_retention", "chunk_lightning_attn",
            "fused_recurrent_lightning_attn", "fused_recurrent_hgrn",
        ), fla_kwargs  # fmt: skip
        return
    want = dispatch.tensors(call(entry, arguments))
    got = dispatch.tensors(route.returns(arguments)(getattr(compat, route.fla_name)(**fla_kwargs)))
    assert len(got) == len(want) >= 1
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.to(b.dtype), b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["path", "forgetting", "gsa"])
def test_a_call_without_its_gate_takes_the_route_that_takes_none(name):
    """PaTH without its forget gate, FoX without g, GSA without g (ABC's control): fla's entry
    point takes the gate as None, and the route through compat is the op's call."""
    entry = registry.get(name)
    found = dispatch.routes(dispatch.op_name(entry), "none")
    assert (
        found
        and found[0].fla_name == dispatch.routes(dispatch.op_name(entry), entry.gate)[0].fla_name
    )
    arguments, fla_kwargs = _taken(entry, found[0])
    arguments["g"] = None
    fla_kwargs = dispatch.refusal(found[0], arguments["q"], arguments)
    assert fla_kwargs["g"] is None
    want = dispatch.tensors(call(entry, arguments))
    got = dispatch.tensors(
        found[0].returns(arguments)(getattr(compat, found[0].fla_name)(**fla_kwargs))
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.to(b.dtype), b, rtol=1e-10, atol=1e-10)


def test_backend_names_are_checked_and_blocks_nest():
    with pytest.raises(ValueError, match="backend must be one of"):
        with ops.backend("cuda"):
            pass
    assert backends.current() == "auto"
    with ops.backend("fla"):
        with ops.backend("torch"):
            assert backends.current() == "torch"
        assert backends.current() == "fla"
    assert backends.current() == "auto"


def _fake_fla(monkeypatch, calls):
    """fla stood in for by compat (run on linattn's own path), recording the names called."""

    def function(fla_name):
        def run(**kwargs):
            calls.append(fla_name)
            with ops.backend("native"):
                return getattr(compat, fla_name)(**kwargs)

        return run

    monkeypatch.setattr(dispatch, "fla_ready", lambda: True)
    monkeypatch.setattr(dispatch, "fla_function", function)


def _gated_delta(dtype=torch.float32):
    entry = registry.get("gated_delta")
    x = entry.case.inputs(1, 10, 2, 8, 4, 1, dtype)
    return entry, x


def test_auto_leaves_cpu_tensors_on_linattn(monkeypatch):
    calls = []
    _fake_fla(monkeypatch, calls)
    entry, x = _gated_delta()
    call(entry, given(entry, x))
    assert calls == []


def test_auto_sends_a_gpu_call_to_fla_and_float64_never(monkeypatch):
    calls = []
    _fake_fla(monkeypatch, calls)
    monkeypatch.setattr(backends, "on_gpu", lambda q: True)  # no GPU here: stand in for one
    entry, x = _gated_delta()
    o, S = call(entry, given(entry, x))
    assert calls == ["chunk_gated_delta_rule"]
    with ops.backend("native"):
        o_ours, S_ours = call(entry, given(entry, x))
    torch.testing.assert_close(o, o_ours)
    torch.testing.assert_close(S, S_ours)
    entry, x = _gated_delta(torch.float64)
    call(entry, given(entry, x))
    with ops.backend("fla"):
        call(entry, given(entry, x))
    assert calls == ["chunk_gated_delta_rule"]  # float64 stayed on linattn's loop


def test_a_decoding_step_goes_to_flas_recurrent_kernel(monkeypatch):
    calls = []
    _fake_fla(monkeypatch, calls)
    entry, x = _gated_delta()
    with ops.backend("fla"):
        call(entry, given(entry, x, mode="recurrent"))
    assert calls == ["fused_recurrent_gated_delta_rule"]


def test_float32_delta_rule_takes_flas_recurrent_kernel(monkeypatch):
    """fla's chunk delta rule refuses float32: its recurrent kernel serves the call."""
    calls = []
    _fake_fla(monkeypatch, calls)
    entry = registry.get("delta")
    x = entry.case.inputs(1, 10, 2, 8, 4, 1, torch.float32)
    with ops.backend("fla"):
        call(entry, given(entry, x))
        call(entry, given(entry, {n: t.half() for n, t in x.items() if t is not None}))
    assert calls == ["fused_recurrent_delta_rule", "chunk_delta_rule"]


def test_auto_on_gpu_falls_back_once_with_a_warning_and_fla_refuses_clearly(monkeypatch):
    monkeypatch.setattr(backends, "on_gpu", lambda q: True)
    monkeypatch.setattr(dispatch, "fla_ready", lambda: "fla does not import (test)")
    monkeypatch.setattr(backends, "_WARNED", set())
    entry, x = _gated_delta()
    with pytest.warns(RuntimeWarning, match="fla does not import"):
        o, _ = call(entry, given(entry, x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        call(entry, given(entry, x))  # said once
    with ops.backend("native"):
        torch.testing.assert_close(o, call(entry, given(entry, x))[0])
    with ops.backend("fla"), pytest.raises(ValueError, match="backend.'fla'.*does not import"):
        call(entry, given(entry, x))


def test_fla_refuses_what_its_kernels_do_not_compute(monkeypatch):
    _fake_fla(monkeypatch, [])
    entry = registry.get("linear")
    x = entry.case.inputs(1, 10, 2, 8, 4, 1, torch.float32)
    x["S0"] = torch.zeros(1, 2, 8, 5)
    with ops.backend("fla"), pytest.raises(ValueError, match="normalize=True"):
        call(entry, given(entry, x, normalize=True))
    entry = registry.get("comba")  # Comba without a gate: no registered mechanism fla has
    x = entry.case.inputs(1, 10, 2, 8, 4, 1, torch.float32)
    x["g"] = None
    with ops.backend("fla"), pytest.raises(ValueError, match="no kernel"):
        call(entry, given(entry, x))


def test_fla_refuses_grouped_heads_where_its_kernel_needs_equal_heads(monkeypatch):
    _fake_fla(monkeypatch, [])
    entry = registry.get("scalar_decay")
    x = entry.case.inputs(1, 10, 1, 8, 4, 1, torch.float32)
    x["v"], x["g"] = x["v"].repeat(1, 1, 2, 1), x["g"].repeat(1, 1, 2)
    x["S0"] = x["S0"].repeat(1, 2, 1, 1)
    with ops.backend("fla"), pytest.raises(ValueError, match="as many value heads"):
        call(entry, given(entry, x))


def test_bad_input_is_refused_by_linattns_checks_before_fla(monkeypatch):
    calls = []
    _fake_fla(monkeypatch, calls)
    entry = registry.get("rwkv7")
    x = entry.case.inputs(1, 10, 2, 8, 4, 1, torch.float32)
    x["S0"] = torch.zeros(1, 2, 8, 5)
    with ops.backend("fla"), pytest.raises(ValueError, match="initial_state"):
        call(entry, given(entry, x))
    assert calls == []


def test_torch_backend_turns_the_fused_kernels_off():
    entry, x = _gated_delta()
    with ops.backend("torch"):
        assert not _native.available()
        o_loop, S_loop = call(entry, given(entry, x))
    o, S = call(entry, given(entry, x))
    torch.testing.assert_close(o, o_loop, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_loop, rtol=1e-5, atol=1e-5)


def test_a_call_recording_gradients_avoids_flas_kernels_without_a_backward(monkeypatch):
    calls = []
    _fake_fla(monkeypatch, calls)
    entry, x = _gated_delta()
    x = {n: t.requires_grad_() for n, t in x.items()}
    with ops.backend("fla"):
        call(entry, given(entry, x, mode="recurrent"))  # fla's recurrent kernel has no backward
    assert calls == ["chunk_gated_delta_rule"]
    entry = registry.get("iplr")
    x = entry.case.inputs(1, 10, 2, 8, 4, 1, torch.float32)
    x["q"].requires_grad_()
    with ops.backend("fla"):
        call(entry, given(entry, x))  # fla's IPLR chunk kernel has no backward
    with torch.no_grad(), ops.backend("fla"):
        call(entry, given(entry, x))
    assert calls[1:] == ["fused_recurrent_iplr_delta_rule", "chunk_iplr_delta_rule"]


def test_a_block_in_another_thread_leaves_this_one_on_auto(monkeypatch):
    import threading

    monkeypatch.setattr(backends, "on_gpu", lambda q: False)
    inside, release = threading.Event(), threading.Event()

    def other():
        with ops.backend("fla"):
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert inside.wait(10)
        q = torch.zeros(1, 2, 1, 4)
        assert backends.current() == "auto" and not backends.wanted(q)
        with ops.backend("fla"):
            assert backends.wanted(q)
    finally:
        release.set()
        thread.join()
    assert backends._open == [0]


def test_the_routed_ops_are_exactly_the_ops_that_consult_the_backend_choice():
    import re
    from pathlib import Path

    from linattn.ops import backends

    source = Path(backends.__file__).parent
    calls = set()
    for path in source.glob("*.py"):
        calls |= set(re.findall(r'(?:choose|_on_fla)\(\s*"([a-z_0-9]+)"', path.read_text()))
    assert calls == backends.ROUTED_OPS
    with pytest.raises(ValueError, match="'mesa' is not one of the ROUTED_OPS"):
        backends.choose("mesa", None, None, {})


def _fla_call(monkeypatch, name, x, calls=None, **extra):
    """``name``'s op on the case's inputs ``x`` inside ``backend("fla")``, fla stood in for by
    compat (``calls`` records the entry points)."""
    _fake_fla(monkeypatch, [] if calls is None else calls)
    entry = registry.get(name)
    with ops.backend("fla"):
        return call(entry, given(entry, x, **extra))


def test_fla_refuses_what_its_kernels_of_the_families_do_not_take(monkeypatch):
    """The facts of ``dispatch`` about fla's kernels, each refusing a call with its reason."""
    entry = registry.get("abc")  # its kernel's final state is wrong unless 64 divides T
    x = {n: t.float() for n, t in entry.case.inputs(1, 10, 2, 8, 4, 1).items() if n != "S0"}
    with pytest.raises(ValueError, match="off by exp"):
        _fla_call(monkeypatch, "abc", x)
    calls = []
    _fla_call(monkeypatch, "abc", x, calls, output_final_state=False)
    assert calls == ["chunk_abc"]
    entry = registry.get("log_linear_mamba2")  # fla's state is its kernel's, not the op's
    x = {n: t.float() for n, t in entry.case.inputs(1, 10, 2, 64, 16, 1).items() if n != "S0"}
    with pytest.raises(ValueError, match="cannot take or give the op's state"):
        _fla_call(monkeypatch, "log_linear_mamba2", x)
    with pytest.raises(ValueError, match="K a multiple of 64"):
        y = {n: t[..., :8] if n in ("q", "k") else t for n, t in x.items()}
        _fla_call(monkeypatch, "log_linear_mamba2", y, output_final_state=False)
    calls = []
    _fla_call(monkeypatch, "log_linear_mamba2", x, calls, output_final_state=False)
    assert calls == ["chunk_log_linear_attn"]
    entry = registry.get("parallax")  # fla's kernel takes half precision only
    x = entry.case.inputs(1, 10, 2, 16, 16, 1, torch.float32)
    with pytest.raises(ValueError, match="refuses float32"):
        _fla_call(monkeypatch, "parallax", x)
    entry = registry.get("nsa")  # a group of 16 query heads per key head at least
    x = entry.case.inputs(1, 10, 2, 16, 16, 1, torch.float32)
    with pytest.raises(ValueError, match="power of two >= 16 query heads"):
        _fla_call(monkeypatch, "nsa", x)
    entry = registry.get("path")  # head sizes 16, 32, 64, 128
    x = entry.case.inputs(1, 10, 2, 8, 16, 1, torch.float32)
    with pytest.raises(ValueError, match="head sizes in"):
        _fla_call(monkeypatch, "path", x)


def test_ttt_records_gradients_on_flas_kernel_where_its_backward_is_right(monkeypatch):
    entry = registry.get("ttt_linear")
    x = {n: t.float().requires_grad_() for n, t in entry.case.inputs(1, 12, 2, 8, 8, 1).items()}
    calls = []
    _fla_call(monkeypatch, "ttt_linear", x, calls, mini_batch_size=4)
    assert calls == ["chunk_ttt_linear"]
    with pytest.raises(ValueError, match="last mini-batch is partial"):  # 12 tokens, 16 a batch
        _fla_call(monkeypatch, "ttt_linear", x)
    _fla_call(monkeypatch, "ttt_linear", x, calls, output_final_state=False)
    assert calls == ["chunk_ttt_linear"] * 2
    x["S0_W"], x["S0_h"] = (t.detach().repeat(2, 1, 1, 1) for t in (x["S0_W"], x["S0_h"]))
    with pytest.raises(ValueError, match="backward refuses packed sequences"):
        _fla_call(monkeypatch, "ttt_linear", x, cu_seqlens=torch.tensor([0, 4, 12]))
    with torch.no_grad():
        _fla_call(monkeypatch, "ttt_linear", x, calls, cu_seqlens=torch.tensor([0, 4, 12]))
    assert calls == ["chunk_ttt_linear"] * 3


def test_a_kernel_that_needs_flash_attn_waits_for_it(monkeypatch):
    """fla's DeltaFormer reads o with flash-attn: without it the call stays on linattn."""
    entry = registry.get("deltaformer")
    x = entry.case.inputs(1, 10, 2, 16, 16, 1, torch.float32)
    monkeypatch.setattr(dispatch, "flash_attn_ready", lambda function: False)
    with pytest.raises(ValueError, match="needs flash-attn"):
        _fla_call(monkeypatch, "deltaformer", x)
    monkeypatch.setattr(dispatch, "flash_attn_ready", lambda function: True)
    calls = []
    o = _fla_call(monkeypatch, "deltaformer", x, calls)
    assert calls == ["deltaformer_attn"] and o.shape == x["v"].shape


def test_paths_float32_arguments_are_passed_in_float32(monkeypatch):
    """fla's PaTH asserts w, beta and g are float32 whatever q's dtype: the route casts them."""
    seen = {}
    monkeypatch.setattr(dispatch, "fla_ready", lambda: True)

    def function(fla_name):
        def run(**kwargs):
            seen.update({n: t.dtype for n, t in kwargs.items() if isinstance(t, torch.Tensor)})
            with ops.backend("native"):
                return getattr(compat, fla_name)(**kwargs)

        return run

    monkeypatch.setattr(dispatch, "fla_function", function)
    entry = registry.get("path")
    x = entry.case.inputs(1, 10, 2, 16, 16, 1, torch.bfloat16)
    with ops.backend("fla"):
        o = call(entry, given(entry, x))
    assert o.dtype == torch.bfloat16
    assert seen == {"q": torch.bfloat16, "k": torch.bfloat16, "v": torch.bfloat16,
                    "w": torch.float32, "beta": torch.float32, "g": torch.float32}  # fmt: skip
