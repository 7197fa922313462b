"""float64 gate sums after many resets or steep gates.

A plain float64 cumulative sum G of the gates loses |G| eps in every difference G_i - G_j, and |G|
grows by 745 a reset: the parallel form (one chunk of T tokens) drifted from the float64
recurrence as T grew (1.1e-12 at T = 1,000 with a reset every 37 tokens). ``gate_sums`` splits G
into an exact part and a remainder, so every form stays within 1e-13 of the recurrence.
"""

from __future__ import annotations

import pytest
import torch

from linattn.ops import _blockmath, delta_rule, linear_attention

from .float64_recurrence import recurrence


def _inputs(T: int, gate: str, reset_every: int, steep: float | None, seed: int = 0) -> dict:
    """float64 [1, T, 2, ...] inputs with ordinary gates (logsigmoid(N(2, 1))), resets (-inf)
    every ``reset_every`` tokens, or gates uniform in [steep, 0]."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    B, H, K, V = 1, 2, 4, 3
    shape = (B, T, H) if gate == "head" else (B, T, H, K)
    if steep is None:
        g = torch.nn.functional.logsigmoid(randn(*shape) + 2.0)
    else:
        g = steep * torch.rand(*shape, generator=gen, dtype=torch.float64)
    if reset_every:
        g[:, reset_every::reset_every] = -torch.inf
    return {
        "q": randn(B, T, H, K),
        "k": torch.nn.functional.normalize(randn(B, T, H, K), dim=-1),
        "v": randn(B, T, H, V),
        "beta": torch.rand(B, T, H, generator=gen, dtype=torch.float64),
        "g": g,
    }


def _error(rule: str, x: dict, **options) -> float:
    """max |o - o_ref| / max |o_ref| against the float64 recurrence."""
    beta = x["beta"] if rule == "delta" else None
    reference, _ = recurrence(x["q"], x["k"], x["v"], beta, x["g"])
    if rule == "delta":
        o, _ = delta_rule(x["q"], x["k"], x["v"], beta, x["g"], **options)
    else:
        o, _ = linear_attention(x["q"], x["k"], x["v"], x["g"], **options)
    return float((o - reference).abs().max() / reference.abs().max())


CASES = [(37, None), (0, -20.0), (0, -2.0)]  # resets every 37 tokens, steep gates


@pytest.mark.parametrize(("reset_every", "steep"), CASES)
@pytest.mark.parametrize("gate", ["head", "channel"])
@pytest.mark.parametrize("rule", ["delta", "additive"])
def test_the_parallel_form_stays_at_the_recurrence_after_resets(rule, gate, reset_every, steep):
    # Before: 1.1e-12 (delta, gate per head, resets) at T = 1,000.
    x = _inputs(1000, gate, reset_every, steep)
    assert _error(rule, x, mode="parallel") < 1e-13


@pytest.mark.slow  # about a minute: the recurrence and the chunk form at T = 10,000
@pytest.mark.parametrize(("reset_every", "steep"), CASES)
@pytest.mark.parametrize("gate", ["head", "channel"])
@pytest.mark.parametrize("chunk_size", [64, 1024])
def test_the_chunk_form_stays_at_the_recurrence_at_ten_thousand_tokens(
    chunk_size, gate, reset_every, steep
):
    x = _inputs(10_000, gate, reset_every, steep)
    assert _error("delta", x, mode="chunk", chunk_size=chunk_size) < 1e-13


@pytest.mark.slow  # the T x T products of T = 3,000 tokens
@pytest.mark.parametrize("gate", ["head", "channel"])
def test_the_parallel_form_stays_at_the_recurrence_at_three_thousand_tokens(gate):
    x = _inputs(3000, gate, 37, None)
    assert _error("additive", x, mode="parallel") < 1e-13
    assert _error("delta", x, mode="parallel") < 1e-13


def test_gate_sums_differences_are_rounded_once():
    # 300 resets make |G| about 2.2e5 (eps |G| = 5e-11); the differences inside a segment keep
    # float64's accuracy relative to themselves, as an exact (rational) sum gives them.
    gen = torch.Generator().manual_seed(0)
    g = -torch.rand(3000, 1, generator=gen, dtype=torch.float64)
    g[::10] = -torch.inf
    G = _blockmath.gate_sums(g)
    floored = g.clamp(min=_blockmath.gate_floor(torch.float64))
    plain = torch.cumsum(floored, 0)
    for i, j in [(2999, 2991), (1505, 1501), (29, 21)]:
        exact = floored[j + 1 : i + 1].sum()  # no reset in (j, i]: a short sum, rounded little
        got = G.map(lambda x, i=i: x[i]).minus(G.map(lambda x, j=j: x[j]))
        assert abs(float(got - exact)) <= 4e-16 * abs(float(exact))
    # The plain sum's drift there, after 300 resets (what the compensation removes):
    exact = floored[2992:3000].sum()
    assert abs(float(plain[2999] - plain[2991] - exact)) > 1e-13 * abs(float(exact))
