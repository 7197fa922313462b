"""Shared look of the figures: colours, matrix blocks, saving to PNG and SVG.

matplotlib is imported lazily (it is the optional ``plot`` extra) and always with the Agg backend,
so that figures render on a machine without a display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

# One colour per role, used by every figure: a reader learns them once.
QUERY = "#3b6fb6"
KEY = "#d9822b"
VALUE = "#3a9a5b"
STATE = "#7a4fa3"
SCORE = "#8c8c8c"
ERROR = "#c23b3b"
INK = "#222222"
CMAP = "Blues"
DIVERGING = "RdBu_r"

# The PNG holds two pixels per CSS pixel (a page shows it at 96 per inch, its natural size, or
# narrower: ``linattn.experiments.report_page`` sets the width); SMALLEST_TEXT is the smallest
# font size, in points, that a figure uses (13.3 CSS px at its natural size), and MAX_WIDTH the
# widest figure, in inches, that a 1,100 px column shows at its natural size.
CSS_DPI = 96
DPI = 2 * CSS_DPI
SMALLEST_TEXT = 10.0
MAX_WIDTH = 11.4
# Text in the SVG as paths: the file needs no installed font. ("none" keeps it as <text>, which
# the tests use to read the numbers a figure shows.)
SVG_FONTTYPE = "path"


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend; a clear error when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError as error:  # the figures are the optional `plot` extra
        raise ImportError(
            "the figures need matplotlib: pip install 'linattn[plot]' (or matplotlib>=3.7)"
        ) from error
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 11,
            "axes.titlesize": 12,
            "axes.labelsize": 11,
            "xtick.labelsize": 10,
            "ytick.labelsize": 10,
            "legend.fontsize": 10,
            "mathtext.fontset": "dejavusans",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "svg.hashsalt": "linattn",  # the same SVG ids on every run
            "svg.fonttype": SVG_FONTTYPE,
        }
    )
    return plt


def save(fig: Any, out_dir: Path | str, name: str) -> list[Path]:
    """Write ``fig`` to ``out_dir/name.png`` and ``.svg``, close it, return both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / f"{name}.png", out_dir / f"{name}.svg"
    # No creation date in the metadata: the same inputs give the same files.
    fig.savefig(png, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(svg, bbox_inches="tight", metadata={"Date": None})
    pyplot().close(fig)
    return [png, svg]


def save_png(fig: Any, path: Path | str) -> Path:
    """Write ``fig`` to exactly ``path`` (PNG unless its suffix names another format), close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Without a suffix matplotlib would append ".png" and write another file than the one named.
    png = None if path.suffix else "png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight", format=png)
    pyplot().close(fig)
    return path


def blank_axes(fig: Any, rect: Sequence[float] = (0, 0, 1, 1)) -> Any:
    """An axes without ticks or frame, with equal aspect: a canvas for block diagrams."""
    ax = fig.add_axes(rect)
    ax.set_axis_off()
    ax.set_aspect("equal")
    return ax


def matrix_block(
    ax: Any,
    x: float,
    y: float,
    data: np.ndarray,
    color: str,
    label: str = "",
    shape: str = "",
    cmap: str | None = None,
    bold: bool = False,
    symmetric: bool = False,
) -> tuple[float, float, float, float]:
    """Draw ``data`` as a heat map with one square per entry, its lower-left corner at (x, y).

    The frame takes ``color`` (the role of the matrix), ``label`` goes above and ``shape`` (e.g.
    "n x d") below. Returns the block's extent (x0, x1, y0, y1) for arrows and operators.
    """
    rows, cols = data.shape
    extent = (x, x + cols, y, y + rows)
    if symmetric:
        bound = float(np.abs(data).max()) or 1.0
        ax.imshow(
            data,
            extent=extent,
            cmap=cmap or DIVERGING,
            vmin=-bound,
            vmax=bound,
            interpolation="nearest",
            zorder=1,
        )
    else:
        ax.imshow(data, extent=extent, cmap=cmap or CMAP, interpolation="nearest", zorder=1)
    frame = ax.add_patch(_rectangle((x, y), cols, rows, color, linewidth=3.0 if bold else 1.5))
    frame.set_zorder(2)
    if label:
        ax.text(
            x + cols / 2, y + rows + 0.4, label, ha="center", va="bottom", color=color, fontsize=14
        )
    if shape:
        ax.text(x + cols / 2, y - 0.4, shape, ha="center", va="top", color=INK, fontsize=11)
    return extent


def value_grid(
    ax: Any,
    x: float,
    y: float,
    data: np.ndarray,
    color: str,
    label: str = "",
    highlight: np.ndarray | None = None,
    cell: float = 1.0,
    fmt: str = "{:g}",
) -> tuple[float, float, float, float]:
    """Draw a small matrix as a grid of printed numbers (entries with ``highlight`` in red)."""
    rows, cols = data.shape
    for i in range(rows):
        for j in range(cols):
            red = highlight is not None and bool(highlight[i, j])
            ax.add_patch(
                _rectangle(
                    (x + j * cell, y + (rows - 1 - i) * cell),
                    cell,
                    cell,
                    color,
                    linewidth=1.0,
                    fill="#fbe3e3" if red else "white",
                )
            )
            ax.text(
                x + (j + 0.5) * cell,
                y + (rows - 0.5 - i) * cell,
                fmt.format(_clean(data[i, j])),
                ha="center",
                va="center",
                fontsize=13,
                color=ERROR if red else INK,
            )
    if label:
        ax.text(
            x + cols * cell / 2,
            y + rows * cell + 0.15,
            label,
            ha="center",
            va="bottom",
            color=color,
            fontsize=13,
        )
    return (x, x + cols * cell, y, y + rows * cell)


def arrow(
    ax: Any,
    start: tuple[float, float],
    end: tuple[float, float],
    text: str = "",
    color: str = INK,
    offset: float = 0.35,
) -> None:
    """A straight arrow from ``start`` to ``end`` with ``text`` above its middle."""
    ax.annotate(
        "",
        xy=end,
        xytext=start,
        arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.4, "shrinkA": 0, "shrinkB": 0},
    )
    if text:
        ax.text(
            (start[0] + end[0]) / 2,
            (start[1] + end[1]) / 2 + offset,
            text,
            ha="center",
            va="bottom",
            fontsize=12,
            color=color,
        )


def _rectangle(
    xy: tuple[float, float],
    width: float,
    height: float,
    color: str,
    linewidth: float = 1.5,
    fill: str | None = None,
) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(
        xy,
        width,
        height,
        fill=fill is not None,
        facecolor=fill or "none",
        edgecolor=color,
        linewidth=linewidth,
    )


def _clean(x: float) -> float:
    """-0.0 prints as 0; integers print without a decimal point."""
    x = float(x) + 0.0
    return int(round(x)) if abs(x - round(x)) < 1e-12 else x
