"""compat's entry points of the new rules on packed sequences with empty pieces, and their
refusals of bad arguments: each before any conversion, naming the argument in fla's words."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn import compat

T, H, K, V = 6, 2, 4, 3


def _inputs(T: int = T, N: int = 3, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    def unif(*shape):
        return torch.rand(*shape, generator=gen)

    def unit(*shape):
        return F.normalize(rand(*shape), dim=-1)

    a = -unit(1, T, H, K)
    return dict(
        q=rand(1, T, H, K), k=unit(1, T, H, K), v=rand(1, T, H, V), g=-unif(1, T, H),
        gk=-unif(1, T, H, K), beta=unif(1, T, H), a=a, b=-0.5 * a, u=rand(H, K),
        p=unit(1, T, H, K), erase=unif(1, T, H, K), write=unif(1, T, H, V),
        kd=unit(1, 2 * T, H, K), vd=rand(1, 2 * T, H, V), betad=unif(1, 2 * T, H),
        h0=rand(N, H, K, V),
    )  # fmt: skip


# fla's names of the new rules' entry points, each with ``_inputs``' tensors in its positional
# order (fla's: RWKV-7's r, w, k, v, a, b; Comba's recurrent q, k, p, v).
POSITIONAL = {
    "chunk_dplr_delta_rule": ("q", "k", "v", "a", "b", "gk"),
    "fused_recurrent_dplr_delta_rule": ("q", "k", "v", "a", "b", "gk"),
    "chunk_iplr_delta_rule": ("q", "k", "v", "a", "b"),
    "chunk_rwkv7": ("q", "gk", "k", "v", "a", "b"),
    "fused_recurrent_rwkv7": ("q", "gk", "k", "v", "a", "b"),
    "chunk_rwkv6": ("q", "k", "v", "gk", "u"),
    "fused_recurrent_rwkv6": ("q", "k", "v", "gk", "u"),
    "chunk_comba": ("q", "k", "v", "p", "g", "beta"),
    "fused_recurrent_comba": ("q", "k", "p", "v", "g", "beta"),
    "chunk_gdn2": ("q", "k", "v", "gk", "erase", "write"),
    "fused_recurrent_gdn2": ("q", "k", "v", "gk", "erase", "write"),
    "chunk_gated_delta_product": ("q", "kd", "vd", "g", "betad"),
}


def _call(name: str):
    fn = getattr(compat, name)
    extra = {"num_householder": 2} if name == "chunk_gated_delta_product" else {}

    def call(x: dict, **kw):
        return fn(*(x[n] for n in POSITIONAL[name]), **extra, **kw)

    return call


CALLS = {name: _call(name) for name in POSITIONAL}


@pytest.mark.parametrize("name", CALLS)
def test_empty_pieces(name):
    """cu_seqlens [0, 2, 2, 6] as fla takes it: the empty sequence's final state is its initial
    state, the others' outputs and states as with cu_seqlens [0, 2, 6]."""
    x = _inputs()
    call = CALLS[name]
    o, S = call(x, initial_state=x["h0"], output_final_state=True,
                cu_seqlens=torch.tensor([0, 2, 2, 6]))  # fmt: skip
    torch.testing.assert_close(S[1], x["h0"][1], rtol=0, atol=0)
    o2, S2 = call(x, initial_state=x["h0"][[0, 2]], output_final_state=True,
                  cu_seqlens=torch.tensor([0, 2, 6]))  # fmt: skip
    torch.testing.assert_close(o, o2, rtol=0, atol=0)
    torch.testing.assert_close(S[[0, 2]], S2, rtol=0, atol=0)


def test_empty_pieces_with_intermediate_states():
    x = _inputs()
    with torch.inference_mode():
        o, S, h = compat.chunk_gdn2(
            x["q"], x["k"], x["v"], x["gk"], x["erase"], x["write"], output_final_state=True,
            cu_seqlens=torch.tensor([0, 2, 2, 6]), return_intermediate_states=True,
        )  # fmt: skip
    assert o.shape == (1, T, H, V) and h.shape[1] == 2  # one chunk of each non-empty sequence
    torch.testing.assert_close(S[1], torch.zeros(H, K, V), rtol=0, atol=0)


