"""The recurrent step against one literal step of the mechanism table (docs/design.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.ops.recurrent import step
from linattn.reference.gated import transition, write


@pytest.mark.parametrize("rule", ["additive", "delta"])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_one_step_is_transition_then_write(rule, gate):
    gen = torch.Generator().manual_seed(0)
    S = torch.randn(1, 1, 4, 3, generator=gen, dtype=torch.float64)
    q, k = torch.randn(2, 1, 1, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 1, 3, generator=gen, dtype=torch.float64)
    beta = torch.tensor([[0.7]], dtype=torch.float64) if rule == "delta" else None
    g = {None: None, "scalar": -torch.rand(1, 1, 1, generator=gen, dtype=torch.float64),
         "channel": -torch.rand(1, 1, 4, generator=gen, dtype=torch.float64)}[gate]  # fmt: skip
    o, S_new = step(S, q, k, v, beta, g)
    g_t = None if g is None else (g[0, 0, 0].item() if gate == "scalar" else g[0, 0].numpy())
    b_t = None if beta is None else 0.7
    A = transition(k[0, 0].numpy(), b_t, g_t, rule=rule)
    expected = A @ S[0, 0].numpy() + np.outer(
        k[0, 0].numpy(), write(v[0, 0].numpy(), b_t, rule=rule)
    )
    np.testing.assert_allclose(S_new[0, 0].numpy(), expected, rtol=0, atol=1e-14)
    np.testing.assert_allclose(o[0, 0].numpy(), expected.T @ q[0, 0].numpy(), rtol=0, atol=1e-14)
