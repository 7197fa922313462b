"""The report page opened in a real browser: headless Chromium at a given viewport width.

``inspect_page(index_html, width)`` opens a copy of the page with a probe script in its head,
lets Chromium load it, and reads back what the probe saw (``--dump-dom``): the page's width
against the viewport's (horizontal overflow), every image (loaded, its size, inside the
viewport), every element that sticks out of the viewport outside a scrolling box, every table
(its section and header, each column's narrowest cell and right edge, its tallest row, its
smallest text, every word broken across lines) and every console error or failed resource
load. ``screenshot`` writes a full-page PNG. ``broken_links`` checks, without a browser, that
every link and image of the page resolves to a file beside it or to an id in it. Chromium is
Debian's ``chromium`` package (``.ci/run`` installs it).
"""

from __future__ import annotations

import html.parser
import json
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
_MARK = "linattn-probe"

# Records console errors and failed loads from the start, then measures the page after load.
PROBE = r"""<script>
(() => {
  const errors = [];
  const original = console.error.bind(console);
  console.error = (...args) => { errors.push(args.map(String).join(" ")); original(...args); };
  window.addEventListener("error", (event) => {
    const target = event.target;
    errors.push(target && target !== window && (target.src || target.href)
      ? "failed to load " + (target.src || target.href) : String(event.message));
  }, true);
  // A word is broken when its characters lie on more than one line of its cell.
  const brokenWords = (cell) => {
    const broken = [];
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.textContent.matchAll(/[^\s\-\/]+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        if (tops.size > 1) broken.push(match[0]);
      }
    }
    return broken;
  };
  // Per table: its section, its header, each column's narrowest cell and rightmost edge, the
  // tallest row, the smallest text and every broken word.
  const tableReport = (table) => {
    const rows = [...table.rows];
    const columns = [];
    let tallest = 0, smallest = Infinity;
    const broken = [];
    for (const row of rows) {
      tallest = Math.max(tallest, row.getBoundingClientRect().height);
      [...row.cells].forEach((cell, i) => {
        const box = cell.getBoundingClientRect();
        if (!box.width) return;  // hidden: a phone's cards hide the header row
        columns[i] = columns[i] || {narrowest: Infinity, right: 0};
        columns[i].narrowest = Math.min(columns[i].narrowest, box.width);
        columns[i].right = Math.max(columns[i].right, box.right);
        smallest = Math.min(smallest, parseFloat(getComputedStyle(cell).fontSize));
        broken.push(...brokenWords(cell));
      });
    }
    const section = table.closest("figure, body") && [...document.querySelectorAll("h2")]
      .filter((h) => h.compareDocumentPosition(table) & Node.DOCUMENT_POSITION_FOLLOWING).pop();
    return {section: section ? section.id : "", header: rows.length && rows[0].querySelector("th")
              ? [...rows[0].cells].map((c) => c.textContent) : [],
            columns, tallest_row: tallest, smallest_text: smallest, broken_words: broken};
  };
  window.addEventListener("load", () => {
    const width = document.documentElement.clientWidth;
    const scrolling = (el) => el.closest(".scroll, pre");
    const out = [];
    for (const el of document.body.querySelectorAll("*")) {
      const box = el.getBoundingClientRect();
      if (box.width && box.right > width + 0.5 && !scrolling(el)) {
        out.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + " " + box.right);
      }
    }
    const images = [...document.images].map((img) => ({
      src: img.getAttribute("src"), loaded: img.complete && img.naturalWidth > 0,
      // the file shown: a <picture> gives a phone NAME-narrow.png for the same <img>
      current: img.currentSrc ? decodeURIComponent(new URL(img.currentSrc).pathname) : "",
      shown: img.getBoundingClientRect().width, natural: img.naturalWidth,
      inside: img.getBoundingClientRect().right <= width + 0.5, scrolls: !!img.closest(".scroll"),
    }));
    const tables = [...document.querySelectorAll("table")].map(tableReport);
    // Every cell's right edge, to see that a phone's cards keep each value on the screen.
    for (const [i, table] of [...document.querySelectorAll("table")].entries()) {
      tables[i].right = Math.max(0, ...[...table.querySelectorAll("td")]
        .map((cell) => cell.getBoundingClientRect().right));
    }
    const result = {viewport: width, page: document.documentElement.scrollWidth,
                    height: document.documentElement.scrollHeight, images, overflowing: out,
                    tables, errors};
    window.parent.postMessage(JSON.stringify(result), "*");
  });
})();
</script>""".replace("MARK", _MARK)


