"""The float64 RWKV-6 (``linattn.reference.rwkv6``): the literal token loop and its chunk form,
against linattn.ops.rwkv6 and fla's own definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from linattn.ops import rwkv6 as rwkv6_op
from linattn.reference import rwkv6


def draws(T=23, K=4, V=3, seed=0):
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((T, K)), rng.standard_normal((T, K))
    return q, k, rng.standard_normal((T, V)), -rng.random((T, K)), rng.standard_normal(K)


def test_one_step_reads_the_entering_state_plus_the_bonus_then_decays_and_writes():
    q, k, v, g, u = draws(T=1)
    S0 = np.random.default_rng(1).standard_normal((4, 3))
    o, S = rwkv6.recurrence(q, k, v, g, u, initial_state=S0, scale=0.5)
    write = np.outer(k[0], v[0])
    np.testing.assert_allclose(o[0], (S0 + np.diag(u) @ write).T @ (0.5 * q[0]), atol=1e-15)
    np.testing.assert_allclose(S, np.diag(np.exp(g[0])) @ S0 + write, rtol=0, atol=1e-15)


@pytest.mark.parametrize("C", [1, 2, 5, 23, 64])
@pytest.mark.parametrize("gate", ["channel", "step", None])
def test_chunks_equal_the_recurrence(C, gate):
    q, k, v, g, u = draws()
    g = {"channel": g, "step": g[:, 0], None: None}[gate]
    S0 = np.random.default_rng(2).standard_normal((4, 3))
    want = rwkv6.recurrence(q, k, v, g, u, initial_state=S0, scale=0.7)
    got = rwkv6.chunked(q, k, v, g, u, C, initial_state=S0, scale=0.7)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


def test_a_reset_forgets_after_the_token_reads():
    """g = -inf at token 7: token 7 still reads the state, token 8 reads only token 7's write."""
    q, k, v, g, u = draws()
    g[7] = -math.inf
    S0 = np.random.default_rng(4).standard_normal((4, 3))
    o, _ = rwkv6.recurrence(q, k, v, g, u, initial_state=S0)
    o0, _ = rwkv6.recurrence(q, k, v, g, u)
    assert np.abs(o[7] - o0[7]).max() > 1e-3  # read before the reset
    np.testing.assert_array_equal(o[8:], o0[8:])


def test_the_op_equals_the_reference():
    q, k, v, g, u = draws()
    S0 = np.random.default_rng(3).standard_normal((4, 3))
    want = rwkv6.recurrence(q, k, v, g, u, initial_state=S0, scale=0.7)

    def t(x):  # [T, D] -> [1, T, 1, D]
        return torch.from_numpy(x)[None, :, None]

    S0 = torch.from_numpy(S0)[None, None]
    o, S = rwkv6_op(t(q), t(k), t(v), t(g), torch.from_numpy(u)[None], scale=0.7, chunk_size=5,
                    initial_state=S0, output_final_state=True)  # fmt: skip
    np.testing.assert_allclose(o[0, :, 0].numpy(), want[0], rtol=0, atol=1e-13)
    np.testing.assert_allclose(S[0, 0].numpy(), want[1], rtol=0, atol=1e-13)


def test_bad_u_is_refused():
    q, k, v, g, _ = draws()
    with pytest.raises(ValueError, match=r"\bu\b"):
        rwkv6.recurrence(q, k, v, g, np.ones(3))
