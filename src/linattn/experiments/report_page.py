"""The pages of ``linattn report``: ``report.md`` and a self-contained ``index.html``.

The HTML has its style inline and refers only to files beside it (``figures/*.png``, ``*.svg``,
``numbers/*.tex``, ``data/*.json``), so it opens from disk with no network. The Markdown written by
``table1_markdown`` and ``costs_markdown`` is turned into HTML by ``markdown_to_html``, which knows
just what those functions write: paragraphs, pipe tables, bullet lists, ``**bold**`` and ``$math$``.
"""

from __future__ import annotations

import html
import math
import re
from typing import TYPE_CHECKING

from linattn.experiments.report_setup import bench_setup, gpu_table, mqar_setup
from linattn.figures.legibility import COLUMN_PX, PADDING_PX

if TYPE_CHECKING:
    from linattn.experiments.report_contents import Report

# At most this wide (CSS pixels), the page is a phone's: tables as cards, the narrow figures.
NARROW_PX = 600
# A table with more columns than this is shown as cards on a phone.
CARD_COLUMNS = 3

STYLE = f"""
*, *::before, *::after {{ box-sizing: border-box; }}
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: {COLUMN_PX}px;
       margin: 2em auto; padding: 0 {PADDING_PX}px; color: #222; line-height: 1.45;
       overflow-wrap: break-word; }}
h1 {{ font-size: 1.6em; }}
h2 {{ border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }}
.scroll {{ overflow-x: auto; max-width: 100%; margin: .8em 0; }}
table {{ border-collapse: collapse; font-size: .92em; }}
th, td {{ border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }} td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.pass {{ color: #1d7a36; font-weight: bold; }} .fail {{ color: #b3261e; font-weight: bold; }}
td.verdict {{ white-space: nowrap; }} td.check {{ min-width: 15em; }}
td.detail {{ min-width: 18em; }} pre.printed b {{ font-weight: bold; }}
.summary {{ font-size: 1.1em; padding: .6em 1em; border-radius: 6px; background: #eef7ef; }}
.summary.failed {{ background: #fbeaea; }}
figure {{ margin: 1.5em 0; }}
figure img {{ display: block; max-width: 100%; height: auto; border: 1px solid #eee; }}
figcaption {{ font-size: .95em; margin-top: .4em; }}
code {{ overflow-wrap: anywhere; }}
pre {{ background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }}
.note {{ color: #555; font-style: italic; }}
nav ul {{ padding: 0; margin: 0; }}
nav li {{ display: inline-block; white-space: nowrap; margin: 0 1em .3em 0; }}
@media (max-width: {NARROW_PX}px) {{
  /* A phone: a wide table becomes one card per row, each value under its column's name, so
     that every column is read without scrolling sideways. */
  table.cards, table.cards tbody, table.cards tr, table.cards td {{ display: block; }}
  table.cards tr:first-child {{ display: none; }}
  table.cards tr {{ border: 1px solid #ccc; border-radius: 4px; margin: 0 0 .6em;
                   padding: .3em .6em; }}
  table.cards td {{ border: 0; padding: .1em 0; min-width: 0; text-align: left; }}
  table.cards td[data-label]::before {{ content: attr(data-label) ": "; font-weight: bold; }}
  table.cards td:empty {{ display: none; }}
  /* Figures drawn for the narrow screen (NAME-narrow.png) fill the column. */
  figure.narrow img {{ min-width: 0 !important; }}
}}
"""
GPU_INTRO = (
    "linattn's ops on CUDA tensors run fla's Triton kernels (linattn.dispatch): "
    "benchmarks/gpu.py times the PyTorch loop, fla called directly and the dispatch, and checks "
    "the dispatch against the float64 reference on the device."
)
NAV = (
    '<nav><ul><li><a href="#checks">Checks</a></li><li><a href="#table1">Table 1</a></li>'
    '<li><a href="#costs">Costs</a></li><li><a href="#figures">Figures</a></li>'
    '<li><a href="#bench">Benchmark</a></li><li><a href="#recall">Recall</a></li>'
    '<li><a href="#state-tracking">State tracking</a></li><li><a href="#gpu">GPU</a></li>'
    '<li><a href="#numbers">Numbers files</a></li>'
    '<li><a href="#environment">Machine</a></li></ul></nav>'
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _inline(text: str) -> str:
    """Escape, then **bold** -> <b>, `code` -> <code>, $math$ -> <i> (\\beta -> β), and outside
    code x_t -> x<sub>t</sub>, n^2 -> n<sup>2</sup>."""
    parts = re.split(r"(`.+?`)", _e(text))
    return "".join(
        f"<code>{part[1:-1]}</code>" if part.startswith("`") and len(part) > 1 else _prose(part)
        for part in parts
    )


def _prose(text: str) -> str:
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)

    def math_span(match: re.Match[str]) -> str:
        return "<i>" + match.group(1).replace("\\beta", "β").replace("\\", "") + "</i>"

    text = re.sub(r"\$(.+?)\$", math_span, text)
    text = re.sub(r"(?<=[\w)β])_\{?(\w+)\}?", r"<sub>\1</sub>", text)
    return re.sub(r"\^\{?(\w+)\}?", r"<sup>\1</sup>", text)


