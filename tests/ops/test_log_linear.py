"""Log-linear Mamba-2 (``linattn.ops.log_linear``): the parallel, chunk and recurrent forms and the
decoding step against the float64 reference (``linattn.reference.log_linear``), packed sequences,
continued states, grouped heads, gradients and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.ops.log_linear import (
    LogLinearState,
    empty_state,
    log_linear_attention,
    log_linear_state,
    log_linear_step,
)
from linattn.reference import log_linear as R

FORMS = [("parallel", 64), ("recurrent", 64), ("chunk", 1), ("chunk", 4), ("chunk", 16),
         ("chunk", 64)]  # fmt: skip


def draws(B=2, T=37, H=2, K=4, V=3, L=8, seed=0, dtype=torch.float64, HV=None):
    gen = torch.Generator().manual_seed(seed)
    HV = HV or H

    def rn(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)

    g = -torch.rand(B, T, HV, generator=gen, dtype=torch.float64).to(dtype)
    return rn(B, T, H, K), rn(B, T, H, K), rn(B, T, HV, V), g, rn(B, T, HV, L)


def start(B, p, n, H, K, V, seed=1):
    """Level states at position p: random on the occupied levels, zero on the others."""
    S = torch.randn(
        B, n, H, K, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    for j in range(n):
        if not (p >> j) & 1:
            S[:, j] = 0
    return LogLinearState(S, torch.full((B,), p))


def oracle(q, k, v, g, lam, scale, state=None, beta=None):
    B, T, HV, V = v.shape
    rep = HV // q.shape[2]
    O = np.zeros((B, T, HV, V))
    finals = []
    for b in range(B):
        heads = []
        for h in range(HV):
            S0 = None if state is None else state.S[b, :, h].numpy()
            p = 0 if state is None else int(state.offset[b])
            O[b, :, h], S = R.recurrence(
                q[b, :, h // rep].double().numpy(), k[b, :, h // rep].double().numpy(),
                v[b, :, h].double().numpy(), g[b, :, h].double().numpy(),
                lam[b, :, h].double().numpy(), scale=scale, initial_state=S0, offset=p,
                beta=None if beta is None else beta[b, :, h].double().numpy(),
            )  # fmt: skip
            heads.append(np.stack(S))
        finals.append(np.stack(heads, 1))
    return torch.from_numpy(O), finals


def betas(B=2, T=37, H=2, seed=7):
    """Gated DeltaNet's write strengths in [0, 2] (with unit keys: contractions)."""
    return 2 * torch.rand(
        B, T, H, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def unit(k):
    return torch.nn.functional.normalize(k, dim=-1)


@pytest.mark.parametrize(("mode", "C"), FORMS)
@pytest.mark.parametrize("p", [0, 13, 64])
@pytest.mark.parametrize("base", ["mamba2", "gated_deltanet"])
def test_every_form_equals_the_reference_in_float64(mode, C, p, base):
    q, k, v, g, lam = draws()
    beta = None
    if base == "gated_deltanet":
        k, beta = unit(k), betas()
    state = None if p == 0 else start(2, p, 5 if p == 13 else 7, 2, 4, 3)
    o_ref, S_ref = oracle(q, k, v, g, lam, 0.3, state, beta)
    o, final = log_linear_attention(q, k, v, g, lam, scale=0.3, mode=mode, chunk_size=C,
                                    initial_state=state, output_final_state=True,
                                    beta=beta)  # fmt: skip
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    for b in range(2):
        n = S_ref[b].shape[0]
        torch.testing.assert_close(final.S[b, :n], torch.from_numpy(S_ref[b]), rtol=0, atol=1e-12)
        assert not final.S[b, n:].any()
    assert final.offset.tolist() == [p + 37] * 2


@pytest.mark.parametrize(("mode", "C"), FORMS)
def test_one_token_and_grouped_heads(mode, C):
    q, k, v, g, lam = draws(B=1, T=1, H=1, HV=2)
    o, _ = log_linear_attention(q, k, v, g, lam, scale=0.5, mode=mode, chunk_size=C)
    torch.testing.assert_close(o, oracle(q, k, v, g, lam, 0.5)[0], rtol=0, atol=1e-12)
    q, k, v, g, lam = draws(B=1, T=23, H=1, HV=2, L=3)  # L = 3: the levels >= 3 weigh 0
    o, _ = log_linear_attention(q, k, v, g, lam, scale=0.5, mode=mode, chunk_size=C)
    torch.testing.assert_close(o, oracle(q, k, v, g, lam, 0.5)[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mode", "C"), [("parallel", 64), ("recurrent", 64), ("chunk", 8)])
@pytest.mark.parametrize("delta", [False, True])
def test_packed_sequences_equal_the_sequences_one_by_one(mode, C, delta):
    q, k, v, g, lam = draws(B=1, T=30)
    beta = betas(B=1, T=30) if delta else None
    k = unit(k) if delta else k
    cu = torch.tensor([0, 1, 12, 12, 30])
    offsets = [0, 5, 3, 70]
    S0 = torch.cat([start(1, p, 7, 2, 4, 3, seed=i).S for i, p in enumerate(offsets)])
    state = LogLinearState(S0, torch.tensor(offsets))
    o, final = log_linear_attention(q, k, v, g, lam, mode=mode, chunk_size=C, cu_seqlens=cu,
                                    initial_state=state, output_final_state=True,
                                    beta=beta)  # fmt: skip
    for n in range(4):
        a, b = int(cu[n]), int(cu[n + 1])
        one = LogLinearState(S0[n : n + 1], torch.tensor([offsets[n]]))
        piece = (x[:, a:b] for x in (q, k, v, g, lam))
        b_n = None if beta is None else beta[:, a:b]
        o_n, f_n = log_linear_attention(*piece, mode=mode, chunk_size=C, initial_state=one,
                                        output_final_state=True, beta=b_n)  # fmt: skip
        torch.testing.assert_close(o[:, a:b], o_n, rtol=0, atol=1e-12)
        m = f_n.S.shape[1]
        torch.testing.assert_close(final.S[n : n + 1, :m], f_n.S, rtol=0, atol=1e-12)
        assert int(final.offset[n]) == offsets[n] + b - a
    o_ref, _ = oracle(q[:, 12:30], k[:, 12:30], v[:, 12:30], g[:, 12:30], lam[:, 12:30], 4**-0.5,
                      LogLinearState(S0[3:4], torch.tensor([70])),
                      None if beta is None else beta[:, 12:30])  # fmt: skip
    torch.testing.assert_close(o[:, 12:30], o_ref, rtol=0, atol=1e-12)


def test_rows_at_different_positions():
    q, k, v, g, lam = draws(B=3, T=20)
    S = torch.cat([start(1, p, 6, 2, 4, 3, seed=p).S for p in (0, 7, 33)])
    state = LogLinearState(S, torch.tensor([0, 7, 33]))
    o_ref, _ = oracle(q, k, v, g, lam, 0.3, state)
    for mode, C in FORMS:
        o, _ = log_linear_attention(q, k, v, g, lam, scale=0.3, mode=mode, chunk_size=C,
                                    initial_state=state)  # fmt: skip
        torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("delta", [False, True])
def test_prefill_then_decoding_steps_equal_the_whole_sequence(delta):
    q, k, v, g, lam = draws(B=2, T=40, H=1, HV=2)
    beta = betas(B=2, T=40, H=2) if delta else None
    k = unit(k) if delta else k
    whole, final = log_linear_attention(q, k, v, g, lam, output_final_state=True, beta=beta)
    o, state = log_linear_attention(*(x[:, :9] for x in (q, k, v, g, lam)), output_final_state=True,
                                    beta=None if beta is None else beta[:, :9])  # fmt: skip
    outs = [o]
    for t in range(9, 40):
        b_t = None if beta is None else beta[:, t]
        o_t, state = log_linear_step(state, q[:, t], k[:, t], v[:, t], g[:, t], lam[:, t], beta=b_t)
        outs.append(o_t[:, None])
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(state.S[:, : final.S.shape[1]], final.S, rtol=0, atol=1e-12)
    assert state.offset.tolist() == [40, 40]
    # From an empty state: the state grows a level when the position needs one.
    state = empty_state(2, 2, 4, 3, dtype=torch.float64)
    for t in range(40):
        b_t = None if beta is None else beta[:, t]
        o_t, state = log_linear_step(state, q[:, t], k[:, t], v[:, t], g[:, t], lam[:, t], beta=b_t)
        torch.testing.assert_close(o_t, whole[:, t], rtol=0, atol=1e-12)
    assert state.S.shape[1] == 6


def _grads(mode, C, x, state, beta=None):
    extra = () if beta is None else (beta,)
    leaves = [t.clone().requires_grad_(True) for t in (*x, state.S, *extra)]
    st = LogLinearState(leaves[5], state.offset)
    o, final = log_linear_attention(*leaves[:5], mode=mode, chunk_size=C, initial_state=st,
                                    output_final_state=True,
                                    beta=leaves[6] if extra else None)  # fmt: skip
    w = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
    ((o * w).sum() + final.S.square().sum()).backward()
    return [t.grad for t in leaves]


def test_gradients_agree_across_forms_and_pass_gradcheck():
    x = draws(B=1, T=21, H=1, K=3, V=2, L=6)
    state = start(1, 11, 4, 1, 3, 2)
    for beta in (None, betas(B=1, T=21, H=1)):
        if beta is not None:
            x = (x[0], unit(x[1]), *x[2:])
        ref = _grads("recurrent", 64, x, state, beta)
        for mode, C in [("parallel", 64), ("chunk", 4), ("chunk", 8)]:
            for a, b in zip(_grads(mode, C, x, state, beta), ref, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    small = [t[:, :9].clone().requires_grad_(True) for t in draws(B=1, T=9, H=1, K=2, V=2, L=5)]
    S0 = start(1, 3, 3, 1, 2, 2).S.requires_grad_(True)

    def f(q, k, v, g, lam, S):
        st = LogLinearState(S, torch.tensor([3]))
        o, fin = log_linear_attention(q, k, v, g, lam, mode="chunk", chunk_size=4,
                                      initial_state=st, output_final_state=True)  # fmt: skip
        return o, fin.S

    assert torch.autograd.gradcheck(f, (*small, S0))


@pytest.mark.parametrize(("mode", "C"), [("parallel", 64), ("recurrent", 64), ("chunk", 16)])
def test_float32_is_near_float64(mode, C):
    x = draws(B=1, T=100, L=8)
    o64, _ = log_linear_attention(*x, mode=mode, chunk_size=C)
    o32, _ = log_linear_attention(*(t.float() for t in x), mode=mode, chunk_size=C)
    assert o32.dtype == torch.float32
    rms = ((o32.double() - o64).norm() / o64.norm()).item()
    assert rms < 1e-6, rms  # measured about 1e-7


def test_bad_input_is_named_before_any_work():
    q, k, v, g, lam = draws(B=1, T=5)
    with pytest.raises(ValueError, match="level_scales must have shape"):
        log_linear_attention(q, k, v, g, lam[:, :4])
    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        log_linear_attention(q, k, v, g, lam, chunk_size=12)
    with pytest.raises(ValueError, match="mode must be one of"):
        log_linear_attention(q, k, v, g, lam, mode="scan")
    with pytest.raises(ValueError, match="g is a log-decay"):
        log_linear_attention(q, k, v, -g, lam)
    with pytest.raises(ValueError, match="g must"):
        log_linear_attention(q, k, v, g[..., None].expand(1, 5, 2, 4), lam)
    with pytest.raises(TypeError, match="initial_state must be a LogLinearState"):
        log_linear_attention(q, k, v, g, lam, initial_state=torch.zeros(1, 2, 4, 3))
    with pytest.raises(ValueError, match="initial_state.S must have shape"):
        log_linear_attention(q, k, v, g, lam, initial_state=empty_state(2, 2, 4, 3))
    with pytest.raises(ValueError, match="initial_state.offset must be >= 0"):
        log_linear_attention(q, k, v, g, lam, initial_state=LogLinearState(
            torch.zeros(1, 2, 2, 4, 3, dtype=torch.float64), torch.tensor([-1])))  # fmt: skip
    with pytest.raises(ValueError, match="cu_seqlens"):
        log_linear_attention(q, k, v, g, lam, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="beta must lie in"):
        log_linear_attention(q, k, v, g, lam, beta=3 + torch.zeros(1, 5, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="beta must have shape"):
        log_linear_attention(q, k, v, g, lam, beta=torch.zeros(1, 5, 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="state must be a LogLinearState"):
        log_linear_step(None, q[:, 0], k[:, 0], v[:, 0], g[:, 0], lam[:, 0])


def test_the_state_alone_equals_the_op_s_final_state():
    q, k, v, g, lam = draws(B=1, T=30)
    cu = torch.tensor([0, 1, 12, 30])
    offsets = [0, 5, 70]
    S0 = torch.cat([start(1, p, 7, 2, 4, 3, seed=i).S for i, p in enumerate(offsets)])
    state = LogLinearState(S0, torch.tensor(offsets))
    _, final = log_linear_attention(q, k, v, g, lam, cu_seqlens=cu, initial_state=state,
                                    output_final_state=True)  # fmt: skip
    alone = log_linear_state(k, v, g, levels=7, initial_state=state, cu_seqlens=cu)
    torch.testing.assert_close(alone.S, final.S, rtol=0, atol=1e-12)
    assert alone.offset.tolist() == final.offset.tolist() == [1, 16, 88]
