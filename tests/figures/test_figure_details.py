"""Figures 3, 4, 7 and 9: no marker, line, arrow or label hides another, and each
arrow starts and ends where it says. Each figure is drawn with style.save replaced, so that its
artists can be read.
"""

import numpy as np
import pytest

from linattn import reference
from linattn.figures import maps, memory, roadmap, style, writes

pytest.importorskip("matplotlib")


@pytest.fixture
def kept(monkeypatch):
    figures = {}

    def save(fig, out_dir, name):
        figures[name] = fig
        return []

    monkeypatch.setattr(style, "save", save)
    yield figures
    style.pyplot().close("all")


def _arrows(ax):
    """(start, end, colour) of every annotation arrow of ``ax``, in data coordinates."""
    return [
        (np.array(a.xyann, dtype=float), np.array(a.xy, dtype=float), a.arrow_patch.get_edgecolor())
        for a in ax.texts
        if getattr(a, "arrow_patch", None) is not None
    ]


def test_figure3_the_callout_arrow_crosses_no_line(kept):
    memory.cache_and_state("unused")
    ax = kept["cache-and-state"].axes[0]
    d, t = 128, 131_072
    (start, end), *_ = [(s, e) for s, e, c in _arrows(ax) if c[0] > 0.6]  # the red callout
    assert tuple(end) == (t, reference.kv_cache_numbers(t, d))  # on the cache's line
    # Along the arrow, in the log-log plane, the cache 2 t d stays below it up to its end.
    for f in np.linspace(0, 0.98, 50):
        x, y = np.exp((1 - f) * np.log(start) + f * np.log(end))
        assert y > 2 * x * d, (f, x, y)


def test_figure4_no_marker_hides_the_other_at_index_1(kept):
    maps.attention_maps("unused")
    ax = kept["attention-maps"].axes[-1]
    softmax, linear = ax.get_lines()[:2]
    assert softmax.get_xdata()[0] == linear.get_xdata()[0] == 1
    assert linear.get_fillstyle() == "none"  # a hollow square: the dot shows through it
    assert softmax.get_zorder() > linear.get_zorder()  # and the dot is drawn over it


def test_figure7_the_write_arrow_ends_on_its_points(kept):
    writes.householder("unused")
    fig = kept["householder"]
    for ax, beta in zip(fig.axes[:2], (1.0, 0.5), strict=True):
        k = np.array([np.cos(np.pi / 6), np.sin(np.pi / 6)])
        s = np.array([-0.2, 1.6])
        moved = s - beta * k * (k @ s)
        new = moved + beta * 2.0 * k
        green = [(a, b) for a, b, c in _arrows(ax) if c[1] > c[0] and c[1] > c[2]]
        assert any(np.allclose(a, moved) and np.allclose(b, new) for a, b in green), green


def test_figure7_the_largest_eigenvalue_shows_under_the_spectral_norm(kept):
    writes.householder("unused")
    ax = kept["householder"].axes[2]
    lines = {line.get_label(): line for line in ax.get_lines()}
    largest, norm = lines["largest eigenvalue, 1"], lines["spectral norm, 1"]
    assert np.allclose(largest.get_ydata(), 1) and np.allclose(norm.get_ydata(), 1)
    assert largest.get_linewidth() >= 3 * norm.get_linewidth()  # a band wider than the dashes


def test_figure9_no_label_covers_a_box_an_arrow_or_another_label(kept):
    # A text lies inside the one box it belongs to, or outside every box; it meets no arrow and
    # no other text (their extents on the canvas, in pixels, a pixel of slack).
    roadmap.series_roadmap("unused")
    fig = kept["series-roadmap"]
    fig.canvas.draw()  # lays out the arrows
    ax, renderer = fig.axes[0], fig.canvas.get_renderer()
    annotations = [a for a in ax.texts if getattr(a, "arrow_patch", None) is not None]
    arrows = [a.arrow_patch.get_window_extent(renderer) for a in annotations]
    texts = [t for t in ax.texts if t.get_text()]
    boxes = [patch.get_window_extent(renderer) for patch in ax.patches]
    extents = [t.get_window_extent(renderer).padded(-1) for t in texts]
    assert len(arrows) == len(roadmap.EDGES) + 1 and len(boxes) == len(roadmap.METHODS) + 8
    for i, (text, extent) in enumerate(zip(texts, extents, strict=True)):
        inside = [b for b in boxes if b.contains(extent.x0, extent.y0) and b.contains(
            extent.x1, extent.y1)]  # fmt: skip
        assert len(inside) <= 1, text.get_text()
        assert not any(extent.overlaps(b) for b in boxes if b not in inside), text.get_text()
        assert not any(extent.overlaps(a) for a in arrows), text.get_text()
        others = extents[:i] + extents[i + 1 :]
        assert not any(extent.overlaps(o) for o in others), text.get_text()


def test_figure9_the_hybrid_is_fed_by_kda_on_a_kda_layer(kept):
    roadmap.series_roadmap("unused")
    ax = kept["series-roadmap"].axes[0]
    x, bottom, width = roadmap._corner("kda")
    (start, end), *rest = [(a, b) for a, b, _ in _arrows(ax) if a[1] == bottom - 0.06]
    assert not rest and start[0] == end[0] == x + width / 2
    layer = int(end[0] // (roadmap.LAYER_WIDTH + roadmap.LAYER_GAP))
    assert end[0] - layer * (roadmap.LAYER_WIDTH + roadmap.LAYER_GAP) < roadmap.LAYER_WIDTH
    assert (roadmap.HYBRID_PATTERN * 2)[layer] == "KDA"
