"""The spec's nine figures: each draws a PNG and an SVG that exist, are not empty, and open."""

import xml.etree.ElementTree as ET

import pytest

from linattn.figures import FIGURES, SPEC_FIGURES

PIL = pytest.importorskip("PIL.Image")

# The spec's TikZ sources, in the order of its figures (its appendix lists them compiled).
SPEC_NAMES = [
    "softmax-attention-products",
    "reordering",
    "cache-and-state",
    "attention-maps",
    "interference",
    "overwrite",
    "householder",
    "chunked-delta",
    "series-roadmap",
]


ALL_NAMES = [*SPEC_NAMES, "beyond-fixed-memory"]


def test_nine_figures_in_the_spec_order():
    assert [f.number for f in SPEC_FIGURES] == list(range(1, 10))
    assert [f.name for f in SPEC_FIGURES] == SPEC_NAMES
    for figure in FIGURES:
        assert figure.caption.startswith(f"Figure {figure.number}. ")
    assert FIGURES[: len(SPEC_FIGURES)] == SPEC_FIGURES
    assert [f.number for f in FIGURES[len(SPEC_FIGURES) :]] == [10]


def test_every_figure_is_written_as_png_and_svg(rendered):
    out, paths = rendered
    assert sorted(p.name for p in paths) == sorted(
        f"{name}.{suffix}" for name in ALL_NAMES for suffix in ("png", "svg")
    )
    assert all(p.parent == out for p in paths)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_png_opens_and_is_a_real_picture(rendered, name):
    out, _ = rendered
    with PIL.open(out / f"{name}.png") as image:
        image.load()
        width, height = image.size
        assert width > 600 and height > 300
        # Not blank: a drawn figure has many distinct colours.
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 20


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_svg_is_well_formed(rendered, name):
    out, _ = rendered
    root = ET.parse(out / f"{name}.svg").getroot()
    assert root.tag.endswith("svg")
    assert len(list(root.iter())) > 50


def test_svg_is_reproducible_and_needs_no_font(tmp_path):
    # The same inputs give the same file: no dates, fixed ids (a diff shows real changes); the
    # text is drawn as paths, so the SVG looks the same without the font installed.
    first, second = tmp_path / "a", tmp_path / "b"
    SPEC_FIGURES[4].draw(first)
    SPEC_FIGURES[4].draw(second)
    svg = (first / "interference.svg").read_bytes()
    assert svg == (second / "interference.svg").read_bytes()
    assert b"<text" not in svg
