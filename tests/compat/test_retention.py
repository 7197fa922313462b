"""compat's retention (``*_retention``) and lightning attention (``*_lightning_attn``; module
``simple_gla``, registry entries "retention" and "lightning") vs fla 0.6.0: its naive
``naive_retention`` (float32: fla computes RetNet's decays in float32, as compat does) and its
Triton kernels under the interpreter (float32): T = 1, T = 19, packed sequences with a length-1
piece and one initial state each, forward and gradients, every entry point in the default run
(``EDGES``). test_vs_fla.py has the reversed loop and lightning's chunk form at T = 40."""

from __future__ import annotations

import pytest
import torch

from linattn import compat

from .helpers import assert_same, compare, outputs_and_grads, recipe

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
RETENTION = ("chunk_retention", "fused_chunk_retention", "fused_recurrent_retention",
             "parallel_retention")  # fmt: skip


@pytest.mark.parametrize("name", RETENTION)
@pytest.mark.parametrize("T", [1, 37])
def test_retention_equals_the_naive_reference(name, T):
    naive = pytest.importorskip("fla.ops.retention.naive")
    x = recipe(T=T, H=3)
    leaves = {n: x[n] for n in ("q", "k", "v")}

    def theirs(q, k, v):
        return naive.naive_retention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)

    compare(lambda **t: getattr(compat, name)(**t)[0], theirs, leaves, 3e-5)


SLOW = pytest.mark.slow
CASES = [
    pytest.param("chunk_retention", 19, True, {}, id="retention-chunk-varlen"),
    pytest.param("fused_recurrent_retention", 1, False, {}, id="retention-rec-T1", marks=SLOW),
    pytest.param("fused_recurrent_lightning_attn", 19, True, {"layer_idx": 2, "num_layers": 3},
                 id="lightning-rec-varlen", marks=SLOW),
    # layer 7 of 8: log-decays -0.5 h. With steeper ones (layer 0 of 2: -2 h) fla's chunk kernel
    # under the interpreter returns NaN final states at T = 1 or 19 (not at 40): its masked lanes
    # beyond T overflow exp(-g (64 - T)) in float32 (not checked on a GPU).
    pytest.param("chunk_lightning_attn", 1, False, {"layer_idx": 7, "num_layers": 8},
                 id="lightning-chunk-T1", marks=SLOW),
]  # fmt: skip


@pytest.mark.parametrize("name,T,varlen,kwargs", CASES)
def test_equals_fla_s_kernels(name, T, varlen, kwargs):
    pytest.importorskip("tests.fla_interpreter")
    ops = pytest.importorskip("fla.ops")
    x = recipe(T=T, H=2)
    h0 = x["h0"]
    if varlen:
        kwargs = {**kwargs, "cu_seqlens": torch.tensor([0, 1, T])}
        h0 = torch.cat([h0, -h0])
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "initial_state": h0}
    kwargs = {**kwargs, "output_final_state": True}
    a, da = outputs_and_grads(lambda **t: getattr(compat, name)(**t, **kwargs), leaves)
    b, db = outputs_and_grads(lambda **t: getattr(ops, name)(**t, **kwargs), leaves)
    assert_same(a, b, 5e-5, name)
    for n in leaves:
        assert_same([da[n]], [db[n]], 5e-5, f"{name} d{n}")


LIGHTNING = {"layer_idx": 7, "num_layers": 8}  # the decays of the chunk kernel's note above
EDGE_NAMES = [*RETENTION, "chunk_lightning_attn", "fused_recurrent_lightning_attn"]


@pytest.mark.parametrize("cuts", [None, [0, 1, 9, 23]], ids=["T1", "packed"])
@pytest.mark.parametrize("name", EDGE_NAMES)
def test_edges_equal_fla_s_kernels(name, cuts):
    """One token, and pieces of 1, 8 and 14 tokens, each from its own initial state (the
    parallel form has none); o, the final states and every gradient."""
    pytest.importorskip("tests.fla_interpreter")
    ops = pytest.importorskip("fla.ops")
    T, N = (1, 1) if cuts is None else (cuts[-1], len(cuts) - 1)
    x = recipe(T=T, H=2)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"]}
    kwargs = {} if cuts is None else {"cu_seqlens": torch.tensor(cuts)}
    if name != "parallel_retention":
        leaves["initial_state"] = torch.cat([x["h0"] * (-1) ** n / (1 + n) for n in range(N)])
        kwargs["output_final_state"] = True
    if "lightning" in name:
        kwargs.update(LIGHTNING)
    compare(lambda **t: getattr(compat, name)(**t, **kwargs),
            lambda **t: getattr(ops, name)(**t, **kwargs), leaves, 5e-5)  # fmt: skip
