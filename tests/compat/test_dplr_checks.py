"""compat's generalized delta rule family: fla's checks (as ValueError, before any work) and
fla's output dtypes (o in q's or v's dtype, as each fla function allocates it)."""

from __future__ import annotations

import pytest
import torch

from linattn import compat

from .helpers import dplr_recipe


def _x(**kw):
    return dplr_recipe(T=8, **kw)


def _dplr(x):
    return x["q"], x["k"], x["v"], x["a"], x["b"], x["gk"]


def _gdn2(x):
    return x["q"], x["k"], x["v"], x["gk"], x["erase"], x["write"]


def test_dplr_checks():
    x = _x()
    with pytest.raises(ValueError, match="`lower_bound` must be negative"):
        compat.chunk_dplr_delta_rule(*_dplr(x), lower_bound=0.0)
    with pytest.raises(DeprecationWarning, match="head_first has been removed"):
        compat.chunk_dplr_delta_rule(*_dplr(x), head_first=False)
    with pytest.raises(NotImplementedError, match="cp_context"):
        compat.chunk_rwkv7(x["q"], x["gk"], x["k"], x["v"], x["a"], x["b"], cp_context=object())
    with pytest.raises(ValueError, match=r"a must have shape \[B, T, H, K\]"):  # fla's a
        compat.fused_recurrent_dplr_delta_rule(x["q"], x["k"], x["v"], x["a"][..., :3], x["b"],
                                               x["gk"])  # fmt: skip
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        compat.chunk_dplr_delta_rule(*_dplr(_x(B=2)), cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="number of initial states"):
        compat.fused_recurrent_rwkv7(
            x["q"], x["gk"], x["k"], x["v"], x["a"], x["b"], initial_state=x["h0"],
            cu_seqlens=torch.tensor([0, 3, 8]),
        )  # fmt: skip


def test_iplr_checks():
    x = _x()
    with pytest.raises(ValueError, match="`chunk_size` must be a power of 2, got 24"):
        compat.chunk_iplr_delta_rule(*_dplr(x)[:5], chunk_size=24)
    with pytest.raises(ValueError, match="scale must be positive"):
        compat.fused_recurrent_iplr_delta_rule(*_dplr(x)[:5], scale=-1.0)


def test_comba_checks():
    x = _x(H=2, HV=4)
    with pytest.raises(ValueError, match="q, k and p must have the same number of heads"):
        compat.chunk_comba(x["q"], x["k"], x["v"], x["p"][:, :, :1], x["g"], x["beta"])
    with pytest.raises(ValueError, match="For GVA"):
        compat.chunk_comba(x["q"], x["k"], x["v"][:, :, :3], x["p"], x["g"], x["beta"][..., :3])


def test_gdn2_checks():
    x = _x()
    with pytest.raises(ValueError, match="`chunk_size` must be 64 for GDN-2, got 32"):
        compat.chunk_gdn2(*_gdn2(x), chunk_size=32)
    with pytest.raises(ValueError, match="`A_log` must be provided"):
        compat.chunk_gdn2(*_gdn2(x), use_gate_in_kernel=True)
    with pytest.raises(ValueError, match=r"`lower_bound` must be in the safe range \[-5, 0\)"):
        compat.chunk_gdn2(*_gdn2(x), use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0)
    with pytest.raises(ValueError, match="initial_state must be in float32"):
        compat.chunk_gdn2(*_gdn2(x), initial_state=x["h0"].double())
    with pytest.raises(ValueError, match=r"b \(channel-wise erase gate\) must have shape"):
        compat.chunk_gdn2(*_gdn2(x)[:4], x["erase"][..., :3], x["write"])
    with pytest.raises(ValueError, match=r"w must have shape \[B, T, HV, V\]"):
        compat.fused_recurrent_gdn2(*_gdn2(x)[:5], x["write"][..., :3])
    with pytest.raises(ValueError, match="only allowed in inference mode"):
        compat.chunk_gdn2(*_gdn2(x), return_intermediate_states=True)


def test_output_dtypes_are_flas():
    """q, k in bfloat16 with v (and the rest) in float32: o in the dtype fla allocates it in;
    final states in float32."""
    x = _x()
    q, k = x["q"].bfloat16(), x["k"].bfloat16()
    v, a, b, gk, p, g, beta = (x[n] for n in ("v", "a", "b", "gk", "p", "g", "beta"))
    f32, bf16 = torch.float32, torch.bfloat16
    cases = {  # name: (arguments, fla's dtype of o)
        "chunk_dplr_delta_rule": ((q, k, v, a, b, gk), f32),
        "fused_recurrent_dplr_delta_rule": ((q, k, v, a, b, gk), f32),
        "chunk_iplr_delta_rule": ((q, k, v, a, b), bf16),
        "fused_recurrent_iplr_delta_rule": ((q, k, v, a, b), f32),
        "chunk_comba": ((q, k, v, p, g, beta), bf16),
        "fused_recurrent_comba": ((q, k, p, v, g, beta), bf16),
        "chunk_gdn2": ((q, k, v, *_gdn2(x)[3:]), bf16),
        "fused_recurrent_gdn2": ((q, k, v, *_gdn2(x)[3:]), f32),
    }
    for name, (args, dtype) in cases.items():
        o, S = getattr(compat, name)(*args, output_final_state=True)
        assert o.dtype == dtype, name
        assert S.dtype == torch.float32, name


@pytest.mark.parametrize(
    "name",
    ["chunk_dplr_delta_rule", "fused_recurrent_iplr_delta_rule", "chunk_comba", "chunk_gdn2"],
)
def test_malformed_q_k_v_are_refused_naming_them(name):
    """A list, an integer tensor (which promotion would cast silently) or a rank-3 v (chunk_gdn2
    names w first, as fla's asserts do)."""
    x = _x()
    rest = {
        "chunk_dplr_delta_rule": (x["a"], x["b"], x["gk"]),
        "fused_recurrent_iplr_delta_rule": (x["a"], x["b"]),
        "chunk_comba": (x["p"], x["g"], x["beta"]),
        "chunk_gdn2": _gdn2(x)[3:],
    }[name]
    fn = getattr(compat, name)
    with pytest.raises(TypeError, match="^q must be a torch.Tensor, got list"):
        fn(x["q"].tolist(), x["k"], x["v"], *rest)
    with pytest.raises(TypeError, match="^k must be a floating-point tensor, got torch.int64"):
        fn(x["q"], x["k"].long(), x["v"], *rest)
    with pytest.raises(ValueError, match=r"v must|matching v"):  # chunk_gdn2: fla's order
        fn(x["q"], x["k"], x["v"][..., 0], *rest)
