"""Data plots: Table 1 against n, the benchmark's time against T, recall against state size.

The last two read result files written by other commands (``linattn bench`` and ``linattn mqar``);
their formats are documented in ``load_bench`` and ``load_mqar``, which check them and raise a
``ValueError`` naming the file and the problem. They are the one bench and one recall plot: the
report draws them (``bench_plot``, ``mqar_plot``: PNG and SVG) and so do the commands themselves
(``linattn bench``'s ``bench.png``, ``linattn mqar --plot``: ``bench_figure`` and ``mqar_figure``
saved with ``style.save_png``).

``runs/bench.json`` (one JSON object)::

    {"meta": {...free-form: device, dtype, B, H, K, torch, ...},
     "results": [{"name": "delta rule, chunk", "T": 1024, "seconds": 0.0123,
                  ...optional: "method", "mode", "peak_bytes", "repeats"}, ...]}

``name`` labels a series (when missing, "method" and "mode" make one); ``seconds`` is the time of
one forward pass (the median of the repeats). The file that ``linattn bench`` writes
(``runs/bench/bench.json``: ``{"config", "machine", "rows": [{"mechanism", "mode", "T",
"forward_s", ...}], ...}``) is read too: each row becomes ``{"name": "mechanism, mode", "T",
"seconds": forward_s}``. ``runs/mqar.jsonl`` (one JSON object per line)::

    {"mechanism": "deltanet", "state_numbers": 8192, "accuracy": 0.97,
     ...optional: "preset", "d_model", "seed", ...}

``state_numbers`` is the recurrent state (or KV cache) of one block in numbers; ``accuracy`` the
recall accuracy in [0, 1]. Rows with the same series and state size are runs of one
configuration (several seeds): ``mqar_points`` gives their mean, min, max and how many solved the
task (accuracy >= ``SOLVED``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from linattn import reference
from linattn.figures import style
from linattn.results_files import (  # noqa: F401 (re-exported: the formats above)
    bench_results,
    is_number,
    load_bench,
    load_mqar,
)

# The width in inches of a plot drawn for a phone: at most the width (4.5 inches, 434 CSS px) at
# which a 358 px column (a 390 px screen less its margins) still shows SMALLEST_TEXT at 11 px.
NARROW_WIDTH = 4.2


def dodged(xs: Sequence[float], index: int, count: int, spread: float = 0.05) -> list[float]:
    """``xs`` on a log axis moved sideways by ``index`` of ``count`` series (a factor of
    2**(spread * offset)): series that share an x stay side by side instead of hiding each other.
    A drawing aid only: the tables give the exact values."""
    factor = 2 ** (spread * (index - (count - 1) / 2))
    return [x * factor for x in xs]


TABLE1_SERIES = (
    ("additive", "additive rule", style.KEY, "o", "-"),
    ("delta_all", "delta rule, all pairs", style.STATE, "s", "-"),
    ("delta_newest", "delta rule, 8 newest pairs", style.STATE, "^", "--"),
    ("least_squares", "least squares", style.VALUE, "D", "-"),
)


def table1_plot(
    rows: Sequence[dict], out_dir: Path | str, r: int = 32, narrow: bool = False
) -> list[Path]:
    """Table 1 (spec 7.3) as the read error of each memory against n, with the two theory curves.

    ``rows`` are those of ``linattn.experiments.table1.compute_table1``. ``narrow``: drawn for a
    phone's column (``NARROW_WIDTH`` inches, the legend below), as ``table1-narrow``.
    """
    if len(rows) == 0 or any("n" not in row for row in rows):
        raise ValueError("rows must be a non-empty list of Table 1 rows, each with its 'n'")
    plt = style.pyplot()
    ns = np.array([row["n"] for row in rows])
    fig, ax = plt.subplots(figsize=(NARROW_WIDTH, 4.2) if narrow else (7.5, 4.6))
    grid = np.unique(np.geomspace(max(1, ns.min()), ns.max(), 200).astype(int))
    theory = np.array([reference.recall_theory(int(n), r) for n in grid])
    ax.plot(grid, theory[:, 0], color=style.KEY, lw=1, ls=":", label="theory, additive")
    ax.plot(grid, theory[:, 1], color=style.VALUE, lw=1, ls=":", label="theory, least squares")
    for key, label, color, marker, line in TABLE1_SERIES:
        ax.plot(ns, [row[key] for row in rows], marker=marker, color=color, ls=line, label=label)
    ax.axhline(1.0, color=style.SCORE, lw=0.8)
    ax.text(
        ns.min(), 1.02, "a memory that returns zero", fontsize=10, color=style.SCORE, va="bottom"
    )
    ax.axvline(r, color=style.SCORE, lw=0.8, ls="--")
    ax.text(r * 1.04, 1.6, f"$n = r = {r}$", fontsize=10, color=style.SCORE, va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("pairs stored, $n$")
    ax.set_ylabel("root-mean-square read error")
    title = f"Table 1: read error of three memories, $r = d = {r}$"
    ax.set_title(title.replace(", ", ",\n") if narrow else title)
    if narrow:
        ax.legend(frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    else:
        ax.legend(frameon=False, loc="upper left")
    fig.tight_layout()
    return style.save(fig, out_dir, "table1-narrow" if narrow else "table1")


def bench_series(data: dict) -> dict[str, list[tuple[float, float]]]:
    """The benchmark's rows as {series name: [(T, seconds), ...] sorted by T}."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in data["results"]:
        name = row.get("name") or ", ".join(str(row[k]) for k in ("method", "mode") if k in row)
        series[name].append((float(row["T"]), float(row["seconds"])))
    return {name: sorted(points) for name, points in series.items()}


