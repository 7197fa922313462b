"""The oblique delta rule (``linattn.ops.rules.oblique``: read key r, write key k): every form
against a float64 token loop, grouped value heads and packed sequences, the chunk form's
gradients against the recurrent form's, and the fused C++ kernels (forward, backward, step)
against float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linattn.ops import _engine, _native
from linattn.ops.rule_attention import rule_step
from linattn.ops.step import fused_step

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused kernels unavailable: {_native.reason()}"
)

B, T, H, HV, K, V = 2, 37, 2, 4, 6, 5


def make(gate, dtype=torch.float64, seed=0, N=B):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = {
        "q": randn(B, T, H, K), "k": 0.7 * F.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, HV, V), "r": 0.9 * F.normalize(randn(B, T, HV, K), dim=-1),
        "g": {"none": None, "head": F.logsigmoid(randn(B, T, HV) + 2),
              "channel": F.logsigmoid(randn(B, T, HV, K) + 2)}[gate],
        "S0": randn(N, HV, K, V),
    }  # fmt: skip
    return {n: (None if t is None else t.to(dtype)) for n, t in x.items()}


def loop(x, scale, bounds):
    """S <- D S; u = v - S^T r; S <- S + k u^T; o = S^T (scale q), token by token (float64)."""
    G = HV // H
    o = torch.zeros(x["v"].shape[0], T, HV, V, dtype=torch.float64)
    finals = []
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        b = 0 if len(bounds) > 2 else slice(None)
        S = x["S0"][n : n + 1] if len(bounds) > 2 else x["S0"]
        for t in range(s, e):
            q = x["q"][b, t].repeat_interleave(G, -2)
            k = x["k"][b, t].repeat_interleave(G, -2)
            if x["g"] is not None:
                a = torch.exp(x["g"][b, t])
                S = S * (a[..., None, None] if x["g"].dim() == 3 else a[..., :, None])
            u = x["v"][b, t] - torch.einsum("...k,...kv->...v", x["r"][b, t], S)
            S = S + k[..., :, None] * u[..., None, :]
            o[b, t] = torch.einsum("...k,...kv->...v", scale * q, S)
        finals.append(S)
    return o, torch.cat(finals) if len(bounds) > 2 else finals[0]


def run(x, mode, C=8, cu=None):
    return _engine.run(
        x["q"], x["k"], x["v"], x["r"], x["g"], scale=0.4, mode=mode, chunk_size=C,
        initial_state=x["S0"], cu_seqlens=cu, rule="oblique",
    )  # fmt: skip


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_every_form_equals_the_token_loop(gate, mode):
    x = make(gate)
    want = loop(x, 0.4, [0, T])
    for C in (1, 8, 64) if mode == "chunk" else (8,):
        for a, b in zip(run(x, mode, C), want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_packed_sequences_equal_the_token_loop(gate):
    cu = [0, 5, 5, 30, 37]
    x = make(gate, N=len(cu) - 1)
    x = {n: (t if t is None or n == "S0" else t[:1]) for n, t in x.items()}
    want = loop(x, 0.4, cu)
    for a, b in zip(run(x, "chunk", 8, torch.tensor(cu)), want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _gradients(x, mode, dtype):
    leaves = {n: t.to(dtype).detach().requires_grad_() for n, t in x.items() if t is not None}
    o, S = run({**x, **leaves}, mode, 16)
    w = torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape).to(dtype)
    wS = torch.linspace(1, -1, S.numel(), dtype=torch.float64).reshape(S.shape).to(dtype)
    ((o * w).sum() + (S * wS).sum()).backward()
    return [o, S] + [leaves[n].grad for n in leaves]


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
def test_chunk_gradients_equal_the_recurrent_forms(gate):
    x = make(gate)
    chunk, recurrent = (_gradients(x, mode, torch.float64) for mode in ("chunk", "recurrent"))
    for a, b in zip(chunk, recurrent, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@needs_native
@pytest.mark.parametrize("gate", ["none", "head", "channel"])
def test_the_fused_kernels_equal_float64(gate):
    """float32 (the fused forward and backward) against float64: relative RMS below 1e-6 for
    the outputs, the final state and every gradient (measured: about 3e-7)."""
    x = make(gate)
    want = _gradients(x, "chunk", torch.float64)
    got = _gradients(x, "chunk", torch.float32)
    for a, b in zip(got, want, strict=True):
        error = float((a.detach().double() - b.detach()).norm() / b.detach().norm())
        assert error < 1e-6, error


@needs_native
@pytest.mark.parametrize("gate", ["none", "head", "channel"])
def test_the_fused_step_equals_the_float64_step(gate):
    """The fused C++ step (float32) against the PyTorch step in float64, token by token."""
    x = make(gate)
    S64 = x["S0"].clone()
    S32 = x["S0"].float().contiguous()
    for t in range(4):
        q, k, v, r, g = (None if x[n] is None else x[n][:, t] for n in ("q", "k", "v", "r", "g"))
        o64 = rule_step("oblique", S64, q, k, v, g, scale=0.4, r=r)
        f32 = [None if y is None else y.float().contiguous() for y in (q, k, v, r, g)]
        o32 = fused_step(S32, *f32, 0.4, None, "oblique")
        assert o32 is not None  # the fused step ran
        torch.testing.assert_close(o32.double(), o64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S32.double(), S64, rtol=1e-5, atol=1e-5)
