"""Long sequences: finite output under strong decay, and float32 drift of the delta rule.

Both checks run in chunk mode and take tens of seconds, so they are marked slow
(``python -m pytest -m slow tests/ops/test_long_sequences.py``).
"""

from __future__ import annotations

import pytest
import torch

from linattn.ops import delta_rule, linear_attention

from .cases import rel_rms


def long_inputs(T, K, V, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, 1, K, generator=gen, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(1, T, 1, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(1, T, 1, V, generator=gen, dtype=dtype)
    return q, k, v


@pytest.mark.slow
@pytest.mark.parametrize("op", ["linear", "delta"])
@pytest.mark.parametrize("shape", [(1,), (1, 4)], ids=["scalar", "channel"])
def test_million_tokens_strong_decay_is_finite(op, shape):
    T, K = 1_000_000, 4
    q, k, v = long_inputs(T, K, K)
    g = torch.full((1, T, *shape[:1], *shape[1:]), -5.0)
    with torch.no_grad():
        if op == "linear":
            o, S = linear_attention(q, k, v, g, mode="chunk", output_final_state=True)
        else:
            beta = torch.full((1, T, 1), 0.5)
            o, S = delta_rule(q, k, v, beta, g, mode="chunk", output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    # With alpha = e^-5 the memory is about one token long: o_T is nearly S_T^T q_T with S_T
    # dominated by the last write, so the output is not trivially zero either.
    assert o.abs().max() > 0.1


@pytest.mark.slow
def test_hundred_thousand_tokens_float32_delta_rule_stays_close():
    T, K = 100_000, 16
    q, k, v = long_inputs(T, K, K, dtype=torch.float64)
    beta = torch.ones(1, T, 1, dtype=torch.float64)
    g = torch.zeros(1, T, 1, dtype=torch.float64)
    with torch.no_grad():
        o64, S64 = delta_rule(q, k, v, beta, g, output_final_state=True)
        o32, S32 = delta_rule(
            q.float(), k.float(), v.float(), beta.float(), g.float(), output_final_state=True
        )
    err_o, err_S = rel_rms(o32, o64), rel_rms(S32, S64)
    print(f"100k tokens, float32 vs float64: rel RMS output {err_o:.2e}, state {err_S:.2e}")
    assert err_o < 1e-3 and err_S < 1e-3
