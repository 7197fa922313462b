"""The MQAR results over seeds: one line per (fillers, mechanism, width), computed from the rows.

A results file holds one row per run (``linattn.experiments.mqar.sweep``: a mechanism at a width,
one seed, one filler, the best of its lr sweep). ``summarize`` groups the rows of one preset,
filler, mechanism and width, whatever their order, and reduces their final held-out accuracies
to ``linattn.figures.plots.spread``: mean, min, max, standard error, runs, and runs that solved
the task (accuracy >= ``plots.SOLVED`` = 0.9). ``results_table`` prints that as Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence

from linattn.experiments.mqar.data import filler_name
from linattn.figures.plots import SOLVED, spread


def summarize(rows: Sequence[dict]) -> list[dict]:
    """One dict per (preset, fillers, mechanism, d_model), in the order they first appear:
    ``preset, fillers, mechanism, d_model, state_numbers, params, seeds, accuracies, lrs (the best
    lr of each seed), steps (taken, per seed), max_steps, seconds (summed)`` and the ``spread``
    of the accuracies (``mean, min, max, sem, runs, solved``)."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row.get("preset"), filler_name(row), row["mechanism"], row.get("d_model"))
        groups.setdefault(key, []).append(row)
    lines = []
    for (preset, fillers, mechanism, d_model), runs in groups.items():
        runs = sorted(runs, key=lambda r: r.get("seed", 0))
        lines.append(
            {
                "preset": preset,
                "fillers": fillers,
                "mechanism": mechanism,
                "d_model": d_model,
                "state_numbers": runs[0]["state_numbers"],
                "params": runs[0].get("params"),
                "seeds": [r.get("seed") for r in runs],
                "accuracies": [r["accuracy"] for r in runs],
                "lrs": [r.get("lr") for r in runs],
                "steps": [r.get("steps") for r in runs],
                "max_steps": max(r.get("max_steps", r.get("steps", 0)) for r in runs),
                "seconds": sum(r.get("seconds", 0.0) for r in runs),
                **spread([r["accuracy"] for r in runs]),
            }
        )
    return lines


def results_table(rows: Sequence[dict]) -> str:
    """Markdown table of ``summarize(rows)``: mechanism, width, state per layer, parameters, mean
    accuracy over the seeds, its min and max, seeds solved, best lr and steps per seed, time."""
    lines = [
        f"| mechanism | d_model | state / layer | params | accuracy (mean) | min - max "
        f"| solved (>= {SOLVED}) | best lr per seed | steps per seed | time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summarize(rows):
        params = f"{s['params']:,}" if s["params"] is not None else "-"
        lrs = ", ".join(f"{lr:g}" for lr in s["lrs"] if lr is not None)
        steps = ", ".join(str(n) for n in s["steps"])
        lines.append(
            f"| {s['mechanism']} | {s['d_model']} | {s['state_numbers']:,.0f} | {params} "
            f"| {s['mean']:.3f} | {s['min']:.3f} - {s['max']:.3f} | {s['solved']} of {s['runs']} "
            f"| {lrs} | {steps} | {s['seconds']:.0f} |"
        )
    return "\n".join(lines)
