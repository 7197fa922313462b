"""The numbers a figure shows are computed by linattn.reference, never typed in.

The SVGs are written with their text kept as text, so that the test can read what a figure says
(the nine figures are drawn once, by the ``rendered`` fixture of conftest.py); patching a
reference function must change what the figure says.
"""

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from linattn import reference
from linattn.figures import maps, memory, style, writes


@pytest.fixture
def svg_text(monkeypatch):
    monkeypatch.setattr(style, "SVG_FONTTYPE", "none")


def words(paths) -> str:
    """All the text of a figure's SVG, one string: one text after the other, and inside a text
    with mathtext (one <tspan> per glyph, grouped by font) the glyphs of each line left to right."""
    svg = next(p for p in paths if p.suffix == ".svg")
    root = ET.parse(svg).getroot()
    texts = [_text(node) for node in root.iter() if node.tag.endswith("}text")]
    return " ".join(texts).replace("\xa0", " ")


def _text(node) -> str:
    glyphs = [child for child in node if child.tag.endswith("tspan")]
    if not glyphs:
        return "".join(node.itertext())
    lines: dict[float, list] = {}
    for glyph in glyphs:  # sub- and superscripts sit within a few points of their line
        y = float(glyph.get("y", 0))
        line = next((key for key in lines if abs(key - y) < 6), y)
        lines.setdefault(line, []).append(glyph)
    return " ".join(
        "".join(g.text or "" for g in sorted(lines[y], key=lambda g: float(g.get("x", 0))))
        for y in sorted(lines)
    )


def drawn(rendered, name):
    out, _ = rendered
    return [out / f"{name}.svg"]


def test_cache_and_state_shows_the_computed_memory(rendered):
    text = words(drawn(rendered, "cache-and-state"))
    assert "break-even: t = 64" in text
    assert "33,554,432 against" in text and "16,512 numbers," in text
    assert "2,032 times fewer" in text


def test_cache_and_state_follows_the_reference(tmp_path, monkeypatch, svg_text):
    monkeypatch.setattr(reference, "break_even_tokens", lambda r, d: 99)
    assert "break-even: t = 99" in words(memory.cache_and_state(tmp_path))


def test_attention_maps_shows_ranks_and_peaks(rendered):
    text = words(drawn(rendered, "attention-maps"))
    assert "softmax P, rank 16" in text and "linear A (elu + 1), rank 4" in text
    assert "mean largest weight 0.39" in text
    assert "mean largest weight 0.10" in text
    assert "linear: 12 zero" in text
    assert "0.0625: uniform row" in text


def test_attention_maps_follow_the_reference(tmp_path, monkeypatch, svg_text):
    monkeypatch.setattr(reference, "attention_maps", lambda rng, n, d, scale: (np.eye(n),) * 2)
    text = words(maps.attention_maps(tmp_path))
    assert "linear A (elu + 1), rank 16" in text and "mean largest weight 1.00" in text


def test_overwrite_shows_the_computed_states(rendered, tmp_path, monkeypatch, svg_text):
    text = words(drawn(rendered, "overwrite"))
    assert "=v1+v3: the old value (3, 1) stays" in text
    assert "=v3 (0, 4): only the new value" in text
    example = reference.figure6_example()
    example["delta_S3"] = np.full((2, 2), 7.0)
    monkeypatch.setattr(reference, "figure6_example", lambda: example)
    assert words(writes.overwrite(tmp_path)).count("7") >= 4


def test_chunked_delta_prints_its_computed_agreement(rendered):
    text = words(drawn(rendered, "chunked-delta"))
    errors = re.findall(r"(\d\.\de-\d\d)", text)
    assert len(errors) == 2 and all(float(e) < 1e-12 for e in errors)


def test_roadmap_hybrid_memory(rendered):
    text = words(drawn(rendered, "series-roadmap"))
    assert "25.0% of all-full-attention" in text and "(KV cache 75% smaller)" in text
    assert text.count("read, correct, write") == 3  # every delta-rule arrow is labelled


def test_roadmap_shows_the_generalized_delta_rule_family(rendered):
    # The third column, right of the delta rule's, one box per row (what the memory
    # forgets), each reached from the delta rule's box by a labelled arrow.
    text = words(drawn(rendered, "series-roadmap"))
    for name in ("IPLR (generalized delta rule)", "Comba (separate read key)", "DPLR / RWKV-7"):
        assert text.count(name) == 1, name
    assert "Hu et al. 2025" in text and "Peng et al. 2025; Gated DeltaNet-2" in text
    assert text.count("any rank-one correction") == 3
    assert text.count("forget: one rate") == 3 and text.count("one rate per channel") == 3
