"""linattn.ops.backend: the choice between fla's kernels, the fused CPU kernels and the loop.

Nothing here imports fla (that must wait for ``TRITON_INTERPRET=1``: tests/fla_interpreter.py):
the routes are run through ``linattn.compat``, whose functions have fla's signatures and map them
onto linattn's ops, so a route that agrees with its op there is compat inverted. fla's own
kernels on these routes: tests/compat/test_dispatch_vs_fla.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from linattn import compat, dispatch, ops, registry
from linattn.ops import _native, backends

given = dispatch.arguments  # the op's arguments by name for a registry case's inputs
call = dispatch.call  # the op called with them


def asymmetric(x):
    """The case's inputs with the generalized delta rule's a no longer along b: the registry's
    a = -beta b makes a b^T symmetric, and a route swapping a and b would compute the same."""
    if "a" in x and "b" in x:
        x["a"] = x["a"].roll(1, dims=1)  # -beta_t b_{t-1}: bounded as before
    return x


ROUTES = [(name, route) for name, found in dispatch.table().items() for route in found]


def test_the_table_covers_every_registered_mechanism_fla_has_and_lists_the_gaps():
    table = dispatch.table()
    # the softmax variants (rule None, issue 52) have fla names but are not dispatched
    assert set(table) == {e.name for e in registry.mechanisms() if e.fla_names and e.rule}
    assert all(table.values()), [name for name, found in table.items() if not found]
    assert dispatch.gaps() == ("softmax",)  # fla 0.6.0 has every other mechanism
    for name, found in table.items():
        assert {r.fla_name for r in found} <= set(registry.get(name).fla_names)


@pytest.mark.parametrize("name,route", ROUTES, ids=[f"{n}-{r.fla_name}" for n, r in ROUTES])
def test_every_route_through_compat_is_the_op_itself(name, route):
    """A route's arguments, given to compat's function of its fla name, compute the op's call:
    the route inverts compat (float64, so any difference is a different computation)."""
    entry = registry.get(name)
    x = asymmetric(entry.case.inputs(1, 12, 2, 8, 4, 3))
    arguments = given(entry, x)
    fla_kwargs = route.arguments(arguments)
    if isinstance(fla_kwargs, str):  # the mechanism's entry point for a constant gate
        assert route.fla_name in (
            "chunk_retention", "fused_recurrent_retention", "chunk_lightning_attn",
            "fused_recurrent_lightning_attn", "fused_recurrent_hgrn",
        ), fla_kwargs  # fmt: skip
        return
    o, S = call(entry, arguments)
    o_compat, S_compat = getattr(compat, route.fla_name)(**fla_kwargs)[:2]
    torch.testing.assert_close(o_compat.to(o.dtype), o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S_compat, S, rtol=1e-10, atol=1e-10)


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
