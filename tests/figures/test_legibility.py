"""The figures can be read on the page: the smallest text of each, measured from its SVG, at the
width the report page shows it (1,280 px and 390 px wide viewports)."""

import pytest

from linattn.figures import FIGURES, legibility, style

# At a 1,280 px page every figure is shown at its natural size or a little below it; 11 px is the
# smallest text a reader reads without zooming. At 390 px (a phone) a figure would scale down to the
# 358 px column, past reading: the page keeps it at its legible width instead, and it scrolls
# sideways in its box (tests/experiments/test_report_browser.py measures it in Chromium).
DESKTOP, PHONE, MINIMUM_PX = 1280, 390, legibility.MINIMUM_PX


@pytest.mark.parametrize("figure", FIGURES, ids=[f.name for f in FIGURES])
def test_smallest_text_at_both_widths(rendered, figure):
    out, _ = rendered
    svg = out / f"{figure.name}.svg"
    desktop = legibility.smallest_text_px(svg, DESKTOP)
    phone = legibility.smallest_text_px(svg, PHONE)
    width, sizes = legibility.svg_text_sizes(svg)
    print(f"{figure.name}: {width / 72:.1f} in, smallest text {min(sizes):.1f} pt: "
          f"{desktop:.1f} px at {DESKTOP}, {phone:.1f} px at {PHONE}")  # fmt: skip
    assert desktop >= MINIMUM_PX, (figure.name, desktop)
    assert phone >= MINIMUM_PX - 0.05, (figure.name, phone)
    assert min(sizes) >= style.SMALLEST_TEXT
    assert width / 72 <= style.MAX_WIDTH + 0.05  # shown at its natural size in the column


def test_the_measurement_scales_with_the_display_width(tmp_path):
    plt = style.pyplot()
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(plt.rcParams, "svg.fonttype", "none")
        fig = plt.figure(figsize=(20, 2))  # 1,920 px natural: scaled to the 1,100 px column
        fig.text(0.1, 0.5, r"big $k_t^\top$", fontsize=20)
        fig.text(0.6, 0.5, "small", fontsize=8)
        fig.savefig(tmp_path / "f.svg")
        plt.close(fig)
    width, sizes = legibility.svg_text_sizes(tmp_path / "f.svg")
    assert width == pytest.approx(1440) and sorted(sizes) == [8, 20]
    assert legibility.text_px_at(tmp_path / "f.svg", 1100) == pytest.approx(8 * 1100 / 1440)
    assert legibility.text_px_at(tmp_path / "f.svg", 358) == pytest.approx(8 * 358 / 1440)
    # Text of 10 pt (the style's smallest) is 13.3 px at the natural width: 11 px at 0.825 of it.
    assert legibility.legible_width(1000) == 825 and legibility.legible_width(1000, 20) == 413
    assert legibility.legible_width(1000, 5) == 1000  # never wider than the natural width
    assert legibility.display_width(tmp_path / "f.svg", 390) == 1584  # 0.825 x 1,920
    assert legibility.column_width(1280) == 1100 and legibility.natural_width(72) == 96
