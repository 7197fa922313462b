"""The table and the figure of ``linattn state-tracking``, computed from its results rows.

``aggregate`` groups the rows by (task, mechanism, layers) and gives, at each test length, the mean
per-token accuracy over the seeds and its spread (min, max); the table and the figure show only
what it computes, so a cell in either is a function of the results file alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from linattn.experiments.state_tracking.sweep import LABELS
from linattn.experiments.state_tracking.tasks import GROUPS


def aggregate(rows: Sequence[dict]) -> list[dict]:
    """One summary per (task, mechanism, n_layers), sorted (``_order``): ``task, mechanism,
    n_layers, seeds (list), lengths (list), mean, low, high (lists, per length)``."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["task"], row["mechanism"], row["n_layers"]), []).append(row)
    summaries = []
    for (task, mechanism, n_layers), members in groups.items():
        lengths = sorted({int(length) for r in members for length in r["accuracy"]})
        values = [[r["accuracy"][str(length)] for r in members] for length in lengths]
        summaries.append(
            {
                "task": task,
                "mechanism": mechanism,
                "n_layers": n_layers,
                "seeds": sorted(r["seed"] for r in members),
                "lengths": lengths,
                "mean": [statistics.fmean(v) for v in values],
                "low": [min(v) for v in values],
                "high": [max(v) for v in values],
            }
        )
    return sorted(summaries, key=_order)


def _order(summary: dict) -> tuple:
    """Tasks in ``GROUPS`` order, mechanisms in ``LABELS`` order, then layers: the table's and
    the legend's order, whatever order the cells finished in."""
    tasks, mechanisms = list(GROUPS), list(LABELS)
    task, mechanism = summary["task"], summary["mechanism"]
    return (
        tasks.index(task) if task in tasks else len(tasks),
        mechanisms.index(mechanism) if mechanism in mechanisms else len(mechanisms),
        summary["n_layers"],
    )


def label(summary: dict) -> str:
    """``DeltaNet [0, 2]``, ``DeltaNet [0, 2] x2`` for two layers."""
    name = LABELS.get(summary["mechanism"], summary["mechanism"])
    return name + (f" x{summary['n_layers']}" if summary["n_layers"] > 1 else "")


def results_table(summaries: Sequence[dict]) -> str:
    """Markdown: task, mechanism, seeds, then mean accuracy (min-max over seeds) at each length."""
    lengths = sorted({length for s in summaries for length in s["lengths"]})
    lines = [
        "| task | mechanism | seeds | " + " | ".join(f"T = {n}" for n in lengths) + " |",
        "|---|---|---:|" + "---:|" * len(lengths),
    ]
    for s in summaries:
        cells = []
        for length in lengths:
            if length not in s["lengths"]:
                cells.append("")
                continue
            i = s["lengths"].index(length)
            spread = f" ({s['low'][i]:.2f}-{s['high'][i]:.2f})" if len(s["seeds"]) > 1 else ""
            cells.append(f"{s['mean'][i]:.2f}{spread}")
        lines.append(
            f"| {s['task']} | {label(s)} (`{s['mechanism']}`) | {len(s['seeds'])} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


# One marker per mechanism as well as one colour: lines at chance (A5's) lie on top of each other.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def figure(summaries: Sequence[dict], title: str = "State tracking", narrow: bool = False) -> Any:
    """Accuracy against test length, one panel per task, one line per mechanism (mean over seeds,
    the band from the lowest to the highest seed). The lines of one panel are drawn side by side
    (``plots.dodged``) with a marker each, so that lines on top of each other stay apart.
    ``narrow``: drawn for a phone, one panel a row and the legend below."""
    from linattn.figures import style
    from linattn.figures.plots import NARROW_WIDTH, PALETTE, dodged

    plt = style.pyplot()
    tasks = list(dict.fromkeys(s["task"] for s in summaries))
    mechanisms = list(dict.fromkeys(s["mechanism"] for s in summaries))
    cols = 1 if narrow else min(3, len(tasks))  # at most three a row: the column is 1,100 px
    rows = -(-len(tasks) // cols)
    size = (NARROW_WIDTH, 2.6 * rows + 2.4) if narrow else (2.3 * cols + 2.2, 2.8 * rows + 0.6)
    fig, axes = plt.subplots(rows, cols, figsize=size, layout="constrained", squeeze=False,
                             sharey=True)  # fmt: skip
    panels = axes.ravel()
    for ax in panels[len(tasks) :]:
        ax.set_axis_off()
    for ax, task in zip(panels, tasks, strict=False):
        mine = [s for s in summaries if s["task"] == task]
        for index, s in enumerate(mine):
            which = mechanisms.index(s["mechanism"])
            colour = PALETTE[which % len(PALETTE)]
            style_ = "--" if s["n_layers"] > 1 else "-"
            lengths = dodged(s["lengths"], index, len(mine), spread=0.08)
            ax.plot(lengths, s["mean"], style_, marker=MARKERS[which % len(MARKERS)], ms=4,
                    color=colour, lw=1.5, label=label(s))  # fmt: skip
            ax.fill_between(lengths, s["low"], s["high"], color=colour, alpha=0.12, lw=0)
        ax.set_xscale("log", base=2)
        ax.set_title(task)
        ax.set_xlabel("test length")
        ax.grid(True, color="#dddddd", lw=0.6)
    for row in axes:
        row[0].set_ylabel("per-token accuracy")
    axes[0][0].set_ylim(-0.03, 1.03)
    handles = {h.get_label(): h for ax in panels for h in ax.get_lines()}
    where = "outside lower center" if narrow else "outside right upper"
    fig.legend(list(handles.values()), list(handles), frameon=False, loc=where)
    fig.suptitle(title)
    return fig


def plot_results(
    summaries: Sequence[dict], path: str | Path, title: str = "State tracking"
) -> Path:
    """Write ``figure(summaries)`` to exactly ``path``."""
    from linattn.figures import style

    return style.save_png(figure(summaries, title), path)
