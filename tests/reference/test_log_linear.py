"""The float64 log-linear attention (``linattn.reference.log_linear``): the Fenwick levels, the
masked hierarchical product and the recurrence over the level states agree."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference import log_linear as R


def draws(T=37, K=4, V=3, L=7, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((T, K)), rng.standard_normal((T, K)), rng.standard_normal((T, V))
    return q, k, v, -rng.random(T), rng.standard_normal((T, L))


def test_the_levels_are_the_fenwick_partition_of_the_prefix():
    assert [R.level(6, s) for s in range(7)] == [3, 3, 3, 3, 2, 2, 0]
    assert [R.level(7, s) for s in range(8)] == [3, 3, 3, 3, 2, 2, 1, 0]
    # Every level of every t is one contiguous block of size 2^(l-1) or none (paper, section 3.1).
    for t in range(70):
        for lvl in range(1, 9):
            block = [s for s in range(t) if R.level(t, s) == lvl]
            assert len(block) in (0, 2 ** (lvl - 1))
            assert block == list(range(block[0], block[0] + len(block))) if block else True
            assert bool(block) == bool((t >> (lvl - 1)) & 1)
    with pytest.raises(ValueError, match="s <= t"):
        R.level(3, 4)


def test_the_recurrence_equals_the_masked_product():
    q, k, v, g, lam = draws()
    o_loop, states = R.recurrence(q, k, v, g, lam, scale=0.5)
    np.testing.assert_allclose(o_loop, R.masked_product(q, k, v, g, lam, scale=0.5), atol=1e-13)
    assert len(states) == 6  # bit_length(37)
    # The final states: level l holds the tokens s with l(37, s) = l, decayed to token 36.
    for j, S in enumerate(states):
        want = sum(
            (np.exp(g[s + 1 :].sum()) * np.outer(k[s], v[s]) for s in range(37)
             if R.level(37, s) == j + 1),
            np.zeros((4, 3)),
        )  # fmt: skip
        np.testing.assert_allclose(S, want, atol=1e-13)


def test_a_sequence_continued_from_its_level_states_equals_the_whole():
    q, k, v, g, lam = draws()
    whole, S_whole = R.recurrence(q, k, v, g, lam)
    first, S_first = R.recurrence(q[:13], k[:13], v[:13], g[:13], lam[:13])
    rest, S_rest = R.recurrence(q[13:], k[13:], v[13:], g[13:], lam[13:], initial_state=S_first,
                                offset=13)  # fmt: skip
    np.testing.assert_allclose(np.concatenate([first, rest]), whole, atol=1e-13)
    for a, b in zip(S_rest, S_whole, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-13)
    np.testing.assert_allclose(
        R.masked_product(q[13:], k[13:], v[13:], g[13:], lam[13:], offset=13),
        R.recurrence(q[13:], k[13:], v[13:], g[13:], lam[13:], offset=13)[0], atol=1e-13,
    )  # fmt: skip


def test_levels_beyond_the_weights_given_weigh_zero():
    q, k, v, g, lam = draws(L=3)
    lam5 = np.concatenate([lam, np.zeros((37, 4))], axis=1)
    np.testing.assert_allclose(
        R.masked_product(q, k, v, g, lam), R.masked_product(q, k, v, g, lam5)
    )
    np.testing.assert_allclose(R.recurrence(q, k, v, g, lam)[0], R.masked_product(q, k, v, g, lam5),
                               atol=1e-13)  # fmt: skip


def test_bad_input_is_named():
    q, k, v, g, lam = draws()
    with pytest.raises(ValueError, match="level_scales"):
        R.masked_product(q, k, v, g, lam[:5])
    with pytest.raises(ValueError, match="g must"):
        R.recurrence(q, k, v, g[:5], lam)
    with pytest.raises(ValueError, match="offset"):
        R.recurrence(q, k, v, g, lam, offset=-1)
    with pytest.raises(ValueError, match="initial_state"):
        R.recurrence(q, k, v, g, lam, initial_state=[np.zeros((2, 2))])


def test_over_gated_deltanet_the_recurrence_equals_the_masked_product_and_one_level_is_gdn():
    from linattn.reference import gated

    q, k, v, g, lam = draws()
    k = k / np.linalg.norm(k, axis=1, keepdims=True)
    beta = 2 * np.random.default_rng(3).random(37)
    o_loop, states = R.recurrence(q, k, v, g, lam, scale=0.5, beta=beta)
    np.testing.assert_allclose(
        o_loop, R.masked_product(q, k, v, g, lam, scale=0.5, beta=beta), atol=1e-13
    )
    ones = np.ones_like(lam)
    o_gdn, S_gdn = gated.recurrence(q, k, v, beta, g, rule="delta", scale=0.5)
    o_one, states_one = R.recurrence(q, k, v, g, ones, scale=0.5, beta=beta)
    np.testing.assert_allclose(o_one, o_gdn, atol=1e-13)
    np.testing.assert_allclose(sum(states_one), S_gdn, atol=1e-13)  # the levels sum to the state
    first, S_first = R.recurrence(q[:13], k[:13], v[:13], g[:13], lam[:13], beta=beta[:13])
    rest, _ = R.recurrence(q[13:], k[13:], v[13:], g[13:], lam[13:], initial_state=S_first,
                           offset=13, beta=beta[13:])  # fmt: skip
    np.testing.assert_allclose(np.concatenate([first, rest]), R.recurrence(
        q, k, v, g, lam, beta=beta)[0], atol=1e-13)  # fmt: skip
    with pytest.raises(ValueError, match="beta must have shape"):
        R.recurrence(q, k, v, g, lam, beta=beta[:3])
