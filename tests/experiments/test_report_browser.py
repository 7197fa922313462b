"""The report page in headless Chromium at 1,280 and 390 px: no horizontal overflow, every image
loaded, every figure and plot legible as shown, every table legible (no broken word, no small
text, the checks' verdict on screen beside a readable name), every link resolves, no console
error; full-page screenshots kept under runs/browser/.

Skipped when no Chromium is installed, except in CI (the environment variable CI set, as
``.ci/run`` does), where a missing browser is a failure: ``.ci/run`` installs Debian's chromium.
"""

import contextlib
import io
import os
import shutil
from pathlib import Path

import pytest

from linattn import cli
from linattn.experiments import report, report_browser, table1
from linattn.experiments.state_tracking import results as state_tracking_results
from linattn.figures import FIGURES, legibility, plots, render_figures, style
from linattn.results_files import read_results

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "runs" / "browser"
WIDTHS = (1280, 390)
TABLE1_R = report.TABLE1_R
CHROMIUM = report_browser.find_chromium()

if CHROMIUM is None and os.environ.get("CI"):
    pytest.fail("CI needs Chromium for the browser test: apt-get install chromium", pytrace=False)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """A report with the committed benchmark and recall results, so that every plot is there."""
    out = tmp_path_factory.mktemp("browser") / "report"
    argv = ["report", "--out", str(out), "--quiet", "--table1-repetitions", "2"]
    argv += ["--bench", str(ROOT / "benchmarks" / "results" / "bench.json")]
    argv += ["--mqar", str(ROOT / "benchmarks" / "results" / "mqar-cpu.jsonl")]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 0
    return out / "index.html"