def find_chromium() -> str | None:
    """The path of a Chromium executable on PATH, or None."""
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


# Chromium's headless window is at least 500 px wide: the page is laid out in a frame of the
# width asked for, as a phone would lay it out, and the frame reports what the probe measured.
HARNESS = """<!DOCTYPE html><html><head><meta charset="utf-8">
<style>body {{ margin: 0; }} iframe {{ border: 0; display: block; }}</style></head><body>
<iframe src="{src}" width="{width}" height="{height}"></iframe>
<script>window.addEventListener("message", (event) => {{
  const node = document.createElement("pre");
  node.id = "{mark}";
  node.textContent = event.data;
  document.body.appendChild(node);
}});</script></body></html>"""
MIN_WINDOW = 500


def _framed(index_html: Path, page_name: str, width: int, height: int) -> Path:
    """A harness page beside ``index_html`` that shows ``page_name`` in a width x height frame."""
    harness = index_html.with_name(f".{_MARK}-frame-{width}.html")
    harness.write_text(HARNESS.format(src=page_name, width=width, height=height, mark=_MARK))
    return harness


def _run(chromium: str, url: str, width: int, height: int, *extra: str) -> str:
    command = [
        chromium,
        "--headless",
        "--no-sandbox",  # CI containers run as root
        "--disable-gpu",
        "--hide-scrollbars",
        "--allow-file-access-from-files",
        f"--window-size={max(width, MIN_WINDOW)},{height}",
        "--virtual-time-budget=10000",
        *extra,
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{chromium} exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def inspect_page(index_html: Path | str, width: int, chromium: str | None = None) -> dict:
    """What the probe measured in the page at a viewport ``width`` CSS pixels wide."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium found on PATH (Debian: apt-get install chromium)")
    index_html = Path(index_html).resolve()
    probed = index_html.with_name(f".{_MARK}-{index_html.name}")  # beside it: same relative links
    page = index_html.read_text()
    probed.write_text(page.replace("<head>", "<head>" + PROBE, 1))
    harness = _framed(index_html, probed.name, width, 900)
    try:
        dom = _run(chromium, harness.as_uri(), width, 900, "--dump-dom")
    finally:
        probed.unlink()
        harness.unlink()
    match = re.search(rf'<pre id="{_MARK}">(.*?)</pre>', dom, re.S)
    if match is None:
        raise RuntimeError("the probe did not report: the page did not finish loading")
    return json.loads(html.unescape(match.group(1)))


def screenshot(
    index_html: Path | str, width: int, height: int, png: Path | str, chromium: str | None = None
) -> Path:
    """A screenshot of the page at ``width`` x ``height`` CSS pixels (use the page's height for
    all of it) written to ``png``."""
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium found on PATH (Debian: apt-get install chromium)")
    png, index_html = Path(png).resolve(), Path(index_html).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    harness = _framed(index_html, index_html.name, width, height)
    try:
        _run(chromium, harness.as_uri(), width, height, f"--screenshot={png}")
    finally:
        harness.unlink()
    if width < MIN_WINDOW:  # keep the frame, not the empty window beside it
        from PIL import Image

        with Image.open(png) as image:
            cropped = image.crop((0, 0, width, image.height))
        cropped.save(png)
    return png


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        for key in ("href", "src"):
            if values.get(key):
                self.targets.append(str(values[key]))


def broken_links(index_html: Path | str) -> list[str]:
    """Every href and src of the page that does not resolve: a missing file beside the page, an
    anchor with no element of that id, or anything that would need the network."""
    index_html = Path(index_html)
    parser = _Links()
    parser.feed(index_html.read_text())
    broken = []
    for target in parser.targets:
        url = urlparse(target)
        if url.scheme or url.netloc:
            broken.append(f"{target} (needs the network)")
        elif not url.path:
            if url.fragment not in parser.ids:
                broken.append(f"{target} (no element with that id)")
        elif not (index_html.parent / unquote(url.path)).is_file():
            broken.append(f"{target} (no such file)")
    return broken
