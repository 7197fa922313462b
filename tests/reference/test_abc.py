"""linattn.reference.abc: ABC's prefix sums against gated slot attention's recurrence without a
gate (linattn.reference.gsa), an independent definition of the same memory."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference.abc import abc
from linattn.reference.gsa import gated_slot_attention


def test_without_a_gate_it_is_abcs_prefix_sums():
    rng = np.random.default_rng(2)
    T, K, V, M = 9, 4, 3, 5
    q, k, v, s = (rng.normal(size=(T, d)) for d in (K, K, V, M))
    S0 = (rng.normal(size=(K, M)), rng.normal(size=(M, V)))
    o, S = gated_slot_attention(q, k, v, s, scale=0.7, initial_state=S0)
    o_abc, S_abc = abc(q, k, v, s, scale=0.7, initial_state=S0)
    np.testing.assert_allclose(o, o_abc, rtol=0, atol=1e-13)
    for a, b in zip(S, S_abc, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13)


def test_bad_shapes_are_refused():
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match="q, k must be"):
        abc(x, x, x[:1], x)
