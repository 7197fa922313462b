"""The parallel form against the masked n x n product written out with a decay matrix."""

from __future__ import annotations

import pytest
import torch

from linattn.ops import linear_attention

from .cases import make_inputs


@pytest.mark.parametrize("gate", [None, "scalar"])
def test_masked_product_with_decay(gate):
    # O = (Q K^T * D) V with D_ij = prod_{j < l <= i} alpha_l for i >= j, else 0 (section 5.1).
    x = make_inputs(B=1, H=1, T=12, gate=gate)
    Q, K, V = (x[n][0, :, 0] for n in ("q", "k", "v"))
    D = torch.tril(torch.ones(12, 12, dtype=torch.float64))
    if gate is not None:
        alpha = torch.exp(x["g"][0, :, 0])
        for i in range(12):
            for j in range(i + 1):
                D[i, j] = torch.prod(alpha[j + 1 : i + 1])
    o, _ = linear_attention(x["q"], x["k"], x["v"], x["g"], mode="parallel", scale=1.0)
    torch.testing.assert_close(o[0, :, 0], (Q @ K.T * D) @ V, rtol=0, atol=1e-12)