def _refuses(error, match, call, x, **kw):
    with pytest.raises(error, match=match):
        call(x, **kw)


def test_the_issue_s_examples_are_refused_by_name():
    x = _inputs(N=1)
    B = 1
    _refuses(TypeError, "initial_state must be a floating-point tensor", CALLS["chunk_rwkv7"], x,
             initial_state=torch.ones(B, H, K, V, dtype=torch.int64))  # fmt: skip
    _refuses(TypeError, "initial_state must be a torch.Tensor, got list", CALLS["chunk_rwkv7"], x,
             initial_state=[[0.0]])  # fmt: skip
    bad = dict(x, beta=torch.rand(1, 1, T, 2))
    _refuses(ValueError, "beta must have shape", CALLS["chunk_comba"], bad)
    bad = dict(x, gk=x["gk"].tolist())  # chunk_gdn2's g
    _refuses(TypeError, "g must be a torch.Tensor, got list", CALLS["chunk_gdn2"], bad)


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_states_of_other_dtypes_are_refused_not_cast(name, dtype):
    x = _inputs(N=1)
    _refuses(TypeError, "initial_state", CALLS[name], x, initial_state=x["h0"].to(dtype))


@pytest.mark.parametrize("name", CALLS)
def test_lists_and_ranks_are_refused_by_name(name):
    x = _inputs(N=1)
    _refuses(TypeError, "initial_state must be a torch.Tensor", CALLS[name], x,
             initial_state=x["h0"].tolist())  # fmt: skip
    _refuses(ValueError, "initial_state must have shape", CALLS[name], x,
             initial_state=x["h0"][0])  # fmt: skip
    _refuses(TypeError, "cu_seqlens must be a torch.Tensor", CALLS[name], x, cu_seqlens=[0, T])
    _refuses(ValueError, "cu_seqlens must be non-decreasing", CALLS[name], x,
             cu_seqlens=torch.tensor([0, 4, 2, T]))  # fmt: skip


@pytest.mark.parametrize(
    "name,arg,error,match",
    [
        ("chunk_rwkv7", "gk", ValueError, "w is a log-decay"),  # RWKV-7's w
        ("fused_recurrent_rwkv7", "gk", ValueError, "w is a log-decay"),
        ("chunk_rwkv6", "gk", ValueError, "w is a log-decay"),  # RWKV-6's w
        ("fused_recurrent_rwkv6", "gk", ValueError, "w is a log-decay"),
        ("chunk_dplr_delta_rule", "gk", ValueError, "gk is a log-decay"),
    ],
)
def test_gate_errors_use_the_user_s_name(name, arg, error, match):
    x = _inputs(N=1)
    bad = dict(x, **{arg: -x[arg]})
    _refuses(error, match, CALLS[name], bad)
    bad = dict(x, **{arg: x[arg] * torch.nan})
    _refuses(error, match.split(" ")[0] + " contains NaN", CALLS[name], bad)


@pytest.mark.parametrize("name", ["chunk_rwkv7", "fused_recurrent_rwkv7", "chunk_rwkv6"])
def test_rwkv_s_receptance_is_named_r(name):
    x = _inputs(N=1)
    q = x["q"].clone()
    q[0, 1, 0, 0] = torch.nan
    _refuses(ValueError, "r contains non-finite", CALLS[name], dict(x, q=q))
    _refuses(TypeError, "r must be a torch.Tensor", CALLS[name], dict(x, q=None))


@pytest.mark.parametrize("name", ["chunk_comba", "fused_recurrent_comba"])
def test_comba_s_beta_is_named_and_range_checked(name):
    x = _inputs(N=1)
    beta = x["beta"].clone()
    beta[0, 2, 1] = torch.nan
    _refuses(ValueError, "beta contains non-finite", CALLS[name], dict(x, beta=beta))
    for bad in (5.0, -3.0):  # as the delta rule's (Comba with p = k, no gate)
        _refuses(ValueError, r"beta must lie in \[0, 2\]", CALLS[name],
                 dict(x, beta=torch.full_like(x["beta"], bad)))  # fmt: skip
    o, _ = CALLS[name](dict(x, beta=x["beta"].double()))  # promoted, as fla's conventions do
    assert o.dtype == torch.float32
