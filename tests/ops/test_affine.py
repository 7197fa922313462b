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


@pytest.mark.parametrize("gate", [None, "scalar", "channel"])
def test_map_is_computed_in_chunks(gate, monkeypatch):
    # Linear in T: the UT transform's solves and the decayed products are chunk-sized (64
    # tokens), never T x T; the map equals the literal product of the transitions all the same.
    x = make_inputs(B=1, H=2, T=300, gate=gate, rule="delta")
    sizes = []
    real_solve, real_matmul = torch.linalg.solve_triangular, torch.matmul

    def solve(A, *args, **kwargs):
        sizes.append(A.shape[-1])
        return real_solve(A, *args, **kwargs)

    def matmul(a, b, *args, **kwargs):
        sizes.append(a.shape[-2])
        return real_matmul(a, b, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "solve_triangular", solve)
    monkeypatch.setattr(torch, "matmul", matmul)
    M, N = chunk_affine_map(x["k"], x["v"], x["beta"], x["g"])
    monkeypatch.undo()
    assert sizes and max(sizes) <= 64
    product = np.stack([np.eye(4)] * 2)
    for t in range(300):
        for h in range(2):
            g_t = None if x["g"] is None else x["g"][0, t, h].numpy()
            A = transition(x["k"][0, t, h].numpy(), float(x["beta"][0, t, h]), g_t, rule="delta")
            product[h] = A @ product[h]
    np.testing.assert_allclose(M[0].numpy(), product, rtol=0, atol=1e-10)
