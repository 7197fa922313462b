"""Figures rendered from computed numbers (matplotlib, Agg backend, PNG and SVG).

``SPEC_FIGURES`` lists the spec's nine figures in order, each with its file name (the spec's TikZ
source names), its caption and the function that draws it from ``linattn.reference``;
``render_spec_figures(out_dir)`` draws them all. ``FIGURES`` adds the figures that extend the
spec's (Figure 10: the mechanisms beyond a fixed memory on Figure 3's axes), drawn by
``render_figures``. ``linattn.figures.plots`` draws the data plots
(Table 1, the benchmark, the recall sweep) and ``linattn.figures.numbers`` writes the appendix's
numbers files. matplotlib is the optional ``plot`` extra and is imported only when drawing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from linattn.figures import beyond, chunked, maps, memory, products, roadmap, writes


@dataclass(frozen=True)
class Figure:
    """One figure of the spec: its number, file name (without suffix), caption and drawing."""

    number: int
    name: str
    caption: str
    draw: Callable[[Path], list[Path]]


SPEC_FIGURES: tuple[Figure, ...] = (
    Figure(1, "softmax-attention-products", products.SOFTMAX_CAPTION, products.softmax_products),
    Figure(2, "reordering", products.REORDERING_CAPTION, products.reordering),
    Figure(3, "cache-and-state", memory.CAPTION, memory.cache_and_state),
    Figure(4, "attention-maps", maps.CAPTION, maps.attention_maps),
    Figure(5, "interference", writes.INTERFERENCE_CAPTION, writes.interference),
    Figure(6, "overwrite", writes.OVERWRITE_CAPTION, writes.overwrite),
    Figure(7, "householder", writes.HOUSEHOLDER_CAPTION, writes.householder),
    Figure(8, "chunked-delta", chunked.CAPTION, chunked.chunked_delta),
    Figure(9, "series-roadmap", roadmap.CAPTION, roadmap.series_roadmap),
)


# The figures after the spec's, in its style: the same axes for the mechanisms that followed it.
FIGURES: tuple[Figure, ...] = (
    *SPEC_FIGURES,
    Figure(10, "beyond-fixed-memory", beyond.CAPTION, beyond.beyond_fixed_memory),
)


def render_figures(out_dir: Path | str) -> list[Path]:
    """Draw every figure of ``FIGURES`` (the spec's nine, then the ones that extend them)."""
    paths: list[Path] = []
    for figure in FIGURES:
        paths += figure.draw(Path(out_dir))
    return paths


def render_spec_figures(out_dir: Path | str) -> list[Path]:
    """Draw the nine figures into ``out_dir`` as ``NAME.png`` and ``NAME.svg``; return the paths."""
    paths: list[Path] = []
    for figure in SPEC_FIGURES:
        paths += figure.draw(Path(out_dir))
    return paths


__all__ = ["FIGURES", "Figure", "SPEC_FIGURES", "render_figures", "render_spec_figures"]
