"""The Forgetting Transformer's float64 loop: log f = 0 is causal softmax attention; a gate of
-inf-like strength keeps only the current token; its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from linattn.reference.forgetting import forgetting_attention
from linattn.reference.softmax import softmax_attention


def _qkv(T=9, K=4, V=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(T, K)), rng.normal(size=(T, K)), rng.normal(size=(T, V))


def test_zero_gates_are_causal_softmax_attention():
    q, k, v = _qkv()
    o = forgetting_attention(q, k, v, np.zeros(9))
    np.testing.assert_allclose(o, softmax_attention(q, k, v, causal=True)[0], rtol=0, atol=1e-14)


def test_a_window_of_one_and_a_strong_forget_gate_keep_the_current_token():
    q, k, v = _qkv()
    np.testing.assert_allclose(forgetting_attention(q, k, v, window_size=1), v, atol=1e-15)
    o = forgetting_attention(q, k, v, np.full(9, -80.0))
    np.testing.assert_allclose(o, v, atol=1e-15)


def test_the_sink_takes_its_share_of_the_denominator():
    q, k, v = _qkv(T=1)
    # one key with logit l, one sink with logit b: o = exp(l) v / (exp(l) + exp(b))
    logit = float(q[0] @ k[0]) / 2.0
    o = forgetting_attention(q, k, v, sink=0.7)
    np.testing.assert_allclose(o, v / (1 + np.exp(0.7 - logit)), rtol=1e-14)


def test_refusals_name_the_argument():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="log_f"):
        forgetting_attention(q, k, v, np.zeros(8))
    with pytest.raises((TypeError, ValueError), match="window_size"):
        forgetting_attention(q, k, v, window_size=0)