# One colour per mechanism (a qualitative palette a reader tells apart), one line style per form.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#7f7f7f", "#bcbd22")  # fmt: skip
FORM_STYLES = {"chunk": ("-", "o"), "parallel": (":", "s"), "recurrent": ("--", "^")}


def _split_series(name: str) -> tuple[str, str]:
    """ "delta, chunk" -> ("delta", "chunk"); a name without a known form keeps it whole."""
    mechanism, _, form = name.rpartition(", ")
    return (mechanism, form) if mechanism and form in FORM_STYLES else (name, "")


def bench_plot(data: dict, out_dir: Path | str, narrow: bool = False) -> list[Path]:
    """``bench_figure`` as ``out_dir/bench.png`` and ``.svg`` (``bench-narrow``: for a phone)."""
    return style.save(bench_figure(data, narrow), out_dir, "bench-narrow" if narrow else "bench")


def bench_figure(data: dict, narrow: bool = False) -> Any:
    """The benchmark's time of one forward pass (a matplotlib Figure), the legends beside the
    axes: the series timed at several lengths against T, log-log, one colour per mechanism and
    one line style per form; when some series were timed at one length only (the parallel and
    recurrent forms), a second panel shows every form timed at that length side by side, one
    marker per form, so that no series is a lone marker hidden under another."""
    plt = style.pyplot()
    from matplotlib.lines import Line2D

    series = bench_series(data)
    lone = {name: points[0] for name, points in series.items() if len(points) == 1}
    lines = {name: points for name, points in series.items() if name not in lone}
    mechanisms = list(dict.fromkeys(_split_series(name)[0] for name in series))
    colours = {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(mechanisms)}
    if lone and lines and narrow:  # a phone: the two panels one above the other
        fig, (ax, side) = plt.subplots(
            2, 1, figsize=(NARROW_WIDTH, 8.6), layout="constrained", height_ratios=(1.4, 1)
        )
        _lone_panel(side, series, lone, mechanisms, colours)
    elif lone and lines:
        fig, (ax, side) = plt.subplots(
            1, 2, figsize=(11.2, 4.8), layout="constrained", width_ratios=(1.6, 1)
        )
        _lone_panel(side, series, lone, mechanisms, colours)
    else:
        fig, ax = plt.subplots(
            figsize=(NARROW_WIDTH, 5.0) if narrow else (9.5, 4.8), layout="constrained"
        )
    forms = _lines_panel(ax, lines or series, colours)
    for form in (_split_series(name)[1] for name in lone):
        forms += [form] if form and form not in forms else []
    by_mechanism = [Line2D([], [], color=colours[m], lw=2.5, label=m) for m in mechanisms]
    by_form = [
        Line2D([], [], color=style.INK, ls=FORM_STYLES[f][0], marker=FORM_STYLES[f][1], label=f)
        for f in forms
    ]
    if narrow:  # below the panels, side by side: beside them they would take half the width
        fig.legend(handles=by_mechanism, title="mechanism", frameon=False, loc="outside lower left")
        fig.legend(handles=by_form, title="form", frameon=False, loc="outside lower right")
    else:
        fig.legend(
            handles=by_mechanism, title="mechanism", frameon=False, loc="outside right upper"
        )
        fig.legend(handles=by_form, title="form", frameon=False, loc="outside right lower")
    if narrow:
        ax.set_title("Benchmark:\none forward pass")
        ax.tick_params(axis="x", labelrotation=30)
    return fig


