"""compat.chunk_precond_kda / fused_recurrent_precond_kda vs fla 0.6.0: fla's naive
token loop in float64 (its float32 casts promoted), and its Triton kernels under triton's
interpreter in float32 (T = 1, T not a multiple of fla's chunk of 64, packed sequences with a
length-1 piece, initial states of both kinds, KDA's in-kernel gate), with the chunk kernel's
gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tests.fla_interpreter")
chunk_module = pytest.importorskip("fla.ops.precond_kda.chunk")
recurrent_module = pytest.importorskip("fla.ops.precond_kda.fused_recurrent")
naive_module = pytest.importorskip("fla.ops.precond_kda.naive")

from linattn import compat  # noqa: E402

from .helpers import Promoted, assert_same, outputs_and_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def inputs(T=20, H=2, HV=None, K=16, V=8, N=1, dtype=torch.float32, seed=0, unit=False):
    """fla's recipe: q, k ~ N(0, 1) (unit with ``unit``), g [B, T, HV, K] and g_atk =
    logsigmoid, beta, beta_atk ~ U(0, 1); one state of each kind per sequence."""
    HV = H if HV is None else HV
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    q, k = randn(1, T, H, K), randn(1, T, H, K)
    if unit:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    x = {
        "q": q, "k": k, "v": randn(1, T, HV, V), "g": F.logsigmoid(randn(1, T, HV, K)),
        "g_atk": F.logsigmoid(randn(1, T, H)), "beta_atk": rand(1, T, H), "beta": rand(1, T, HV),
        "initial_state": randn(N, HV, K, V), "initial_A_state": rand(N, H, K),
        "log_atk_scale": randn(H),
    }  # fmt: skip
    return {name: t.to(dtype) for name, t in x.items()}


def test_agrees_with_fla_naive_in_float64(monkeypatch):
    """fla's naive loop never normalises q, k (its kernels do): unit q, k and the recurrent
    form without normalisation; the chunk form (always normalised) agrees to the 1e-6 of the
    normalisation's eps on unit vectors."""
    monkeypatch.setattr(naive_module, "torch", Promoted())
    x = inputs(T=23, HV=2, H=2, dtype=torch.float64, unit=True)
    want = naive_module.naive_recurrent_precond_kda(**x, output_final_state=True)
    ours = compat.fused_recurrent_precond_kda(
        **x, output_final_state=True, use_qk_l2norm_in_kernel=False
    )
    assert_same(list(ours), list(want), 1e-12, "fused_recurrent_precond_kda")
    ours = compat.chunk_precond_kda(**x, output_final_state=True)
    assert_same(list(ours), list(want), 2e-6, "chunk_precond_kda")


@pytest.mark.parametrize(
    "T,cu",
    [(1, None), pytest.param(23, [0, 1, 9, 23], marks=pytest.mark.slow)],
    ids=["T1", "varlen-length-1"],
)
def test_chunk_agrees_with_fla_kernels_with_gradients(T, cu):
    x = inputs(T=T, N=1 if cu is None else len(cu) - 1)
    kw = {"cu_seqlens": None if cu is None else torch.tensor(cu), "output_final_state": True}
    fixed = {n: x.pop(n) for n in ("initial_A_state", "log_atk_scale")}
    a, da = outputs_and_grads(lambda **t: compat.chunk_precond_kda(**t, **fixed, **kw), x)
    b, db = outputs_and_grads(lambda **t: chunk_module.chunk_precond_kda(**t, **fixed, **kw), x)
    assert_same(a, b, 5e-5, "chunk_precond_kda")
    for name in x:
        assert_same([da[name]], [db[name]], 5e-5, f"chunk_precond_kda d{name}")


@pytest.mark.slow
def test_chunk_in_kernel_gate_and_intermediate_states_agree_with_fla():
    x = inputs(T=20)
    gen = torch.Generator().manual_seed(3)
    H, K = 2, 16
    kw = {
        "use_gate_in_kernel": True, "A_log": torch.randn(H, generator=gen),
        "dt_bias": torch.randn(H * K, generator=gen), "output_final_state": True,
        "transpose_state_layout": True, "return_intermediate_states": True,
    }  # fmt: skip
    x["g"] = torch.randn(x["g"].shape, generator=gen)  # the gate's raw input
    x["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous()
    with torch.inference_mode():
        ours = compat.chunk_precond_kda(**x, **kw)
        theirs = chunk_module.chunk_precond_kda(**x, **kw)
    assert len(ours) == len(theirs) == 4
    assert_same(list(ours), list(theirs), 5e-5, "chunk_precond_kda (gate, h)")


@pytest.mark.parametrize(
    "options",
    [
        {"cu_seqlens": torch.tensor([0, 1, 9, 23])},
        {"gva": True, "transpose_state_layout": True},
        {"gate": True, "lower_bound": -3.0, "use_qk_l2norm_in_kernel": False},
        {"T": 1},
    ],
    ids=["varlen", "gva-transposed", "gate-lower-bound-no-l2norm", "T1"],
)
def test_fused_recurrent_agrees_with_fla_kernel(options):
    options = dict(options)
    cu = options.get("cu_seqlens")
    HV = 4 if options.pop("gva", False) else None
    T = options.pop("T", 23)
    x = inputs(T=T, HV=HV, N=1 if cu is None else len(cu) - 1)
    if HV is not None:  # fla's recurrent kernel: one ATK state per value head
        per_value_head = inputs(T=T, H=HV, seed=9)
        for name in ("g_atk", "beta_atk", "initial_A_state", "log_atk_scale"):
            x[name] = per_value_head[name]
    if options.pop("gate", False):
        gen = torch.Generator().manual_seed(5)
        HV_, K = x["v"].shape[2], x["q"].shape[3]
        options.update(
            use_gate_in_kernel=True, A_log=torch.randn(HV_, generator=gen),
            dt_bias=torch.randn(HV_ * K, generator=gen),
        )  # fmt: skip
    if options.get("transpose_state_layout"):
        x["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous()
    ours = compat.fused_recurrent_precond_kda(**x, **options, output_final_state=True)
    theirs = recurrent_module.fused_recurrent_precond_kda(**x, **options, output_final_state=True)
    assert_same(list(ours), list(theirs), 5e-5, "fused_recurrent_precond_kda")


def test_fla_s_checks():
    x = inputs(T=9)
    with pytest.raises(ValueError, match="lower_bound. must be in the safe range"):
        compat.chunk_precond_kda(
            **x, use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0, A_log=x["g"][0, 0, :, 0]
        )
    with pytest.raises(ValueError, match="A_log must be provided"):
        compat.chunk_precond_kda(**x, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="initial_state must be in float32"):
        compat.chunk_precond_kda(**{**x, "initial_state": x["initial_state"].half()})
    with pytest.raises(ValueError, match="no grouped value heads"):
        y = inputs(T=9, HV=4)
        compat.chunk_precond_kda(**{**y, "g": x["g"], "beta": x["beta"]})
    with pytest.raises(ValueError, match="only allowed in inference mode"):
        compat.chunk_precond_kda(**x, return_intermediate_states=True)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV, K\]"):
        compat.fused_recurrent_precond_kda(**{**x, "g": x["g"][..., 0]})
