"""compat.chunk_precond_gated_delta_rule / fused_recurrent_precond_gated_delta_rule vs fla 0.6.0:
fla's naive token loop in float64 (its float32 casts promoted), and its Triton
kernels under triton's interpreter in float32 (T = 1, T not a multiple of fla's chunk of 64,
packed sequences with a length-1 piece, initial states of both kinds, grouped value heads), with
the chunk kernel's gradients.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tests.fla_interpreter")
chunk_module = pytest.importorskip("fla.ops.precond_gated_delta_rule.chunk")
recurrent_module = pytest.importorskip("fla.ops.precond_gated_delta_rule.fused_recurrent")
naive_module = pytest.importorskip("fla.ops.precond_gated_delta_rule.naive")

from linattn import compat  # noqa: E402

from .helpers import Promoted, assert_same, outputs_and_grads  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def inputs(T=20, H=1, HV=2, K=16, V=8, N=1, dtype=torch.float32, seed=0, unit=False):
    """fla's recipe (its layer's ranges): q, k ~ N(0, 1) (unit with ``unit``), g, g_atk =
    logsigmoid, beta, beta_atk ~ U(0, 1); one state of each kind per sequence."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    q, k = randn(1, T, H, K), randn(1, T, H, K)
    if unit:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    x = {
        "q": q, "k": k, "v": randn(1, T, HV, V), "g_atk": F.logsigmoid(randn(1, T, H)),
        "g": F.logsigmoid(randn(1, T, HV)), "beta_atk": rand(1, T, H), "beta": rand(1, T, HV),
        "initial_state": randn(N, HV, K, V), "initial_A_state": rand(N, H, K),
        "log_atk_scale": randn(H),
    }  # fmt: skip
    return {name: t.to(dtype) for name, t in x.items()}


def test_agrees_with_fla_naive_in_float64(monkeypatch):
    """fla's naive loop always normalises q, k with F.normalize (the kernels: x / sqrt(|x|^2 +
    1e-6), with use_qk_l2norm_in_kernel): unit q, k make the two the same map."""
    monkeypatch.setattr(naive_module, "torch", Promoted())
    x = inputs(T=23, N=3, dtype=torch.float64, unit=True)
    cu = torch.tensor([0, 1, 9, 23])
    for entry in (compat.chunk_precond_gated_delta_rule,
                  compat.fused_recurrent_precond_gated_delta_rule):  # fmt: skip
        ours = entry(**x, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=False)
        want = naive_module.naive_recurrent_precond_gated_delta_rule(
            **x, output_final_state=True, cu_seqlens=cu
        )
        assert_same(list(ours), list(want), 1e-12, entry.__name__)


def fla_chunk(**t):
    return chunk_module.chunk_precond_gated_delta_rule(**t, output_final_state=True)


@pytest.mark.parametrize(
    "T,cu,HV",
    [(1, None, 1), (20, None, 2), pytest.param(23, [0, 1, 9, 23], 2, marks=pytest.mark.slow)],
    ids=["T1", "T20-gva", "varlen-length-1"],
)  # fmt: skip
def test_chunk_agrees_with_fla_kernels_with_gradients(T, cu, HV):
    x = inputs(T=T, HV=HV, N=1 if cu is None else len(cu) - 1)
    kw = {"cu_seqlens": None if cu is None else torch.tensor(cu)}
    leaves = {n: t for n, t in x.items() if n not in ("initial_A_state", "log_atk_scale")}
    fixed = {n: x[n] for n in ("initial_A_state", "log_atk_scale")}
    a, da = outputs_and_grads(
        lambda **t: compat.chunk_precond_gated_delta_rule(
            **t, **fixed, **kw, output_final_state=True
        ),
        leaves,
    )
    b, db = outputs_and_grads(lambda **t: fla_chunk(**t, **fixed, **kw), leaves)
    assert_same(a, b, 5e-5, "chunk_precond_gated_delta_rule")
    for name in leaves:
        assert_same([da[name]], [db[name]], 5e-5, f"chunk_precond_gated_delta_rule d{name}")


@pytest.mark.parametrize(
    "options",
    [
        {"cu_seqlens": torch.tensor([0, 1, 9, 23])},
        {"gk": True, "gv": True, "transpose_state_layout": True},
        {"beta_per_channel": True, "use_qk_l2norm_in_kernel": False, "g": None},
        {"T": 1},
    ],
    ids=["varlen", "gk-gv-transposed", "beta-per-channel-no-l2norm", "T1"],
)
def test_fused_recurrent_agrees_with_fla_kernel(options):
    options = dict(options)
    cu = options.get("cu_seqlens")
    T = options.pop("T", 23)
    x = inputs(T=T, N=1 if cu is None else len(cu) - 1)
    gen = torch.Generator().manual_seed(7)
    B, HV, K, V = 1, 2, 16, 8
    if options.pop("gk", False):
        x["gk"] = F.logsigmoid(torch.randn(B, T, HV, K, generator=gen))
    if options.pop("gv", False):
        x["gv"] = F.logsigmoid(torch.randn(B, T, HV, V, generator=gen))
    if options.pop("beta_per_channel", False):
        x["beta"] = torch.rand(B, T, HV, V, generator=gen)
    if "g" in options:
        x["g"] = options.pop("g")
    if options.get("transpose_state_layout"):
        x["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous()
    ours = compat.fused_recurrent_precond_gated_delta_rule(**x, **options, output_final_state=True)
    theirs = recurrent_module.fused_recurrent_precond_gated_delta_rule(
        **x, **options, output_final_state=True
    )
    assert_same(list(ours), list(theirs), 5e-5, "fused_recurrent_precond_gated_delta_rule")


def test_float_centre_and_no_final_state():
    x = inputs(T=9)
    x["log_atk_scale"] = -0.2
    o, S, A = compat.chunk_precond_gated_delta_rule(**x)
    assert S is None and A is None
    x["log_atk_scale"] = None
    o2, _, _ = compat.chunk_precond_gated_delta_rule(**x)
    torch.testing.assert_close(o, o2, rtol=0, atol=0)
    assert o.dtype == x["v"].dtype and o.shape == x["v"].shape


def test_bad_input_is_named_before_any_work():
    x = inputs(T=9)
    entry = compat.chunk_precond_gated_delta_rule
    with pytest.raises(ValueError, match=r"g_atk must have shape \[B, T, H\]"):
        entry(**{**x, "g_atk": x["g_atk"][..., None]})
    with pytest.raises(ValueError, match="beta_atk must be >= 0"):
        entry(**{**x, "beta_atk": -x["beta_atk"]})
    with pytest.raises(ValueError, match="g_atk is a log-decay"):
        entry(**{**x, "g_atk": -x["g_atk"]})
    with pytest.raises(ValueError, match="initial_A_state must have 3 dimensions"):
        entry(**{**x, "initial_A_state": x["initial_A_state"][0]})
    with pytest.raises(ValueError, match=r"log_atk_scale must have shape \[H\]"):
        entry(**{**x, "log_atk_scale": torch.zeros(3)})
    with pytest.raises(ValueError, match="x must be a finite number > 0"):
        entry(**x, x=0.0)
    with pytest.raises(NotImplementedError, match="cp_context"):
        entry(**x, cp_context=object())
    with pytest.raises(ValueError, match="g_atk must be given"):
        compat.fused_recurrent_precond_gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"])
