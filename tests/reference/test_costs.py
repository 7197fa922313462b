"""The cost model of section 9: each formula against the spec's figures and against each other."""

import pytest

from linattn.reference import (
    attention_matrix_bytes,
    break_even_tokens,
    crossover_tokens,
    delta_state_numbers,
    delta_step_ops,
    delta_training_ops,
    kv_cache_numbers,
    linear_fraction,
    linear_state_numbers,
    linear_step_ops,
    linear_training_ops,
    softmax_step_ops,
    softmax_training_ops,
)
from linattn.reference.costs import (
    delta_chunk_ops,
    delta_to_linear_chunk_ratio,
    layer_dense_ops,
    layer_linear_ops,
    layer_softmax_ops,
    linear_chunk_ops,
)


def test_figure3_memory_numbers():
    # Section 5: d = r = 128 after t = 131,072 tokens.
    cache, state = kv_cache_numbers(131_072, 128), linear_state_numbers(128, 128)
    assert (cache, state) == (33_554_432, 16_512)
    assert round(cache / state) == 2_032
    assert round(cache / delta_state_numbers(128, 128)) == 2_048
    assert break_even_tokens(128, 128) == 64
    assert kv_cache_numbers(64, 128) <= state < kv_cache_numbers(65, 128)


def test_attention_matrix_takes_2_gib_at_32768_tokens():
    assert attention_matrix_bytes(32_768) == 2 * 2**30
    assert attention_matrix_bytes(4, bytes_per_number=4) == 64


def test_crossover_and_fraction():
    d_model = 4_096
    n = crossover_tokens(d_model)
    assert n == 24_576
    assert layer_softmax_ops(n, d_model) == layer_dense_ops(n, d_model)
    assert layer_softmax_ops(n + 1, d_model) > layer_dense_ops(n + 1, d_model)
    assert layer_softmax_ops(n - 1, d_model) < layer_dense_ops(n - 1, d_model)
    fraction = linear_fraction(128, d_model)
    assert fraction == pytest.approx(0.0052, abs=5e-5)  # "about 0.5 percent"
    for n in (1, 1_000, 10**6):
        assert layer_linear_ops(n, 128, d_model) / layer_dense_ops(n, d_model) == pytest.approx(
            fraction, rel=1e-15
        )


@pytest.mark.parametrize(("n", "C"), [(1024, 1), (1024, 64), (1000, 8), (64, 64)])
def test_training_ops_are_n_over_c_chunks(n, C):
    r, d = 32, 48
    assert linear_training_ops(n, r, d, C) * C == n * linear_chunk_ops(C, r, d)
    assert delta_training_ops(n, r, d, C) * C == n * delta_chunk_ops(C, r, d)


def test_training_and_step_formulas():
    assert softmax_training_ops(10, 4) == 4 * 100 * 4
    assert linear_training_ops(10, 3, 4, 2) == 2 * 10 * 2 * 7 + 4 * 10 * 3 * 4
    assert delta_training_ops(10, 3, 4, 2) == 10 * (4 * 2 * 3 + 3 * 2 * 4 + 6 * 3 * 4)
    assert (softmax_step_ops(5, 4), linear_step_ops(3, 4), delta_step_ops(3, 4)) == (80, 48, 72)


@pytest.mark.parametrize("d", [16, 64, 128, 256])
def test_delta_chunk_costs_between_1_5_and_1_75_additive_ones(d):
    ratios = [delta_to_linear_chunk_ratio(C, d, d) for C in range(1, 8 * d)]
    assert 1.5 <= min(ratios) and max(ratios) <= 1.75
    assert delta_to_linear_chunk_ratio(d, d, d) == pytest.approx(13 / 8)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_bad_sizes(bad):
    with pytest.raises((ValueError, TypeError), match="n must be an integer >= 1"):
        softmax_training_ops(bad, 4)
    with pytest.raises((ValueError, TypeError), match="C must be an integer >= 1"):
        delta_training_ops(8, 4, 4, bad)
    with pytest.raises((ValueError, TypeError), match="d_model must be an integer >= 1"):
        crossover_tokens(bad)
