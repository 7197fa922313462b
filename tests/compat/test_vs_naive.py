"""compat vs fla 0.6.0's pure-PyTorch references (``fla/ops/*/naive.py``), forward and
gradients. They compute in float32 whatever the inputs; for float64, KDA's recurrent reference
runs with its float32 casts promoted (``helpers.Promoted``) and agrees to rounding."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")
kda_naive = pytest.importorskip("fla.ops.kda.naive")
gdn_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
sgla_naive = pytest.importorskip("fla.ops.simple_gla.naive")
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