@pytest.fixture(scope="module", params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def seen(request, page):
    return request.param, report_browser.inspect_page(page, request.param, CHROMIUM)


def test_no_horizontal_overflow(seen):
    width, result = seen
    assert result["viewport"] == width
    assert result["page"] <= width, result["overflowing"][:10]
    assert result["overflowing"] == []  # nothing sticks out, outside the tables' scroll boxes


PLOTS = ("table1", "bench", "mqar", "state-tracking")


def shown_file(image: dict) -> str:
    """The name (no suffix) of the file an image shows: NAME-narrow on a phone, for a plot."""
    return Path(image["current"] or image["src"]).stem


def test_every_image_loads_and_fits(seen):
    # A spec figure fits the viewport, or scrolls sideways inside its own box (kept at its
    # legible width on a phone: see test_every_figure_is_legible_as_shown). A data plot always
    # fits, legends and all: on a phone it is the drawing made for that width.
    width, result = seen
    names = {Path(image["src"]).stem for image in result["images"]}
    assert {"softmax-attention-products", "series-roadmap", *PLOTS} <= names
    for image in result["images"]:
        assert image["loaded"], image
        assert image["shown"] > 0 and (image["inside"] or image["scrolls"]), image
    for image in (i for i in result["images"] if Path(i["src"]).stem in PLOTS):
        assert image["inside"], (width, image)
        narrow = shown_file(image).endswith("-narrow")
        assert narrow == (width < 600), (width, image)


@pytest.fixture(scope="module")
def text_kept(tmp_path_factory):
    """The nine figures drawn again with their SVG text kept as text, to measure it (the page's
    SVGs draw text as paths)."""
    out = tmp_path_factory.mktemp("text-kept")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(style, "SVG_FONTTYPE", "none")
        render_figures(out)
    return out


def test_every_figure_is_legible_as_shown(seen, text_kept):
    # The smallest text of each of the spec's figures at the width Chromium laid it out at.
    width, result = seen
    shown = {Path(image["src"]).stem: image["shown"] for image in result["images"]}
    for figure in FIGURES:
        svg = text_kept / f"{figure.name}.svg"
        px = legibility.text_px_at(svg, shown[figure.name])
        print(f"{figure.name} at {width} px: shown {shown[figure.name]:.0f} px, text {px:.1f} px")
        assert px >= legibility.MINIMUM_PX - 0.05, (figure.name, width, px)


@pytest.fixture(scope="module")
def plots_kept(tmp_path_factory):
    """The page's three data plots drawn again from the same files, their SVG text kept."""
    out = tmp_path_factory.mktemp("plots-kept")
    results = ROOT / "benchmarks" / "results"
    rows = table1.compute_table1(TABLE1_R, report.TABLE1_NS, 2)
    tracked = state_tracking_results.aggregate(
        read_results(ROOT / "benchmarks" / "results" / "state-tracking-default.jsonl")
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(style, "SVG_FONTTYPE", "none")
        for narrow, suffix in ((False, ""), (True, "-narrow")):
            plots.table1_plot(rows, out, TABLE1_R, narrow=narrow)
            plots.bench_plot(plots.load_bench(results / "bench.json"), out, narrow=narrow)
            plots.mqar_plot(plots.load_mqar(results / "mqar-cpu.jsonl"), out, narrow=narrow)
            figure = state_tracking_results.figure(tracked, narrow=narrow)
            style.save(figure, out, "state-tracking" + suffix)
    return out


def test_every_plot_is_legible_as_shown(seen, plots_kept):
    # The Table 1, benchmark, recall and state-tracking plots, legends and all, at the width
    # Chromium shows them: on a phone the drawing made for it, whole on the screen.
    width, result = seen
    shown = {shown_file(image): image["shown"] for image in result["images"]}
    for name in PLOTS:
        name += "-narrow" if width < 600 else ""
        px = legibility.text_px_at(plots_kept / f"{name}.svg", shown[name])
        print(f"{name} at {width} px: shown {shown[name]:.0f} px, text {px:.1f} px")
        assert px >= legibility.MINIMUM_PX - 0.05, (name, width, px)


def test_every_table_is_legible(seen):
    # Every table: no word broken across lines, no text under 11 px, no empty header cell.
    width, result = seen
    sections = [table["section"] for table in result["tables"]]
    assert sections == [
        "checks",
        "table1",
        "costs",
        "bench",
        "recall",
        "state-tracking",
        "environment",
    ]
    for table in result["tables"]:
        assert table["broken_words"] == [], (width, table["section"], table["broken_words"][:5])
        assert table["smallest_text"] >= legibility.MINIMUM_PX, (width, table["section"])
        assert all(cell.strip() for cell in table["header"]), (width, table["section"])


def test_the_checks_table_reads_on_a_phone(seen):
    # The verdict beside the name, inside the screen (not "PA" at its edge); the name column not
    # squeezed. On a phone each check is a card: every value of it on the screen.
    width, result = seen
    checks = result["tables"][0]
    assert checks["header"][:3] == ["#", "Check", "Verdict"]
    number, name, verdict = checks["columns"][:3]
    assert verdict["right"] <= width - legibility.PADDING_PX + 0.5, (width, verdict)
    assert name["narrowest"] >= 200, (width, name)
    if width >= 600:
        assert checks["tallest_row"] <= 200, (width, checks["tallest_row"])


def test_every_table_value_is_on_the_screen(seen):
    # No table hides a column past the right edge: at 390 px the wide ones are cards.
    width, result = seen
    for table in result["tables"]:
        assert table["right"] <= width - legibility.PADDING_PX + 0.5, (width, table["section"])


def test_no_console_error(seen):
    _, result = seen
    assert result["errors"] == []


def test_every_link_resolves(page):
    assert report_browser.broken_links(page) == []


def test_a_broken_link_and_a_missing_image_are_found(page, tmp_path):
    # The checks can fail: the same page with one image removed and one anchor renamed.
    copy = tmp_path / "report"
    shutil.copytree(page.parent, copy)
    (copy / "figures" / "reordering.png").unlink()
    text = (copy / "index.html").read_text().replace('href="#checks"', 'href="#nowhere"')
    (copy / "index.html").write_text(text)
    assert sorted(report_browser.broken_links(copy / "index.html")) == [
        "#nowhere (no element with that id)",
        "figures/reordering.png (no such file)",
    ]
    result = report_browser.inspect_page(copy / "index.html", 390, CHROMIUM)
    missing = [image for image in result["images"] if not image["loaded"]]
    assert [Path(image["src"]).name for image in missing] == ["reordering.png"]
    assert any("reordering.png" in error for error in result["errors"])


def test_screenshots_are_kept(seen, page):
    width, result = seen
    png = report_browser.screenshot(
        page, width, min(result["height"], 16_000), SCREENSHOTS / f"report-{width}px.png", CHROMIUM
    )
    assert png.stat().st_size > 10_000
