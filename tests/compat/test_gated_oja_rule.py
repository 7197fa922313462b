"""compat.chunk_gated_oja_rule / fused_recurrent_gated_oja_rule vs fla 0.6.0: fla's
Triton kernels under triton's interpreter in float32 (fla has no naive reference for this
family): T = 1, T not a multiple of the chunk of 64, packed sequences with a length-1 piece,
initial states, grouped value heads in the recurrent form, the chunk kernel's gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tests.fla_interpreter")
oja = pytest.importorskip("fla.ops.gated_oja_rule")

from linattn import compat  # noqa: E402

from .helpers import assert_same, outputs_and_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def inputs(T=20, H=2, HV=None, K=16, V=8, N=1, seed=0):
    """q, k ~ N(0, 1), v unit, gv = logsigmoid(N(0, 1)) per value channel, beta ~ U(0, 1)."""
    HV = H if HV is None else HV
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    return {
        "q": randn(1, T, H, K), "k": randn(1, T, H, K),
        "v": F.normalize(randn(1, T, HV, V), dim=-1), "gv": F.logsigmoid(randn(1, T, HV, V)),
        "beta": torch.rand(1, T, HV, generator=gen), "initial_state": randn(N, HV, K, V),
    }  # fmt: skip


@pytest.mark.parametrize(
    "T,cu", [(1, None), pytest.param(23, [0, 1, 9, 23], marks=pytest.mark.slow), (20, None)],
    ids=["T1", "varlen-length-1", "T20"],
)  # fmt: skip
def test_chunk_agrees_with_fla_kernels_with_gradients(T, cu):
    x = inputs(T=T, N=1 if cu is None else len(cu) - 1)
    kw = {"cu_seqlens": None if cu is None else torch.tensor(cu), "output_final_state": True,
          "use_q_l2norm": True, "use_k_l2norm": True}  # fmt: skip
    a, da = outputs_and_grads(lambda **t: compat.chunk_gated_oja_rule(**t, **kw), x)
    b, db = outputs_and_grads(lambda **t: oja.chunk_gated_oja_rule(**t, **kw), x)
    assert_same(a, b, 5e-5, "chunk_gated_oja_rule")
    for name in x:
        assert_same([da[name]], [db[name]], 5e-5, f"chunk_gated_oja_rule d{name}")


@pytest.mark.parametrize(
    "options",
    [{"cu_seqlens": torch.tensor([0, 1, 9, 23])}, {"gva": True, "no_gate": True},
     {"use_qk_l2norm_in_kernel": False}, {"T": 1}],
    ids=["varlen", "gva-no-gate", "qk-l2norm-keyword", "T1"],
)  # fmt: skip
def test_fused_recurrent_agrees_with_fla_kernel(options):
    options = dict(options)
    cu = options.get("cu_seqlens")
    x = inputs(T=options.pop("T", 23), HV=4 if options.pop("gva", False) else None,
               N=1 if cu is None else len(cu) - 1)  # fmt: skip
    if options.pop("no_gate", False):
        x["gv"] = None
    ours = compat.fused_recurrent_gated_oja_rule(**x, **options, output_final_state=True)
    theirs = oja.fused_recurrent_gated_oja_rule(**x, **options, output_final_state=True)
    assert_same(list(ours), list(theirs), 5e-5, "fused_recurrent_gated_oja_rule")


def test_bad_input_is_named():
    x = inputs(T=5)
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, HV\]"):
        compat.fused_recurrent_gated_oja_rule(**{**x, "beta": x["v"]})
    with pytest.raises(ValueError, match="gv is a log-decay"):
        compat.chunk_gated_oja_rule(**{**x, "gv": -x["gv"]})
    with pytest.raises(ValueError, match="chunk_size. must be one of 16, 32, 64"):
        compat.chunk_gated_oja_rule(**x, chunk_size=8)
    with pytest.raises(DeprecationWarning, match="head_first"):
        compat.chunk_gated_oja_rule(**x, head_first=False)
