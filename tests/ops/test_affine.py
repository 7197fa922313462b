"""chunk_affine_map: (M, N) against the literal transitions, and composition across blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn.ops import chunk_affine_map, delta_rule, linear_attention
from linattn.reference.gated import transition

from .cases import make_inputs, oracle


@pytest.mark.parametrize("rule", ["additive", "delta"])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_map_is_the_product_of_transitions(rule, gate):
    x = make_inputs(B=1, H=1, T=6, gate=gate, rule=rule)
    M, N = chunk_affine_map(x["k"], x["v"], x["beta"], x["g"])
    product = np.eye(4)
    for t in range(6):
        beta_t = None if x["beta"] is None else float(x["beta"][0, t, 0])
        g_t = None if x["g"] is None else x["g"][0, t, 0].numpy()
        product = transition(x["k"][0, t, 0].numpy(), beta_t, g_t, rule=rule) @ product
    np.testing.assert_allclose(M[0, 0].numpy(), product, rtol=0, atol=1e-12)
    _, S = oracle(x["q"], x["k"], x["v"], x["beta"], x["g"], None, rule=rule)
    torch.testing.assert_close(N, S, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rule", ["additive", "delta"])
@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_composed_maps_equal_running_in_sequence(rule, gate):
    x = make_inputs(T=30, gate=gate, rule=rule, state=True)
    S = x["S0"]
    for a, b in [(0, 7), (7, 8), (8, 21), (21, 30)]:
        part = [None if x[n] is None else x[n][:, a:b] for n in ("k", "v", "beta", "g")]
        M, N = chunk_affine_map(*part)
        S = M @ S + N
    if rule == "delta":
        _, S_ref = delta_rule(
            x["q"],
            x["k"],
            x["v"],
            x["beta"],
            x["g"],
            initial_state=x["S0"],
            output_final_state=True,
        )
    else:
        _, S_ref = linear_attention(
            x["q"], x["k"], x["v"], x["g"], initial_state=x["S0"], output_final_state=True
        )
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)


def test_wy_form_without_decay():
    # Section 8: the product of the block's transitions is I - K^T T K, T = (I + L)^{-1} diag(beta).
    x = make_inputs(B=1, H=1, T=6, rule="delta")
    M, _ = chunk_affine_map(x["k"], x["v"], x["beta"])
    K, b = x["k"][0, :, 0], x["beta"][0, :, 0]
    L = torch.tril(b[:, None] * (K @ K.T), -1)
    T = torch.linalg.solve(torch.eye(6, dtype=K.dtype) + L, torch.diag(b))
    torch.testing.assert_close(
        M[0, 0], torch.eye(4, dtype=K.dtype) - K.T @ T @ K, rtol=0, atol=1e-12
    )


def test_checks():
    x = make_inputs(rule="delta", gate="scalar")
    with pytest.raises(ValueError, match="beta"):
        chunk_affine_map(x["k"], x["v"], x["beta"] * 3)
    with pytest.raises(ValueError, match="g"):
        chunk_affine_map(x["k"], x["v"], x["beta"], -x["g"])
