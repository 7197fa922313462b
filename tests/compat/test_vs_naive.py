"""compat vs fla 0.6.0's pure-PyTorch references (``fla/ops/*/naive.py``), forward and
gradients. They compute in float32 whatever the inputs; for float64, KDA's recurrent reference
runs with its float32 casts promoted (``helpers.Promoted``) and agrees to rounding.

``test_every_form_*``: every entry point of the gated delta rule, KDA, GLA and simple GLA
against its family's recurrent reference at T = 1 and T = 37 from an initial state, and on
packed sequences (pieces of 1, 8 and 14 tokens, each from its own initial state) against the
reference run on each piece alone."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")
kda_naive = pytest.importorskip("fla.ops.kda.naive")
gdn_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
sgla_naive = pytest.importorskip("fla.ops.simple_gla.naive")
gla_naive = pytest.importorskip("fla.ops.gla.naive")
kda_gate_module = pytest.importorskip("fla.ops.kda.gate")
delta_naive = pytest.importorskip("fla.ops.delta_rule.naive")
hgrn_naive = pytest.importorskip("fla.ops.hgrn.naive")

from linattn import compat  # noqa: E402

from .helpers import Promoted, assert_same, outputs_and_grads, recipe  # noqa: E402


def _compare(ours, theirs, leaves, tol):
    a, da = outputs_and_grads(ours, leaves)
    b, db = outputs_and_grads(theirs, leaves)
    assert_same(a, b, tol, "o, S")
    for n in leaves:
        assert_same([da[n]], [db[n]], tol, f"d{n}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_kda_recurrent_grouped_heads(dtype, monkeypatch):
    if dtype == torch.float64:
        monkeypatch.setattr(kda_naive, "torch", Promoted())
    x = recipe(T=37, H=2, HV=4, dtype=dtype)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["gk"], "beta": x["beta"],
              "initial_state": x["h0"]}  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 3e-5
    for fn in (compat.chunk_kda, compat.fused_recurrent_kda):
        _compare(
            lambda fn=fn, **t: fn(**t, output_final_state=True),
            lambda **t: kda_naive.naive_recurrent_kda(**t, output_final_state=True),
            leaves, tol,
        )  # fmt: skip


def test_kda_chunk_reference():
    x = recipe(T=64, H=2, HV=4)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["gk"], "beta": x["beta"],
              "initial_state": x["h0"]}  # fmt: skip
    _compare(
        lambda **t: compat.chunk_kda(**t, output_final_state=True),
        lambda **t: kda_naive.naive_chunk_kda(**t, output_final_state=True),
        leaves, 3e-5,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["naive_recurrent_gated_delta_rule",
                                  "naive_chunk_gated_delta_rule"])  # fmt: skip
def test_gated_delta_rule(name):
    x = recipe(T=64)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"], "beta": x["beta"],
              "initial_state": x["h0"]}  # fmt: skip
    _compare(
        lambda **t: compat.chunk_gated_delta_rule(**t, output_final_state=True),
        lambda **t: getattr(gdn_naive, name)(**t, output_final_state=True),
        leaves, 3e-5,
    )  # fmt: skip


def test_simple_gla():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"], "initial_state": x["h0"]}
    _compare(
        lambda **t: compat.chunk_simple_gla(**t, output_final_state=True),
        lambda **t: sgla_naive.naive_recurrent_simple_gla(**t, output_final_state=True),
        leaves, 3e-5,
    )  # fmt: skip


def test_delta_rule():
    x = recipe()
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "beta": x["beta"],
              "initial_state": x["h0"]}  # fmt: skip

    def theirs(q, k, v, beta, initial_state):  # fla's reference takes [B, H, T, D]
        q, k, v, beta = (t.transpose(1, 2) for t in (q, k, v, beta))
        o, S = delta_naive.delta_rule_recurrence(q, k, v, beta, initial_state)
        return o.transpose(1, 2), S

    for fn in (compat.chunk_delta_rule, compat.fused_recurrent_delta_rule):
        _compare(lambda fn=fn, **t: fn(**t, output_final_state=True), theirs, leaves, 3e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_hgrn(dtype, monkeypatch):
    if dtype == torch.float64:
        monkeypatch.setattr(hgrn_naive, "torch", Promoted())
        to_float = torch.Tensor.float
        monkeypatch.setattr(
            torch.Tensor, "float", lambda x: x if x.dtype == torch.float64 else to_float(x)
        )
    x = recipe(T=37, dtype=dtype)
    # x, g [B, T, D = 16] and h0 [B, D] from the recipe's v, gv and state
    leaves = {"x": x["v"].flatten(2), "g": x["gv"].flatten(2),
              "initial_state": x["h0"][:, :, 0].flatten(1)}  # fmt: skip
    tol = 1e-12 if dtype == torch.float64 else 3e-5
    _compare(
        lambda **t: compat.fused_recurrent_hgrn(**t, output_final_state=True),
        lambda **t: hgrn_naive.naive_recurrent_hgrn(**t, output_final_state=True),
        leaves, tol,
    )  # fmt: skip


def _gdn_reference(q, k, v, g, beta, initial_state):
    return gdn_naive.naive_recurrent_gated_delta_rule(
        q, k, v, beta, g, initial_state=initial_state, output_final_state=True
    )


def _kda_reference(q, k, v, g, beta, initial_state):
    return kda_naive.naive_recurrent_kda(q, k, v, g, beta, initial_state=initial_state,
                                         output_final_state=True)  # fmt: skip


def _gla_reference(q, k, v, gk, initial_state):
    return gla_naive.naive_recurrent_gla(q, k, v, gk, initial_state, output_final_state=True)


def _sgla_reference(q, k, v, g, initial_state):
    return sgla_naive.naive_recurrent_simple_gla(q, k, v, g, initial_state=initial_state,
                                                 output_final_state=True)  # fmt: skip


# name -> (the recipe's tensors in the entry point's order, its names for them, reference)
KDA, KDA_FLA = ("q", "k", "v", "gk", "beta"), ("q", "k", "v", "g", "beta")
FORMS = {
    "chunk_gated_delta_rule": (("q", "k", "v", "g", "beta"), None, _gdn_reference),
    "chunk_gdn": (("q", "k", "v", "g", "beta"), None, _gdn_reference),
    "fused_recurrent_gated_delta_rule": (("q", "k", "v", "g", "beta"), None, _gdn_reference),
    "fused_recurrent_gdn": (("q", "k", "v", "g", "beta"), None, _gdn_reference),
    "chunk_kda": (KDA, KDA_FLA, _kda_reference),
    "fused_recurrent_kda": (KDA, KDA_FLA, _kda_reference),
    "chunk_gla": (("q", "k", "v", "gk"), ("q", "k", "v", "g"), _gla_reference),
    "fused_recurrent_gla": (("q", "k", "v", "gk"), None, _gla_reference),
    "chunk_simple_gla": (("q", "k", "v", "g"), None, _sgla_reference),
    "fused_chunk_simple_gla": (("q", "k", "v", "g"), None, _sgla_reference),
    "fused_recurrent_simple_gla": (("q", "k", "v", "g"), None, _sgla_reference),
}


def _form_leaves(name, T, N):
    names, fla_names, _ = FORMS[name]
    x = recipe(T=T, H=2)
    leaves = {fla: x[n] for n, fla in zip(names, fla_names or names, strict=True)}
    leaves["initial_state"] = torch.cat([x["h0"] * (-1) ** n / (1 + n) for n in range(N)])
    return leaves


@pytest.mark.parametrize("T", [1, 37])
@pytest.mark.parametrize("name", FORMS)
def test_every_form_equals_its_recurrent_reference(name, T):
    reference = FORMS[name][2]
    _compare(
        lambda **t: getattr(compat, name)(**t, output_final_state=True),
        lambda **t: reference(*t.values()), _form_leaves(name, T, 1), 3e-5,
    )  # fmt: skip


@pytest.mark.parametrize("name", FORMS)
def test_every_form_on_packed_sequences_equals_the_reference_on_each(name):
    cuts = [0, 1, 9, 23]
    reference = FORMS[name][2]

    def theirs(**t):
        h0 = t.pop("initial_state")
        outs, finals = [], []
        for n, (s, e) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
            o, S = reference(*(x[:, s:e] for x in t.values()), h0[n : n + 1])
            outs.append(o)
            finals.append(S)
        return torch.cat(outs, 1), torch.cat(finals)

    _compare(
        lambda **t: getattr(compat, name)(**t, output_final_state=True,
                                          cu_seqlens=torch.tensor(cuts)),
        theirs, _form_leaves(name, cuts[-1], len(cuts) - 1), 3e-5,
    )  # fmt: skip


@pytest.mark.parametrize("T", [1, 37])
def test_simple_gla_chunk_and_parallel_references(T):
    """fla's chunk reference (it pads T to its chunk of 64) and its parallel one (o and the
    decayed score matrix, which compat returns with ``output_attentions``)."""
    x = recipe(T=T)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"], "initial_state": x["h0"]}
    _compare(
        lambda **t: compat.chunk_simple_gla(**t, output_final_state=True),
        lambda **t: sgla_naive.naive_chunk_simple_gla(**t, output_final_state=True),
        leaves, 3e-5,
    )  # fmt: skip
    del leaves["initial_state"]
    _compare(
        lambda **t: compat.parallel_simple_gla(**t, output_attentions=True),
        lambda **t: sgla_naive.naive_parallel_simple_gla(**t), leaves, 3e-5,
    )  # fmt: skip


@pytest.mark.parametrize(
    "with_A, lower_bound",
    [(True, None), (True, -3.0), (False, -3.0)],
    ids=["softplus", "lower_bound", "lower_bound-no-A_log"],
)
def test_kda_gate_equals_flas_references(with_A, lower_bound):
    """fla's ``naive_kda_gate`` and ``naive_kda_lowerbound_gate`` (fla.ops.kda.gate): raw input
    [B, T, HV, K], A_log [HV], dt_bias [HV * K]; the gate and its gradients."""
    gen = torch.Generator().manual_seed(3)
    leaves = {"g": torch.randn(1, 7, 4, 16, generator=gen)}
    leaves["dt_bias"] = torch.randn(64, generator=gen)
    if with_A:
        leaves["A_log"] = torch.randn(4, generator=gen)

    def theirs(g, dt_bias, A_log=None):
        if lower_bound is None:
            return kda_gate_module.naive_kda_gate(g, A_log, dt_bias)
        return kda_gate_module.naive_kda_lowerbound_gate(g, A_log, dt_bias, lower_bound)

    _compare(lambda g, dt_bias, A_log=None: compat.kda_gate(g, A_log, dt_bias, lower_bound),
             theirs, leaves, 3e-6)  # fmt: skip
