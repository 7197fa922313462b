"""The float64 HGRN and HGRN2 references (``linattn.reference.hgrn``)."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference import gated, hgrn


def test_hgrn_is_the_element_wise_recurrence():
    rng = np.random.default_rng(0)
    x, g, h0 = rng.standard_normal((7, 5)), -rng.random((7, 5)), rng.standard_normal(5)
    o, h = hgrn.hgrn(x, g, initial_state=h0)
    for t in range(7):
        expected = np.exp(g[: t + 1].sum(0)) * h0 + sum(
            np.exp(g[s + 1 : t + 1].sum(0)) * x[s] for s in range(t + 1)
        )
        np.testing.assert_allclose(o[t], expected, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(h, o[-1])


def test_hgrn2_is_gla_with_keys_one_minus_the_forget_gate():
    rng = np.random.default_rng(1)
    q, v, S0 = rng.standard_normal((8, 4)), rng.standard_normal((8, 3)), rng.standard_normal((4, 3))
    f = rng.uniform(0.2, 0.99, (8, 4))
    o, S = hgrn.hgrn2(q, f, v, scale=0.5, initial_state=S0)
    o_gla, S_gla = gated.recurrence(q, 1 - f, v, g=np.log(f), scale=0.5, initial_state=S0)
    np.testing.assert_allclose(o, o_gla, rtol=0, atol=1e-13)
    np.testing.assert_allclose(S, S_gla, rtol=0, atol=1e-13)


def test_bad_input_is_refused_naming_the_argument():
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match="x and g"):
        hgrn.hgrn(x, np.zeros((3, 3)))
    with pytest.raises(ValueError, match="initial_state must have shape"):
        hgrn.hgrn(x, x, initial_state=np.zeros(3))
    with pytest.raises(ValueError, match=r"f \(the forget gate\) must lie in \(0, 1\]"):
        hgrn.hgrn2(x, x, x)