def markdown_to_html(markdown: str) -> str:
    """The Markdown subset of the experiments' printed tables as HTML."""
    blocks, out = re.split(r"\n\s*\n", markdown.strip()), []
    for block in blocks:
        lines = block.splitlines()
        if all(line.startswith("|") for line in lines):
            out.append(_table(lines))
        elif all(line.startswith("- ") for line in lines):
            out.append(
                "<ul>" + "".join(f"<li>{_inline(line[2:])}</li>" for line in lines) + "</ul>"
            )
        else:
            out.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(out)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _table(lines: list[str]) -> str:
    header, body = _cells(lines[0]), [_cells(line) for line in lines[2:]]
    rows = ["<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in header) + "</tr>"]
    labels = [_label(_inline(c)) for c in header]
    for row in body:
        cells = zip(row, labels + [""] * (len(row) - len(labels)), strict=False)
        rows.append(
            "<tr>" + "".join(_td(_inline(c), label, _numeric(c)) for c, label in cells) + "</tr>"
        )
    return _boxed("".join(rows), len(header))


def _label(header_html: str) -> str:
    """A column's name as plain text, for a card's labels (``data-label``)."""
    return html.unescape(re.sub(r"<[^>]+>", "", header_html))


def _td(content_html: str, label: str = "", numeric: bool = False, css: str = "") -> str:
    """One cell: its content, its column's name (``data-label``: a card's label on a phone)."""
    classes = " ".join(filter(None, ["num" if numeric else "", css]))
    attributes = (f' class="{classes}"' if classes else "") + (
        f' data-label="{_e(label)}"' if label else ""
    )
    return f"<td{attributes}>{content_html}</td>"


def _boxed(rows_html: str, columns: int) -> str:
    """A table in its own scrolling box; a wide one (more than ``CARD_COLUMNS`` columns) is
    shown as cards on a phone."""
    cards = ' class="cards"' if columns > CARD_COLUMNS else ""
    return f'<div class="scroll"><table{cards}>{rows_html}</table></div>'


def _numeric(cell: str) -> bool:
    return bool(re.fullmatch(r"-?[\d,.]+", cell))


def _figure(
    name: str,
    caption: str,
    width: int | None = None,
    legible: int | None = None,
    narrow: bool = False,
) -> str:
    """One figure with its caption, id ``fig-NAME``; the image links its full-size SVG.

    ``width`` (CSS pixels) is the figure's natural size; the page scales it down to the column,
    but not below ``legible``, the width at which its smallest text is still readable
    (``legibility.legible_width``): on a narrower screen it scrolls sideways in its own box,
    unless ``narrow``: then a phone is shown ``NAME-narrow.png``, drawn legible at its width.
    """
    title, _, rest = caption.partition(". ")
    size = f' width="{width}"' if width else ""
    size += f' style="min-width: {legible}px"' if legible else ""
    image = f'<img src="figures/{_e(name)}.png"{size} alt="{_e(caption)}">'
    if narrow:  # a phone gets the drawing made for its width: legends below, panels stacked
        image = (
            f'<picture><source media="(max-width: {NARROW_PX}px)" '
            f'srcset="figures/{_e(name)}-narrow.png">{image}</picture>'
        )
    css = ' class="narrow"' if narrow else ""
    return (
        f'<figure id="fig-{_e(name)}"{css}>'
        f'<div class="scroll"><a href="figures/{_e(name)}.svg">{image}</a></div>'
        f"<figcaption><b>{_e(title)}.</b> {_e(rest)} "
        f'<a href="figures/{_e(name)}.svg">Full-size SVG</a></figcaption></figure>'
    )


def _error(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.1e}"


def _checks_html(report: Report) -> str:
    """The checks as a table: the verdict beside the name, so that a phone shows both without
    scrolling (the name keeps a readable width; the other columns scroll in the table's box)."""
    header = ("#", "Check", "Verdict", "Largest error", "Tolerance", "Printed with it")
    rows = ["<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"]
    for index, check in enumerate(report.checks, start=1):
        verdict = (
            '<span class="pass">PASS</span>' if check.passed else '<span class="fail">FAIL</span>'
        )
        tolerance = "" if not check.tolerance else _error(check.tolerance)
        rows.append(
            "<tr>"
            + _td(str(index), header[0], numeric=True)
            + _td(_e(check.name), css="check")
            + _td(verdict, css="verdict")
            + _td(_error(check.error), header[3], numeric=True)
            + _td(tolerance, header[4], numeric=True)
            + _td(_e(check.detail), header[5] if check.detail else "", css="detail")
            + "</tr>"
        )
    return _boxed("".join(rows), len(header))


def _bench_rows(report: Report) -> list[tuple[str, str, str]]:
    from linattn.figures.plots import bench_series

    rows = []
    for name, points in bench_series(report.bench or {"results": []}).items():
        for T, seconds in points:
            rows.append((name, f"{T:,.0f}", f"{seconds * 1e3:,.3f}"))
    return rows


# the recall table's columns: runs are seeds; solved counts the runs at accuracy >= 0.9
MQAR_COLUMNS = ("series", "state numbers", "accuracy (mean)", "min - max", "solved", "runs")


def _mqar_rows(report: Report) -> list[tuple[str, ...]]:
    from linattn.figures.plots import mqar_points

    rows = []
    for name, points in mqar_points(report.mqar or []).items():
        for state, s in points:
            spread = f"{s['min']:.3f} - {s['max']:.3f}"
            row = (name, f"{state:,.0f}", f"{s['mean']:.3f}", spread, str(s["solved"]))
            rows.append((*row, str(s["runs"])))
    return rows


def _simple_table(
    header: tuple[str, ...] | None, rows: list[tuple[str, ...]], numbers: bool = True
) -> str:
    """A table with one header row (none when ``header`` is None)."""
    head = "" if header is None else "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"
    labels = list(header or ())
    body = "".join(
        "<tr>"
        + "".join(
            _td(_e(c), labels[i] if i < len(labels) else "", numbers and _numeric(c))
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return _boxed(head + body, len(labels))


def _passed(report: Report) -> tuple[int, int]:
    return sum(check.passed for check in report.checks), len(report.checks)


def render_html(report: Report) -> str:
    """The whole page as one HTML document."""
    passed, total = _passed(report)
    failed = [c.name for c in report.checks if not c.passed]
    summary = (
        f"{passed} of {total} checks passed"
        if not failed
        else f"{len(failed)} of {total} checks FAILED: " + "; ".join(failed)
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>linattn report: attention as matrix algebra, recomputed</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>Attention as matrix algebra: every claim recomputed</h1>",
        f"<p>Made by <code>{_e(report.command)}</code> on {_e(report.date)}, in "
        f"{report.seconds:.0f} s, with linattn {_e(report.environment.get('linattn', ''))}.</p>",
        f'<p class="summary{" failed" if failed else ""}">{_e(summary)}</p>',
        NAV,
        '<h2 id="checks">Checks</h2>',
        "<p>Every numerical check the spec prints, with the spec's seeds, and every claim it "
        "proves or states, computed by the float64 reference (<code>linattn verify</code>).</p>",
        _checks_html(report),
        "<details><summary>As printed by <code>linattn verify</code></summary>"
        f"<pre>{_e(report.verify_text)}</pre></details>",
        '<h2 id="table1">Table 1</h2>',
        markdown_to_html(report.table1_text),
        _figure(
            "table1",
            "Table 1 as a plot. The read error of each memory against the number "
            "of stored pairs n, with the two theory curves (dotted).",
            report.widths.get("table1"),
            report.legible.get("table1"),
            "table1-narrow" in report.widths,
        ),
        _printed("table1", report.table1_text),
        '<h2 id="costs">Costs</h2>',
        markdown_to_html(report.costs_text),
        _printed("costs", report.costs_text),
        '<h2 id="figures">Figures</h2>',
        "<p>The spec's nine figures, and Figure 10, which places the mechanisms after the spec "
        "on Figure 3's axes, drawn from numbers computed by "
        "<code>linattn.reference</code>. On a narrow screen a figure keeps a size at which its "
        "text can be read and scrolls sideways; each image opens its full-size SVG.</p>",
        *(
            _figure(
                f["name"], f["caption"], report.widths.get(f["name"]), report.legible.get(f["name"])
            )
            for f in report.figures
        ),
        '<h2 id="bench">Benchmark</h2>',
        *_bench_section(report),
        '<h2 id="recall">Recall</h2>',
        *_recall_section(report),
        '<h2 id="state-tracking">State tracking</h2>',
        *_state_tracking_section(report),
        '<h2 id="gpu">GPU</h2>',
        f"<p>{GPU_INTRO} From <code>{_e(report.gpu_source)}</code>.</p>",
        markdown_to_html(gpu_table(report.gpu)),
        *_numbers_and_machine(report),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _printed(command: str, markdown: str) -> str:
    """A collapsed block with what ``linattn COMMAND`` prints, its layout kept and its Markdown
    markup (**bold**, $math$) rendered, not shown raw."""
    lines = "\n".join(_inline(line) if line.strip() else "" for line in markdown.splitlines())
    return (
        f"<details><summary>As printed by <code>linattn {command}</code></summary>"
        f'<pre class="printed">{lines}</pre></details>'
    )


def _source(path: str, note: str) -> str:
    return f"<p>From <code>{_e(path)}</code> {_e(note)}.</p>"


def _bench_section(report: Report) -> list[str]:
    """The benchmark: which file, its setup and machine, the plot and the table."""
    if report.bench is None:
        return [
            f'<p class="note">No benchmark results at <code>{_e(report.bench_source)}</code>: '
            f"{_e(report.bench_note)}.</p>"
        ]
    return [
        _source(report.bench_source, report.bench_note),
        f"<p>{_e(bench_setup(report.bench))}</p>",
        _figure(
            "bench",
            "Benchmark. Time of one forward pass: the forms timed at several lengths against "
            "T, one colour per mechanism (left); the forms timed at one length side by side, "
            "one marker per form (right).",
            report.widths.get("bench"),
            report.legible.get("bench"),
            "bench-narrow" in report.widths,
        ),
        _simple_table(("series", "T", "milliseconds"), _bench_rows(report)),
    ]


def _recall_section(report: Report) -> list[str]:
    """The recall sweep: which file, its setup, the plot and the table."""
    if report.mqar is None:
        return [
            f'<p class="note">No recall results at <code>{_e(report.mqar_source)}</code>: '
            f"{_e(report.mqar_note)}.</p>"
        ]
    return [
        _source(report.mqar_source, report.mqar_note),
        f"<p>{_e(mqar_setup(report.mqar))}</p>",
        _figure(
            "mqar",
            "Recall. Multi-query associative recall accuracy against the state size of one block "
            "(the mean over the seeds; bars from their min to their max).",
            report.widths.get("mqar"),
            report.legible.get("mqar"),
            "mqar-narrow" in report.widths,
        ),
        _simple_table(MQAR_COLUMNS, _mqar_rows(report)),
    ]


def _state_tracking_section(report: Report) -> list[str]:
    """The state-tracking sweep: which file, the figure and the table (mean over seeds, spread)."""
    from linattn.experiments.state_tracking.results import results_table

    if report.state_tracking is None:
        return [
            f'<p class="note">No state-tracking results at '
            f"<code>{_e(report.state_tracking_source)}</code>: "
            f"{_e(report.state_tracking_note)}.</p>"
        ]
    return [
        _source(report.state_tracking_source, report.state_tracking_note),
        f"<p>{_e(report.state_tracking_setup)}</p>",
        _figure(
            "state-tracking",
            "State tracking. Per-token accuracy against the test length, one panel per task, "
            "the mean over seeds and the band from the lowest to the highest seed.",
            report.widths.get("state-tracking"),
            report.legible.get("state-tracking"),
            "state-tracking-narrow" in report.widths,
        ),
        markdown_to_html(results_table(report.state_tracking)),
    ]


def _numbers_and_machine(report: Report) -> list[str]:
    """The numbers files and data, and the machine and versions this report was built on."""
    return [
        '<h2 id="numbers">Numbers files</h2>',
        "<p>The TeX macros that the spec's appendix writes for its TikZ figures: "
        + ", ".join(
            f'<a href="numbers/{_e(n)}"><code>{_e(n)}</code></a>' for n in report.numbers_files
        )
        + ". The computed data: "
        + ", ".join(
            f'<a href="data/{n}"><code>{n}</code></a>'
            for n in ("verify.json", "table1.json", "costs.json")
        )
        + ".</p>",
        '<h2 id="environment">This report\'s machine</h2>',
        "<p>The machine and the versions this report was built on; the benchmark and recall "
        "results above were measured where their setup says.</p>",
        _simple_table(
            None,
            [(k, v) for k, v in report.environment.items()] + [("date", report.date)],
            numbers=False,
        ),
    ]


def render_markdown(report: Report) -> str:
    """The same content as Markdown, the printed outputs verbatim."""
    passed, total = _passed(report)
    lines = [
        "# Attention as matrix algebra: every claim recomputed",
        "",
        f"Made by `{report.command}` on {report.date}, in {report.seconds:.0f} s. "
        f"{passed} of {total} checks passed.",
        "",
        "## Checks",
        "",
        "As printed by `linattn verify`:",
        "",
        "```text",
        report.verify_text,
        "```",
        "",
        "## Table 1",
        "",
        report.table1_text,
        "",
        "![Table 1 as a plot](figures/table1.png)",
        "",
        "## Costs",
        "",
        report.costs_text,
        "",
        "## Figures",
        "",
    ]
    for f in report.figures:
        lines += [f"![{f['caption']}](figures/{f['name']}.png)", "", f["caption"], ""]
    lines += _results_markdown(report)
    lines += ["", "## This report's machine", ""]
    lines += [f"- {k}: {v}" for k, v in report.environment.items()]
    return "\n".join(lines) + "\n"


def _results_markdown(report: Report) -> list[str]:
    """The Benchmark and Recall sections of report.md."""
    lines: list[str] = []
    lines += ["## Benchmark", ""]
    if report.bench is not None:
        lines += [
            f"From `{report.bench_source}` {report.bench_note}.",
            "",
            bench_setup(report.bench),
            "",
            "![Benchmark](figures/bench.png)",
            "",
            "| series | T | milliseconds |",
            "|---|---|---|",
        ]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in _bench_rows(report)]
    else:
        lines.append(f"No benchmark results at `{report.bench_source}`: {report.bench_note}.")
    lines += ["", "## Recall", ""]
    if report.mqar is not None:
        lines += [
            f"From `{report.mqar_source}` {report.mqar_note}.",
            "",
            mqar_setup(report.mqar),
            "",
            "![Recall](figures/mqar.png)",
            "",
            "| " + " | ".join(MQAR_COLUMNS) + " |",
            "|" + "---|" * len(MQAR_COLUMNS),
        ]
        lines += ["| " + " | ".join(row) + " |" for row in _mqar_rows(report)]
    else:
        lines.append(f"No recall results at `{report.mqar_source}`: {report.mqar_note}.")
    lines += _state_tracking_markdown(report)
    return lines + ["", "## GPU", "", f"{GPU_INTRO} From `{report.gpu_source}`.", "",
                    gpu_table(report.gpu)]  # fmt: skip


def _state_tracking_markdown(report: Report) -> list[str]:
    """The State tracking section of report.md."""
    from linattn.experiments.state_tracking.results import results_table

    lines = ["", "## State tracking", ""]
    if report.state_tracking is None:
        note = report.state_tracking_note
        return [*lines, f"No state-tracking results at `{report.state_tracking_source}`: {note}."]
    return [
        *lines,
        f"From `{report.state_tracking_source}` {report.state_tracking_note}.",
        "",
        report.state_tracking_setup,
        "",
        "![State tracking](figures/state-tracking.png)",
        "",
        results_table(report.state_tracking),
    ]
