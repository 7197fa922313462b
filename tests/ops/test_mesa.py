"""MesaNet's op (linattn.ops.mesa) against its exact-solve float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from linattn.ops.mesa import conjugate_gradient, mesa_net, mesa_net_step
from linattn.reference.mesa import mesa_net as reference


def _inputs(B=2, T=21, H=2, K=6, V=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen, dtype=torch.float64),
        "g": F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64) + 2),
        "beta": torch.rand(B, T, H, generator=gen, dtype=torch.float64),
        "lamb": torch.rand(H, K, generator=gen, dtype=torch.float64) + 0.25,
    }
    root = torch.randn(B, H, K, K, generator=gen, dtype=torch.float64) / K
    states = {"h_kk_init": root @ root.transpose(-1, -2),
              "h_kv_init": torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)}  # fmt: skip
    return {n: t.to(dtype) for n, t in x.items()}, {n: t.to(dtype) for n, t in states.items()}


def _oracle(x, s):
    B, T, H, _ = x["q"].shape
    o = np.zeros((B, T, H, x["v"].shape[-1]))
    for b in range(B):
        for h in range(H):
            o[b, :, h] = reference(
                *(x[n][b, :, h].double().numpy() for n in ("q", "k", "v", "g", "beta")),
                x["lamb"][h].double().numpy(), s["h_kk_init"][b, h].double().numpy(),
                s["h_kv_init"][b, h].double().numpy(),
            )[0]  # fmt: skip
    return torch.from_numpy(o)


@pytest.mark.parametrize("mode", ["chunk", "recurrent", "parallel"])
def test_k_cg_iterations_reach_the_exact_solve_and_fewer_do_not(mode):
    x, s = _inputs()
    K = x["q"].shape[-1]
    want = _oracle(x, s)
    o, *_ = mesa_net(**x, **s, mode=mode, chunk_size=8, max_cg_iterations=K, cg_eps=0.0)
    torch.testing.assert_close(o, want, rtol=0, atol=1e-12)
    o, *_ = mesa_net(**x, **s, mode=mode, chunk_size=8, max_cg_iterations=K // 2, cg_eps=0.0)
    assert (o - want).abs().max() > 1e-8


def test_fla_s_guard_stalls_the_solve_and_cg_tol_stops_early():
    x, s = _inputs()
    want = _oracle(x, s)
    o, *_ = mesa_net(**x, **s, max_cg_iterations=30)  # fla's defaults: eps 1e-5
    error = (o - want).abs().max()
    assert 1e-8 < error < 1e-1, error
    b = torch.randn(5, 4, dtype=torch.float64)
    A = torch.eye(4, dtype=torch.float64) * 2
    calls = []

    def matvec(p):
        calls.append(1)
        return p @ A

    x1 = conjugate_gradient(matvec, b, 50, tol=1e-10, eps=0.0)
    torch.testing.assert_close(x1, b / 2, rtol=0, atol=1e-14)
    assert len(calls) <= 3  # a multiple of I: one step, then every residual is 0


def test_gradients_are_the_implicit_ones_and_pass_gradcheck():
    x, s = _inputs(B=1, T=7, H=1, K=3, V=2)
    leaves = {n: t.clone().requires_grad_(True) for n, t in {**x, **s}.items()}

    def fn(*ts):
        kw = dict(zip(leaves, ts, strict=False))
        o, h_kk, h_kv = mesa_net(**kw, chunk_size=4, output_final_state=True,
                                 max_cg_iterations=12, cg_eps=0.0)  # fmt: skip
        return o, h_kk, h_kv

    assert torch.autograd.gradcheck(fn, tuple(leaves.values()))


def test_packed_sequences_equal_the_sequences_one_by_one():
    x, s = _inputs(B=1, T=13, H=2, K=4, V=3)
    cu = torch.tensor([0, 1, 9, 13])
    s2 = {n: torch.cat([t] * 3) for n, t in s.items()}
    o, h_kk, h_kv = mesa_net(**x, **s2, cu_seqlens=cu, chunk_size=4, output_final_state=True,
                             max_cg_iterations=8, cg_eps=0.0)  # fmt: skip
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=False)):
        part = {k: t[:, a:b] if t.dim() == 4 or k in ("g", "beta") else t for k, t in x.items()}
        o1, k1, v1 = mesa_net(**part, **s, output_final_state=True, max_cg_iterations=8,
                              cg_eps=0.0, mode="recurrent")  # fmt: skip
        torch.testing.assert_close(o[:, a:b], o1, rtol=0, atol=1e-12)
        torch.testing.assert_close(h_kk[n], k1[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(h_kv[n], v1[0], rtol=0, atol=1e-12)


def test_the_two_states_are_linear_attention_s():
    # H and G are gated additive memories: keys k, values beta k (H) and beta v (G)
    from linattn.ops import linear_attention

    x, s = _inputs(B=1, T=13, H=2, K=4, V=3)
    _, h_kk, h_kv = mesa_net(**x, **s, chunk_size=4, output_final_state=True, cg_eps=0.0)
    b = x["beta"].unsqueeze(-1)
    for state, values, S0 in (
        (h_kk, b * x["k"], s["h_kk_init"]),
        (h_kv, b * x["v"], s["h_kv_init"]),
    ):
        _, want = linear_attention(x["q"], x["k"], values, x["g"], initial_state=S0,
                                   output_final_state=True)  # fmt: skip
        torch.testing.assert_close(state, want, rtol=0, atol=1e-12)


def test_the_step_continues_the_recurrent_form():
    x, s = _inputs(B=2, T=5, H=2, K=4, V=3)
    o, h_kk, h_kv = mesa_net(**x, **s, mode="recurrent", output_final_state=True,
                             max_cg_iterations=16, cg_eps=0.0)  # fmt: skip
    a, b = s["h_kk_init"], s["h_kv_init"]
    for t in range(5):
        qkvg = (x[n][:, t] for n in ("q", "k", "v", "g"))
        o_t, a, b = mesa_net_step(
            *qkvg, x["lamb"], x["beta"][:, t], a, b, max_cg_iterations=16, cg_eps=0.0
        )
        torch.testing.assert_close(o_t, o[:, t], rtol=0, atol=1e-9)
    torch.testing.assert_close(a, h_kk, rtol=0, atol=1e-12)
    torch.testing.assert_close(b, h_kv, rtol=0, atol=1e-12)


def test_float32_error_against_float64():
    x, s = _inputs(B=1, T=64, H=2, K=16, V=16, dtype=torch.float32)
    want = _oracle(x, s)
    o, *_ = mesa_net(**x, **s, max_cg_iterations=32, cg_eps=0.0)
    error = ((o.double() - want).norm() / want.norm()).item()
    assert error < 1e-5, error  # measured: 1.8e-7 (fla's eps 1e-5 and 30 steps: 1.8e-4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lamb": torch.zeros(2, 6)}, "lamb must be > 0"),
        ({"lamb": torch.ones(3, 6, dtype=torch.float64)}, r"lamb must have shape \[H, K\]"),
        ({"beta": -torch.ones(2, 21, 2, dtype=torch.float64)}, "beta must be >= 0"),
        ({"g": torch.ones(2, 21, 2, dtype=torch.float64)}, "g is a log-decay"),
        ({"mode": "fused"}, "mode must be one of"),
        ({"max_cg_iterations": -1}, "max_cg_iterations must be >= 0"),
        ({"cg_eps": -1.0}, "cg_eps must be a number >= 0"),
        ({"h_kk_init": torch.zeros(2, 2, 6, 3, dtype=torch.float64)}, "h_kk_init must have shape"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(change, message):
    x, _ = _inputs()
    with pytest.raises((ValueError, TypeError), match=message):
        mesa_net(**{**x, **change})
