"""Bad input to the reference gets a clear error naming the argument, before any work."""

import numpy as np
import pytest

import linattn.reference as ref

GOOD = np.random.default_rng(0).standard_normal((6, 3))
BETA = np.full(6, 0.5)

CALLS = {
    "softmax_attention": lambda Q, K, V: ref.softmax_attention(Q, K, V),
    "linear_attention_quadratic": lambda Q, K, V: ref.linear_attention_quadratic(Q, K, V),
    "linear_attention": lambda Q, K, V: ref.linear_attention(Q, K, V),
    "causal_linear_attention": lambda Q, K, V: ref.causal_linear_attention(Q, K, V),
    "chunked_linear_attention": lambda Q, K, V: ref.chunked_linear_attention(Q, K, V, 4),
    "delta_rule": lambda Q, K, V: ref.delta_rule(Q, K, V, BETA),
    "chunked_delta_rule": lambda Q, K, V: ref.chunked_delta_rule(Q, K, V, BETA, 4),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize("name", ["Q", "K", "V"])
def test_non_finite_input_is_named(call, name):
    args = {"Q": GOOD, "K": GOOD, "V": GOOD}
    for bad in (np.nan, np.inf):
        X = GOOD.copy()
        X[2, 1] = bad
        args[name] = X
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            call(**args)


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_wrong_rank_and_dtype_are_named(call):
    with pytest.raises(ValueError, match=r"V must be a 2-D array .* shape \(6,\)"):
        call(GOOD, GOOD, GOOD[:, 0])
    with pytest.raises(TypeError, match="K must be an array of real numbers"):
        call(GOOD, GOOD.astype(str), GOOD)
    with pytest.raises(TypeError, match="Q must be an array of real numbers"):
        call(GOOD.astype(complex), GOOD, GOOD)


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_mismatched_shapes_are_named(call):
    with pytest.raises(ValueError, match="Q and K"):
        call(GOOD[:, :2], GOOD, GOOD)
    with pytest.raises(ValueError, match="K and V"):
        call(GOOD, GOOD, GOOD[:4])


def test_integer_arrays_are_accepted():
    keys = np.array([[1, 0], [0, 1]])
    O, P = ref.softmax_attention(keys, keys, keys)
    assert O.dtype == np.float64


def test_beta_checks():
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 2\]"):
        ref.ut_transform(GOOD, np.full(6, -0.1))
    with pytest.raises(ValueError, match="beta must be finite"):
        ref.wy_transition(GOOD, np.full(6, np.nan))
    with pytest.raises(ValueError, match="beta must be a 1-D array"):
        ref.transition_product(GOOD, np.ones((6, 1)))


def test_flags_and_scalars():
    with pytest.raises(TypeError, match="causal must be True or False"):
        ref.softmax_attention(GOOD, GOOD, GOOD, causal="yes")
    with pytest.raises(TypeError, match="causal must be True or False"):
        ref.linear_attention_quadratic(GOOD, GOOD, GOOD, causal=1)
    with pytest.raises(ValueError, match="scale must be finite"):
        ref.attention_maps(np.random.default_rng(0), scale=float("inf"))
    with pytest.raises(TypeError, match="beta must be a real number"):
        ref.householder_spectrum(GOOD[0], "1")