def _lines_panel(ax: Any, series: dict, colours: dict[str, str]) -> list[str]:
    """Each series against T, log-log; returns the forms drawn, in order."""
    lengths: set[float] = set()
    forms: list[str] = []
    for name, points in series.items():
        mechanism, form = _split_series(name)
        line, marker = FORM_STYLES.get(form, ("-", "o"))
        T, seconds = zip(*points, strict=True)
        ax.loglog(T, seconds, ls=line, marker=marker, color=colours[mechanism], lw=1.8)
        lengths.update(T)
        forms += [form] if form and form not in forms else []
    ax.set_xticks(sorted(lengths), [f"{T:,.0f}" for T in sorted(lengths)])
    ax.minorticks_off()
    ax.set_xlabel("sequence length $T$ (tokens)")
    ax.set_ylabel("seconds per forward pass")
    ax.set_title("Benchmark: one forward pass")
    ax.grid(True, which="major", color="#dddddd", lw=0.6)
    return forms


def _lone_panel(
    ax: Any, series: dict, lone: dict, mechanisms: list[str], colours: dict[str, str]
) -> None:
    """At each length where a series was timed alone, every form of every mechanism timed there:
    one row per mechanism, the time on a log axis, one marker per form."""
    lengths = sorted({T for T, _ in lone.values()})
    rows = [
        m
        for m in mechanisms
        if any(
            _split_series(n)[0] == m and {T for T, _ in series[n]} & set(lengths) for n in series
        )
    ]
    for name, points in series.items():
        mechanism, form = _split_series(name)
        if mechanism not in rows:
            continue
        for T, seconds in points:
            if T in lengths:
                marker = FORM_STYLES.get(form, ("-", "o"))[1]
                ax.plot(seconds, rows.index(mechanism), marker=marker, ls="none", ms=8,
                        color=colours[mechanism], markerfacecolor="none", mew=1.8)  # fmt: skip
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("seconds per forward pass")
    ax.set_title("At $T$ = " + ", ".join(f"{T:,.0f}" for T in lengths) + ": every form")
    ax.grid(True, axis="x", which="major", color="#dddddd", lw=0.6)


def scaling_figure(result: dict) -> Any:
    """``linattn bench --threads 1,2,...``'s scaling (its scaling.json): the speed-up over the
    fewest threads (left; the dotted line is ideal scaling) and the efficiency against the
    matrix-product rate at the same thread count (right), against threads, one colour per
    mechanism, solid the forward pass and dashed forward + backward, at the longest T timed."""
    plt = style.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), layout="constrained")
    rows = result["rows"]
    T = max(r["T"] for r in rows)
    mechanisms = list(dict.fromkeys(r["mechanism"] for r in rows))
    for i, mechanism in enumerate(mechanisms):
        mine = sorted((r for r in rows if r["mechanism"] == mechanism and r["T"] == T),
                      key=lambda r: r["threads"])  # fmt: skip
        threads = [r["threads"] for r in mine]
        for key, line in (("forward", "-"), ("forward_backward", "--")):
            if all(f"{key}_speedup" in r for r in mine):
                colour = PALETTE[i % len(PALETTE)]
                label = mechanism if key == "forward" else None
                left.plot(threads, [r[f"{key}_speedup"] for r in mine], line, marker="o",
                          color=colour, label=label)  # fmt: skip
                right.plot(threads, [r[f"{key}_efficiency"] for r in mine], line, marker="o",
                           color=colour)  # fmt: skip
    counts = result["threads"]
    ideal = [n / counts[0] for n in counts]
    left.plot(counts, ideal, ":", color=style.INK, label="ideal: speed-up = threads")
    for ax, label in ((left, f"speed-up over {counts[0]} thread(s)"),
                      (right, "efficiency (rate / matrix-product rate)")):  # fmt: skip
        ax.set_xticks(counts)
        ax.set_xlabel("threads")
        ax.set_ylabel(label)
        ax.grid(True, color="#dddddd", lw=0.6)
    right.set_ylim(bottom=0)
    fig.suptitle(
        f"Scaling with threads, chunk form, T = {T:,} (solid: forward; dashed: + backward)"
    )
    fig.legend(frameon=False, loc="outside right center")
    return fig


# A recall run counts as solving MQAR at this held-out accuracy (the tables' "solved").
SOLVED = 0.9


def spread(accuracies: Sequence[float]) -> dict:
    """Mean, min, max, standard error (0 for one run), runs and runs solved (>= ``SOLVED``) of the
    accuracies of several runs (seeds) of one configuration."""
    a = np.asarray(accuracies, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"accuracies must be a non-empty list of numbers, got {accuracies!r}")
    sem = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else 0.0
    return {
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "sem": sem,
        "runs": int(a.size),
        "solved": int((a >= SOLVED).sum()),
    }


