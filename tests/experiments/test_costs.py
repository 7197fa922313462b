"""`linattn costs`: the section-9 table and the Figure 3 numbers at the spec's sizes."""

import json

from linattn.experiments.costs import compute_costs, costs_markdown


def test_the_spec_figures():
    costs = compute_costs()
    assert costs["memory_numbers"] == {"softmax": 33_554_432, "linear": 16_512, "delta": 16_384}
    assert round(costs["cache_to_linear_state"]) == 2_032
    assert round(costs["cache_to_delta_state"]) == 2_048
    assert costs["break_even_tokens"] == 64
    assert costs["attention_matrix_gib"] == 2.0
    assert costs["crossover_tokens"] == 24_576
    assert f"{costs['linear_fraction']:.1%}" == "0.5%"
    assert 1.5 <= costs["delta_to_linear_chunk_ratio"] <= 1.75
    assert costs["training_ops"]["softmax"] == 4 * 32_768**2 * 128


def test_markdown_and_json():
    costs = compute_costs()
    text = costs_markdown(costs)
    for figure in ("33,554,432", "16,512", "2,032", "2,048", "about 64 tokens", "2 GiB", "24,576"):
        assert figure in text
    assert "0.52%" in text
    header = "| For one head | Softmax attention | Linear attention | Delta rule |"
    assert text.splitlines()[2] == header
    assert json.loads(json.dumps(costs)) == costs


def test_other_sizes():
    costs = compute_costs(n=1_024, d=64, r=32, C=16, d_model=1_024, t=2_048)
    assert costs["memory_numbers"]["softmax"] == 2 * 2_048 * 64
    assert costs["memory_numbers"]["linear"] == 32 * 64 + 32
    assert costs["crossover_tokens"] == 6_144
