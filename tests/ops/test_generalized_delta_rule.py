"""generalized_delta_rule (IPLR, DPLR) against the float64 token loop (issue 30)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.ops import delta_rule, generalized_delta_rule, tuning
from linattn.reference.dplr import recurrence

from .cases import make_inputs

GATES = [None, "scalar", "channel"]
MODES = [("recurrent", 64), ("parallel", 64), ("chunk", 1), ("chunk", 5), ("chunk", 16)]


def dplr_inputs(B=2, T=17, H=2, K=4, V=3, *, gate=None, state=False, dtype=torch.float64, seed=0):
    """make_inputs' q, k, v, g, S0 and a, b [B, T, H, K]: b of unit length and a = -beta' b-ish
    directions, so that the transitions neither blow up nor vanish."""
    x = make_inputs(B, T, H, K, V, gate=gate, state=state, dtype=torch.float64, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    b = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    b = b / b.norm(dim=-1, keepdim=True)
    a = -torch.rand(B, T, H, 1, generator=gen, dtype=torch.float64) * b
    a = a + 0.3 * torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) / K
    x["a"], x["b"] = a, b
    return {n: (None if t is None else t.to(dtype)) for n, t in x.items()}


def oracle(x, scale=1.0):
    """The float64 token loop of ``linattn.reference.dplr`` for every batch and head."""
    B, T, H, _ = x["q"].shape
    V = x["v"].shape[-1]
    o, S = np.zeros((B, T, H, V)), np.zeros((B, H, x["q"].shape[-1], V))

    def np64(t):
        return None if t is None else t.detach().double().numpy()

    q, k, v, a, b, g, S0 = (np64(x[n]) for n in ("q", "k", "v", "a", "b", "g", "S0"))
    for i in range(B):
        for h in range(H):
            o[i, :, h], S[i, h] = recurrence(
                q[i, :, h], k[i, :, h], v[i, :, h], a[i, :, h], b[i, :, h],
                None if g is None else g[i, :, h], scale=scale,
                initial_state=None if S0 is None else S0[i, h],
            )  # fmt: skip
    return torch.from_numpy(o), torch.from_numpy(S)


def run(x, mode, C, **kw):
    return generalized_delta_rule(
        x["q"], x["k"], x["v"], x["a"], x["b"], x["g"], mode=mode, chunk_size=C,
        initial_state=x["S0"], output_final_state=True, scale=kw.pop("scale", 1.0), **kw,
    )  # fmt: skip


def close(x, ref, rtol=1e-12):
    """Relative to the reference's largest entry (float64: 1e-12)."""
    scale = ref.abs().max().clamp(min=1e-300)
    assert float((x.double() - ref).abs().max() / scale) < rtol


@pytest.mark.parametrize("mode,C", MODES)
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("state", [False, True])
def test_float64_matches_the_token_loop(mode, C, gate, state):
    x = dplr_inputs(T=21, gate=gate, state=state)
    o, S = run(x, mode, C)
    o_ref, S_ref = oracle(x)
    assert o.dtype == torch.float64
    close(o, o_ref)
    close(S, S_ref)


@pytest.mark.parametrize("gate", GATES)
def test_the_delta_rule_is_a_row_of_the_table(gate):
    # a = -beta k, b = exp(g) k (b = k without a gate; the decay first), v' = beta v.
    x = make_inputs(T=21, gate=gate, rule="delta", state=True)
    beta = x["beta"].unsqueeze(-1)
    g = x["g"]
    decay = 1.0 if g is None else torch.exp(g if g.dim() == 4 else g.unsqueeze(-1))
    o, S = generalized_delta_rule(
        x["q"], x["k"], beta * x["v"], -beta * x["k"], decay * x["k"], g, mode="recurrent",
        initial_state=x["S0"], output_final_state=True,
    )  # fmt: skip
    o_ref, S_ref = delta_rule(
        x["q"], x["k"], x["v"], x["beta"], g, mode="recurrent", initial_state=x["S0"],
        output_final_state=True,
    )  # fmt: skip
    close(o, o_ref)
    close(S, S_ref)


NAMES = ("q", "k", "v", "a", "b", "g", "S0")


def small(gate, seed=0, **kw):
    """Small float64 leaves for gradcheck: a gate strictly below 0 (numerical steps stay <= 0)."""
    x = dplr_inputs(B=1, T=9, H=1, K=3, V=2, gate=gate, state=True, seed=seed, **kw)
    if x["g"] is not None:
        x["g"] = x["g"].clamp(max=-0.05)
    return [x[n].clone().requires_grad_() for n in NAMES if x[n] is not None]


def op(mode, C, gate):
    """The op as a function of its differentiable inputs (q, k, v, a, b, [g], S0)."""

    def f(q, k, v, a, b, *rest):
        g, S0 = (rest[0], rest[1]) if gate else (None, rest[0])
        return generalized_delta_rule(
            q, k, v, a, b, g, mode=mode, chunk_size=C, initial_state=S0, output_final_state=True
        )

    return f


@pytest.mark.parametrize("mode,C", [("recurrent", 1), ("parallel", 1), ("chunk", 4)])
@pytest.mark.parametrize("gate", GATES)
def test_gradcheck(mode, C, gate):
    assert torch.autograd.gradcheck(op(mode, C, gate), small(gate))


@pytest.mark.parametrize("mode,C", [("parallel", 1), ("chunk", 4)])
@pytest.mark.parametrize("gate", GATES)
def test_gradgradcheck(mode, C, gate):
    assert torch.autograd.gradgradcheck(op(mode, C, gate), small(gate), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("gate", [*GATES, "steep"])
@pytest.mark.parametrize("rows", [1, 4096])  # one chunk per group, and one group (per thread)
def test_the_loops_gradients_are_the_token_loops(gate, rows, monkeypatch):
    # The group loop (its backward: autograd through each group's terms, from the saved states)
    # against autograd through the recurrent form, float64 to 1e-10 relative. "steep": channel
    # gates 400 times steeper, so that the per-channel products halve (``_blockmath``).
    monkeypatch.setattr(tuning, "GROUP_ROWS_PER_THREAD", rows)
    steep = gate == "steep"
    x = dplr_inputs(T=37, gate="channel" if steep else gate, state=True)
    if steep:
        x["g"] = 400 * x["g"]
    gen = torch.Generator().manual_seed(1)
    d_o = torch.randn(2, 37, 2, 3, generator=gen, dtype=torch.float64)
    d_S = torch.randn(2, 2, 4, 3, generator=gen, dtype=torch.float64)
    grads = []
    for mode, C in (("recurrent", 1), ("chunk", 16)):
        leaves = {n: (None if t is None else t.clone().requires_grad_()) for n, t in x.items()}
        o, S = run(leaves, mode, C)
        used = [t for t in leaves.values() if t is not None]
        grads.append(torch.autograd.grad((o * d_o).sum() + (S * d_S).sum(), used))
    for new, ref in zip(*grads, strict=True):
        close(new, ref, rtol=1e-10)
