"""How large a figure's text is on the page: measured from its SVG, at a given page width.

The report page (``linattn.experiments.report_page``) keeps its text in a column at most
``COLUMN_PX`` CSS pixels wide, inside ``PADDING_PX`` on each side, and shows a figure at its natural
size (``style.CSS_DPI`` pixels per inch) or scaled down to the column, but never below its
*legible width*, the width at which its smallest text is ``MINIMUM_PX`` tall: on a narrow screen
(a phone) the figure then scrolls sideways in its own box instead of shrinking past reading. A text
of s points in a figure w points wide is s * display_width / w pixels tall on the screen.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from linattn.figures import style

COLUMN_PX = 1100
PADDING_PX = 16
MINIMUM_PX = 11.0  # the smallest text a reader reads without zooming
_SIZE = re.compile(r"font(?:-size)?:\s*(?:[a-z-]+\s+)*([\d.]+)px")


def column_width(page_width: int) -> int:
    """The width in CSS pixels of the page's column at a viewport ``page_width`` pixels wide."""
    return min(COLUMN_PX, page_width - 2 * PADDING_PX)


def natural_width(svg_width_pt: float) -> int:
    """The width in CSS pixels at which the page shows a figure ``svg_width_pt`` points wide."""
    return round(svg_width_pt * style.CSS_DPI / 72)


def svg_text_sizes(svg: Path | str) -> tuple[float, list[float]]:
    """(the figure's width in points, the font size in points of each text it draws).

    Reads an SVG written with ``svg.fonttype = "none"`` (text kept as text). A text's size is its
    largest glyph: mathtext writes sub- and superscripts at 70% of it.
    """
    root = ET.parse(svg).getroot()
    width = float(root.get("viewBox", "0 0 0 0").split()[2])
    sizes = []
    for node in root.iter():
        if not node.tag.endswith("}text"):
            continue
        glyphs = [_size(child) for child in node.iter()]
        glyphs = [size for size in glyphs if size is not None]
        if glyphs and "".join(node.itertext()).strip():
            sizes.append(max(glyphs))
    return width, sizes


def text_px_at(svg: Path | str, shown_px: float) -> float:
    """The smallest text of a figure, in CSS pixels, when the figure is shown ``shown_px`` wide."""
    width, sizes = svg_text_sizes(svg)
    if not sizes:
        raise ValueError(f"{svg} has no text kept as text (write it with svg.fonttype 'none')")
    return min(sizes) * shown_px / width


def legible_width(
    natural_px: int, smallest_pt: float = style.SMALLEST_TEXT, minimum_px: float = MINIMUM_PX
) -> int:
    """The narrowest width in CSS pixels, at most ``natural_px``, at which a figure whose smallest
    text is ``smallest_pt`` points shows that text ``minimum_px`` tall.

    At its natural width a text of s points is s * CSS_DPI / 72 pixels tall, so the figure may
    shrink by the factor minimum_px / that. The page uses the style's guarantee
    (``style.SMALLEST_TEXT``, every figure's smallest text: tests/figures/test_legibility.py).
    """
    at_natural = smallest_pt * style.CSS_DPI / 72
    return min(natural_px, math.ceil(natural_px * minimum_px / at_natural))


def display_width(svg: Path | str, page_width: int) -> int:
    """The width the page shows a figure at on a page ``page_width`` pixels wide: its natural
    width or the column's, whichever is smaller, but not below its legible width."""
    width, _ = svg_text_sizes(svg)
    natural = natural_width(width)
    return max(min(natural, column_width(page_width)), legible_width(natural))


def smallest_text_px(svg: Path | str, page_width: int) -> float:
    """The smallest text of a figure, in CSS pixels, on a page ``page_width`` pixels wide."""
    return text_px_at(svg, display_width(svg, page_width))


def _size(node: ET.Element) -> float | None:
    match = _SIZE.search(node.get("style", ""))
    return float(match.group(1)) if match else None


def png_css_width(png: Path | str) -> int:
    """The natural width in CSS pixels of a PNG the figures wrote (``style.DPI`` per inch, shown
    at ``style.CSS_DPI``), read from its header."""
    header = Path(png).read_bytes()[:24]
    if header[:8] != b"\x89PNG\r\n\x1a\n" or header[12:16] != b"IHDR":
        raise ValueError(f"{png} is not a PNG file")
    return round(int.from_bytes(header[16:20], "big") * style.CSS_DPI / style.DPI)
