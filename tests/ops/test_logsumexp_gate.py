"""linattn.ops.logsumexp_gate: the compiled gate against its definition (float64 logcumsumexp)."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import logsumexp_gate


@pytest.mark.parametrize("with_z0", [False, True])
def test_forward_is_the_running_log_sum_exp(with_z0):
    x = torch.randn(2, 9, 5)
    if not logsumexp_gate.fused(x):
        pytest.skip("the compiled kernels are not loaded")
    z0 = torch.randn(2, 5) if with_z0 else None
    k, g, z_last = logsumexp_gate.forward(x.contiguous(), z0)
    rows = x.double() if z0 is None else torch.cat([z0.double()[:, None], x.double()], 1)
    z = torch.logcumsumexp(rows, 1)[:, -9:]  # z_t = log(exp(z_{t-1}) + exp(x_t))
    before = torch.cat([z[:, :1] if z0 is None else z0.double()[:, None], z[:, :-1]], 1)
    torch.testing.assert_close(k.double(), (x.double() - z).exp(), rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(g.double(), before - z, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(z_last.double(), z[:, -1], rtol=2e-5, atol=2e-5)
