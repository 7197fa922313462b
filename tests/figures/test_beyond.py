"""Figure 10: the mechanisms beyond a fixed memory on Figure 3's axes, from the cost model."""

import re

import pytest

from linattn.reference import costs


def test_the_cost_model_of_the_mechanisms_beyond_a_fixed_memory():
    r = d = 128
    # log-linear attention: one level state per bit of t
    assert [costs.log_linear_levels(t) for t in (1, 2, 3, 4, 7, 8, 16_384)] == [
        1,
        2,
        2,
        3,
        3,
        4,
        15,
    ]
    assert costs.log_linear_state_numbers(16_384, r, d) == 15 * r * d
    assert costs.log_linear_step_ops(16_384, r, d) == 2 * 16 * r * d
    # MesaNet: H (r x r) and G (r x d); m conjugate-gradient products with H a step
    assert costs.mesa_state_numbers(r, d) == r * r + r * d
    assert costs.mesa_step_ops(r, d, iterations=30) == 62 * r * r + 4 * r * d
    # FoX keeps one number more per cached token; PaTH and DeltaFormer do twice softmax's work
    assert costs.forgetting_cache_numbers(10, d) == costs.kv_cache_numbers(10, d) + 10
    assert costs.path_step_ops(10, d) == costs.deltaformer_step_ops(10, d) == 8 * 10 * d
    with pytest.raises(ValueError, match="iterations"):
        costs.mesa_step_ops(r, d, iterations=0)
    with pytest.raises(ValueError, match="t"):
        costs.log_linear_levels(0)


def test_the_figure_labels_every_mechanism_and_marks_its_length(rendered):
    out, _ = rendered
    svg = (out / "beyond-fixed-memory.svg").read_text()
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)  # the points' labels, plain text
    for name in ("MesaNet", "log-linear Mamba-2", "FoX", "PaTH, DeltaFormer", "delta rule"):
        assert name in labels, name
    # matplotlib keeps a mathtext string as a comment above its glyphs
    assert "<!-- Memory against work at $t = 16,384$ -->" in svg
