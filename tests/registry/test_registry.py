"""The registry of mechanisms: each entry's forms against its oracle, and the tools that read it.

A mechanism in the registry is tested here without a line of its own: its forms against its
float64 oracle, its gradients across forms, its compat names, layer, mixer and preset, and its
rows in ``linattn accuracy`` and cases in ``linattn bench``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import linattn.compat as compat
from linattn import registry
from linattn.experiments import _bench_cases
from linattn.integrations import transformers as hf
from linattn.models.config import MIXERS
from linattn.models.presets import PRESETS

ENTRIES = registry.mechanisms()
IDS = [e.name for e in ENTRIES]
FORM_CASES = [(e, form) for e in ENTRIES for form in e.forms]
FORM_IDS = [f"{e.name}-{form}" for e, form in FORM_CASES]


@pytest.mark.parametrize(("entry", "form"), FORM_CASES, ids=FORM_IDS)
def test_every_form_equals_the_oracle_in_float64(entry, form):
    # T = 37 with chunks of 16: two whole chunks and a partial one, from an initial state.
    x = entry.case.inputs(2, 37, 2, 8, 4, seed=3)
    scale = 8**-0.5
    o_ref, S_ref = entry.case.oracle(x, scale)
    o, S = entry.case.call(x, form, 16, scale)
    assert o.dtype == torch.float64
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    if S is not None:
        torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("entry", "form"), FORM_CASES, ids=FORM_IDS)
def test_every_form_in_float32_is_near_the_oracle(entry, form):
    x = entry.case.inputs(1, 29, 2, 8, 4, seed=4, dtype=torch.float32)
    o_ref, _ = entry.case.oracle(x, 0.3)
    o, _ = entry.case.call(x, form, 8, 0.3)
    assert o.dtype == torch.float32
    error = (o.double() - o_ref).norm() / o_ref.norm()
    assert error < 1e-5, error


def _leaf(t):
    # a tensor, or a pair of them (a two-state family's S0: GSA's and ABC's (S_k, S_v))
    if isinstance(t, tuple):
        return tuple(_leaf(s) for s in t)
    return t.clone().requires_grad_(True)


def _grad(t):
    return tuple(s.grad for s in t) if isinstance(t, tuple) else t.grad


def _gradients(entry, x, form):
    leaves = {name: _leaf(t) for name, t in x.items() if t is not None}
    o, S = entry.case.call({**dict.fromkeys(x), **leaves}, form, 8, 0.5)
    weights = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
    states = () if S is None else S if isinstance(S, tuple) else (S,)
    loss = (o * weights).sum() + sum(s.square().sum() for s in states)
    loss.backward()
    return {name: _grad(t) for name, t in leaves.items()}


@pytest.mark.parametrize("entry", [e for e in ENTRIES if len(e.forms) > 1], ids=lambda e: e.name)
def test_gradients_agree_across_forms(entry):
    x = entry.case.inputs(1, 21, 2, 4, 3, seed=5)
    grads = {form: _gradients(entry, x, form) for form in entry.forms}
    first = grads[entry.forms[0]]
    assert set(first) == {name for name, t in x.items() if t is not None}
    for form in entry.forms[1:]:
        for name, grad in grads[form].items():
            assert grad is not None, (form, name)
            torch.testing.assert_close(grad, first[name], rtol=1e-10, atol=1e-10)


def test_every_entry_names_what_exists():
    for entry in ENTRIES:
        assert callable(entry.op) and callable(entry.reference), entry.name
        if entry.layer_path is not None:
            assert isinstance(entry.layer, type), entry.name
        # a mixer name: built in (``MIXERS``), or built by the entry's layer from the config
        built = entry.mixer in MIXERS or hasattr(entry.layer, "from_config")
        assert entry.mixer is None or built, entry.name
        assert entry.preset is None or entry.preset in PRESETS, entry.name
        assert entry.gate in registry.GATES and entry.section, entry.name
        assert entry.nearest is None or entry.nearest in IDS, entry.name


def test_the_fla_names_are_exactly_the_entry_points_compat_computes():
    named = [name for e in ENTRIES for name in e.fla_names]
    assert len(named) == len(set(named)), "an fla name listed under two mechanisms"
    served = set(compat.COMPUTED) | set(compat.FLA_SUBMODULE_ENTRY_POINTS)
    assert set(named) == served
    for name in named:
        assert registry.with_fla_name(name).name in IDS
        assert callable(getattr(compat, name))


def test_the_transformers_names_are_the_families_the_integration_serves():
    named = {name for e in ENTRIES for name in e.transformers_names}
    assert named == set(hf.FAMILIES)


def test_lookups_refuse_an_unknown_name():
    assert registry.get("kda").rule == "delta"
    with pytest.raises(ValueError, match="unknown mechanism 'nope'"):
        registry.get("nope")
    assert registry.with_fla_name("chunk_nope") is None


def test_an_entry_refuses_an_unknown_gate_or_form():
    kda = registry.get("kda")
    with pytest.raises(ValueError, match="gate must be one of"):
        dataclasses.replace(kda, gate="token")
    with pytest.raises(ValueError, match="forms must be"):
        dataclasses.replace(kda, forms=("chunk", "scan"))
    with pytest.raises(TypeError, match="entry must be a linattn.registry.Entry"):
        registry.register("kda")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(kda)


def test_a_registered_mechanism_appears_in_the_tools():
    from linattn.experiments.accuracy import compute_accuracy

    base = registry.get("gated_delta")
    mine = dataclasses.replace(base, name="my_gated_delta", title="my Gated DeltaNet")
    registry.register(mine)
    try:
        assert registry.names()[-1] == "my_gated_delta"
        assert _bench_cases.by_name("my_gated_delta") is mine
        assert mine in _bench_cases.mechanisms()
        rows = [r for r in compute_accuracy(T=20, K=4, V=3) if r["name"] == "my_gated_delta"]
        assert [r["form"] for r in rows] == list(mine.forms)
    finally:
        registry.unregister("my_gated_delta")
    assert "my_gated_delta" not in registry.names()


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_every_entry_is_a_bench_case(entry):
    x = _bench_cases.make_inputs(entry, 1, 16, 2, 4, 4)
    assert all(t.dtype == torch.float32 for t in x.values())
    o = _bench_cases.call(entry, x, entry.forms[-1], 8)
    assert o.shape == (1, 16, 2, 4)
    assert _bench_cases.forward_ops(entry, 1, 16, 2, 4, 4, 8) > 0
