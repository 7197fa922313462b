"""compat vs transformers' own PyTorch fallbacks: Qwen3-Next's gated delta rule (grouped value
heads) and Kimi-Linear's KDA, forward and gradients, float32 and float64.

With fla installed, transformers binds fla's kernels in place of these functions at import;
``inspect.unwrap`` gives back its own PyTorch code. The fallbacks compute in float32
(``x.to(torch.float32)``, ``.float()``); for float64 the module's ``torch`` is seen through a
proxy whose ``float32`` is float64 and ``Tensor.float`` keeps float64 (the casts promoted), so
that both sides compute in float64 and agree to rounding.
"""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("tests.fla_interpreter")  # before transformers binds fla's kernels
qwen3 = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

from linattn import compat  # noqa: E402

from .helpers import Promoted, assert_same, outputs_and_grads, recipe  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request, monkeypatch):
    if request.param == torch.float64:
        monkeypatch.setattr(qwen3, "torch", Promoted())
        monkeypatch.setattr(kimi, "torch", Promoted())
        to_float = torch.Tensor.float
        monkeypatch.setattr(
            torch.Tensor, "float", lambda x: x if x.dtype == torch.float64 else to_float(x)
        )
    return request.param


def _tol(dtype):
    return 1e-11 if dtype == torch.float64 else 3e-5


def _gdn_leaves(dtype, HV):
    x = recipe(T=37, H=2, HV=HV, dtype=dtype)
    return {n: x[n] for n in ("q", "k", "v", "g", "beta")} | {"initial_state": x["h0"]}


@pytest.mark.parametrize("HV", [2, 4], ids=["heads", "grouped"])
def test_qwen3_next_chunk_gated_delta_rule(dtype, HV):
    leaves = _gdn_leaves(dtype, HV)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)

    def ours(q, k, v, g, beta, initial_state):
        return compat.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state, **kw)

    def theirs(q, k, v, g, beta, initial_state):
        return inspect.unwrap(qwen3.torch_chunk_gated_delta_rule)(
            q, k, v, g, beta, chunk_size=64, initial_state=initial_state, **kw
        )

    a, da = outputs_and_grads(ours, leaves)
    b, db = outputs_and_grads(theirs, leaves)
    assert_same(a, b, _tol(dtype), "o, S")
    assert_same(list(da.values()), list(db.values()), _tol(dtype), "grads")


@pytest.mark.parametrize("HV", [2, 4], ids=["heads", "grouped"])
def test_qwen3_next_recurrent_gated_delta_rule(dtype, HV):
    leaves = _gdn_leaves(dtype, HV)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)

    def ours(q, k, v, g, beta, initial_state):
        return compat.fused_recurrent_gated_delta_rule(
            q, k, v, g, beta=beta, initial_state=initial_state, **kw
        )

    def theirs(q, k, v, g, beta, initial_state):
        return inspect.unwrap(qwen3.torch_recurrent_gated_delta_rule)(
            q, k, v, g, beta, initial_state=initial_state, **kw
        )

    a, da = outputs_and_grads(ours, leaves)
    b, db = outputs_and_grads(theirs, leaves)
    assert_same(a, b, _tol(dtype), "o, S")
    assert_same(list(da.values()), list(db.values()), _tol(dtype), "grads")


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_kimi_linear_kda(dtype, form):
    x = recipe(T=37, H=2, dtype=dtype)
    leaves = {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["gk"], "beta": x["beta"],
              "initial_state": x["h0"]}  # fmt: skip
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    if form == "chunk":
        fallback = inspect.unwrap(kimi.chunk_kimi_delta_attention)
        ours_fn = compat.chunk_kda
    else:
        fallback = inspect.unwrap(kimi.recurrent_kimi_delta_attention)
        ours_fn = compat.fused_recurrent_kda

    def ours(q, k, v, g, beta, initial_state):
        return ours_fn(q, k, v, g, beta, initial_state=initial_state, **kw)

    def theirs(q, k, v, g, beta, initial_state):
        return fallback(q, k, v, g, beta, initial_state=initial_state, **kw)

    a, da = outputs_and_grads(ours, leaves)
    b, db = outputs_and_grads(theirs, leaves)
    assert_same(a, b, _tol(dtype), "o, S")
    assert_same(list(da.values()), list(db.values()), _tol(dtype), "grads")