def mqar_points(rows: Sequence[dict]) -> dict[str, list[tuple[float, dict]]]:
    """{series: [(state numbers, ``spread`` of its runs' accuracies), ...] sorted by state}.

    A series is a mechanism, with its preset when the file holds several presets and its fillers
    (``random_non_queries``) when it holds both.
    """
    presets = {row.get("preset") for row in rows}
    fillers = {bool(row.get("random_non_queries")) for row in rows}
    groups: dict[tuple[str, float], list[float]] = defaultdict(list)
    for row in rows:
        name = str(row.get("mechanism") or row.get("mixer"))
        if len(presets) > 1:
            name += f" ({row.get('preset')})"
        if len(fillers) > 1:
            name += ", random fillers" if row.get("random_non_queries") else ", blank fillers"
        groups[(name, float(row["state_numbers"]))].append(float(row["accuracy"]))
    series: dict[str, list[tuple[float, dict]]] = defaultdict(list)
    for (name, state), accuracies in sorted(groups.items()):
        series[name].append((state, spread(accuracies)))
    return dict(series)


def mqar_series(rows: Sequence[dict]) -> dict[str, list[tuple[float, float, int]]]:
    """{series: [(state numbers, mean accuracy, runs), ...] sorted by state size}
    (``mqar_points`` without the spread)."""
    return {
        name: [(state, s["mean"], s["runs"]) for state, s in points]
        for name, points in mqar_points(rows).items()
    }


def mqar_plot(rows: Sequence[dict], out_dir: Path | str, narrow: bool = False) -> list[Path]:
    """``mqar_figure`` as ``out_dir/mqar.png`` and ``.svg`` (``mqar-narrow``: for a phone)."""
    return style.save(
        mqar_figure(rows, narrow=narrow), out_dir, "mqar-narrow" if narrow else "mqar"
    )


def mqar_figure(
    rows: Sequence[dict], title: str = "Multi-query associative recall", narrow: bool = False
) -> Any:
    """Recall accuracy against the state size of one block: one colour per mechanism (dashed with
    random fillers), the mean over the runs (seeds) with bars from their min to their max, the
    legend beside the axes (below them when ``narrow``: drawn for a phone). Series that share a
    state size are drawn side by side (``dodged``), so that none hides another."""
    plt = style.pyplot()
    points_by_name = mqar_points(rows)
    # Narrow, the legend sits below the axes, a line a series: the figure grows with it.
    height = 4.0 + 0.22 * len(points_by_name)
    fig, ax = plt.subplots(
        figsize=(NARROW_WIDTH, max(7.0, height))
        if narrow
        else (9.0, max(4.8, 0.2 * len(points_by_name))),
        layout="constrained",
    )
    order: dict[str, int] = {}
    sharing: dict[float, list[str]] = defaultdict(list)
    for name, points in points_by_name.items():
        for x, _ in points:
            sharing[x].append(name)
    for name, points in points_by_name.items():
        # Past the palette's ten colours a mechanism repeats a colour with hollow markers, so
        # that no two mechanisms are drawn alike.
        index = order.setdefault(name.split(",")[0], len(order))
        colour = PALETTE[index % len(PALETTE)]
        face = colour if (index // len(PALETTE)) % 2 == 0 else "white"
        state = [dodged([x], sharing[x].index(name), len(sharing[x]))[0] for x, _ in points]
        mean = np.array([s["mean"] for _, s in points])
        low = mean - np.array([s["min"] for _, s in points])
        high = np.array([s["max"] for _, s in points]) - mean
        dashed = name.endswith("random fillers")
        ax.errorbar(state, mean, yerr=(low, high), marker="s" if dashed else "o", mfc=face,
                    color=colour, lw=1.8, ls="--" if dashed else "-", capsize=3,
                    label=name)  # fmt: skip
    ax.set_xscale("log")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("state of one block (numbers; KV cache for softmax)")
    ax.set_ylabel("recall accuracy (mean; bars: min to max)")
    ax.set_title(title.replace(" associative", "\nassociative") if narrow else title)
    ax.grid(True, which="major", color="#dddddd", lw=0.6)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    # Ticks at 1, 2 and 5 of each decade, written out: 3x10^3, 4x10^3, ... collide
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if narrow:
        ax.set_ylabel("recall accuracy\n(mean; bars: min to max)")
        ax.set_xlabel("state of one block\n(numbers; KV cache for softmax)")
    where = "outside lower center" if narrow else "outside right upper"
    fig.legend(frameon=False, loc=where, title="mechanism")
    return fig
