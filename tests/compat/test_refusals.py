"""compat checks every argument's type, rank, shape and dtype before reading shapes or
broadcasting: one test per finding of the issue, each of which failed before
(an IndexError, a broadcast or reshape RuntimeError, an AttributeError, or a silent result).
"""

from __future__ import annotations

import pytest
import torch

from linattn import compat

B, T, H, K, V = 2, 5, 2, 4, 3


def _qkv(heads: int = H) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, heads, K, generator=gen) for _ in range(2))
    return q, k, torch.randn(B, T, heads, V, generator=gen)


def _beta() -> torch.Tensor:
    return torch.rand(B, T, H)


def _g() -> torch.Tensor:
    return -torch.rand(B, T, H)


def _gk() -> torch.Tensor:
    return -torch.rand(B, T, H, K)


# Each entry point with the arguments of a valid call, after q, k, v.
RANK3 = {
    "chunk_gated_delta_rule": lambda: dict(g=_g(), beta=_beta()),
    "chunk_gla": lambda: dict(g=_gk()),
    "chunk_delta_rule": lambda: dict(beta=_beta()),
    "chunk_simple_gla": lambda: dict(g=_g()),
    "chunk_linear_attn": lambda: {},
    "chunk_kda": lambda: dict(g=_gk(), beta=_beta()),
    "fused_recurrent_gla": lambda: dict(gk=_gk()),
    "fused_recurrent_delta_rule": lambda: dict(beta=_beta()),
    "chunk_retention": lambda: {},
}


@pytest.mark.parametrize("name", sorted(RANK3))
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_rank_3_inputs_are_refused_naming_them(name, which):
    # Before: IndexError (v.shape[3] in _core.run) or an error from deep inside the op.
    x = dict(zip("qkv", _qkv(), strict=True))
    x[which] = x[which][..., 0]
    with pytest.raises(ValueError, match=rf"^{which}( and k)? must have"):
        getattr(compat, name)(x["q"], x["k"], x["v"], **RANK3[name]())


@pytest.mark.parametrize("name", sorted(RANK3))
def test_q_as_a_list_is_a_type_error(name):
    # Before: AttributeError ('list' object has no attribute 'shape').
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="^q must be a torch.Tensor, got list"):
        getattr(compat, name)(q.tolist(), k, v, **RANK3[name]())


@pytest.mark.parametrize("name", sorted(RANK3))
def test_an_integer_q_is_refused(name):
    # Before: silently cast to float (the ops raise TypeError for integer tensors).
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="^q must be a floating-point tensor, got torch.int64"):
        getattr(compat, name)(q.long(), k, v, **RANK3[name]())


def test_gk_per_head_is_refused_by_the_recurrent_gated_delta_rule():
    # Before: a broadcast RuntimeError from g + gk.
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^gk must have shape \[B, T, HV, K\] = \(2, 5, 2, 4\)"):
        compat.fused_recurrent_gated_delta_rule(q, k, v, g=_g(), gk=_g(), beta=_beta())


@pytest.mark.parametrize("width", [1, V + 1])
def test_gv_of_another_width_than_v_is_refused(width):
    q, k, v = _qkv()
    gv = -torch.rand(B, T, H, width)
    with pytest.raises(ValueError, match=r"^gv must have shape \[B, T, HV, V\] = \(2, 5, 2, 3\)"):
        compat.fused_recurrent_gated_delta_rule(q, k, v, gv=gv, beta=_beta())
    with pytest.raises(ValueError, match=r"^gv must have shape \[B, T, HV, V\] = \(2, 5, 2, 3\)"):
        compat.fused_recurrent_gla(q, k, v, gv=gv)


def test_a_per_channel_beta_of_another_width_than_v_is_refused():
    q, k, v = _qkv()
    beta = torch.rand(B, T, H, V + 1)
    with pytest.raises(ValueError, match=r"^beta must have shape \[B, T, HV\] = \(2, 5, 2\) or"):
        compat.fused_recurrent_gated_delta_rule(q, k, v, beta=beta)
    with pytest.raises(ValueError, match=r"^beta must have shape \[B, T, HV\] = \(2, 5, 2\) or"):
        compat.fused_recurrent_delta_rule(q, k, v, beta=beta)


@pytest.mark.parametrize("name", ["A_log", "dt_bias"])
@pytest.mark.parametrize("entry", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
def test_gdn_gate_parameters_of_the_wrong_length_are_refused(name, entry):
    # Before: a broadcast RuntimeError inside the gate.
    q, k, v = _qkv()
    params = {"A_log": torch.zeros(H), "dt_bias": torch.zeros(H), name: torch.zeros(H + 1)}
    with pytest.raises(ValueError, match=rf"^{name} must have shape \[HV\] = \(2,\)"):
        getattr(compat, entry)(q, k, v, g=_g(), beta=_beta(), use_gate_in_kernel=True, **params)


@pytest.mark.parametrize("name", ["A_log", "dt_bias"])
def test_kda_gate_parameters_of_the_wrong_length_are_refused(name):
    # Before: a reshape RuntimeError.
    q, k, v = _qkv()
    params = {"A_log": torch.zeros(H), "dt_bias": torch.zeros(H * K), name: torch.zeros(3)}
    with pytest.raises(ValueError, match=rf"^{name} must hold"):
        compat.chunk_kda(q, k, v, _gk(), _beta(), use_gate_in_kernel=True, **params)


def test_a_gate_of_size_one_dimensions_is_not_broadcast():
    # Before: gk [1, T, 1, K] silently broadcast over B = 2 and H = 2.
    q, k, v = _qkv()
    gk = -torch.rand(1, T, 1, K)
    with pytest.raises(ValueError, match=r"^gk must have shape \[B, T, HV, K\]"):
        compat.fused_recurrent_gated_delta_rule(q, k, v, gk=gk, beta=_beta())
    with pytest.raises(ValueError, match=r"^gk must have shape \[B, T, HV, K\]"):
        compat.fused_recurrent_gla(q, k, v, gk=gk)


def test_fused_recurrent_gla_refuses_a_gate_per_head():
    # Before: gk [B, T, H] taken as a scalar decay; fla's gk is per key channel.
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^gk must have shape \[B, T, HV, K\]"):
        compat.fused_recurrent_gla(q, k, v, gk=_g())


def test_hgrn_checks_x_and_g():
    x = torch.randn(B, T, 3)
    with pytest.raises(ValueError, match=r"^g must have shape \[B, T, D\] as x"):
        compat.fused_recurrent_hgrn(x, -torch.rand(B, T, 1))
    with pytest.raises(TypeError, match="^x must be a floating-point tensor"):
        compat.fused_recurrent_hgrn(x.long(), -torch.rand(B, T, 3))
