"""Several seeds and both fillers: the rows of every cell, and the summary computed from them."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from linattn.experiments.mqar import sweep
from linattn.experiments.mqar.summary import results_table, summarize
from linattn.figures import plots

from .conftest import Oracle
from .test_sweep import PRESET, sweep_rows

SEEDS = replace(PRESET, mechanisms=("deltanet",), widths=(8,), seeds=(0, 3, 5),
                fillers=("blank", "random"))  # fmt: skip


def test_every_seed_and_filler_is_a_row_of_its_own(tmp_path) -> None:
    rows = sweep_rows(tmp_path, SEEDS, workers=1)
    assert [(sweep.filler_name(r), r["seed"]) for r in rows] == [
        ("blank", 0), ("blank", 3), ("blank", 5), ("random", 0), ("random", 3), ("random", 5)
    ]  # fmt: skip
    assert [r["random_non_queries"] for r in rows] == [False] * 3 + [True] * 3
    assert len({r["config_hash"] for r in rows}) == 6
    # the seeds draw other data and initialisations: the runs differ
    assert len({json.dumps(r["evals"]) for r in rows}) == 6
    assert sweep_rows(tmp_path, SEEDS, workers=1) == rows  # reused, not retrained


def test_the_summary_is_computed_from_the_runs(tmp_path) -> None:
    rows = sweep_rows(tmp_path, SEEDS, workers=1)
    # replace the trained accuracies by known ones: the summary must follow them
    accuracies = [0.95, 0.2, 0.91, 0.4, 0.05, 0.3]
    rows = [dict(r, accuracy=a) for r, a in zip(rows, accuracies, strict=True)]
    blank, random = summarize(list(reversed(rows)))[::-1]  # any row order
    assert (blank["fillers"], random["fillers"]) == ("blank", "random")
    assert blank["seeds"] == [0, 3, 5] and blank["accuracies"] == [0.95, 0.2, 0.91]
    assert blank["mean"] == pytest.approx(np.mean([0.95, 0.2, 0.91]))
    assert (blank["min"], blank["max"], blank["solved"], blank["runs"]) == (0.2, 0.95, 2, 3)
    assert blank["sem"] == pytest.approx(np.std([0.95, 0.2, 0.91], ddof=1) / np.sqrt(3))
    assert random["mean"] == pytest.approx(0.25) and random["solved"] == 0
    assert blank["lrs"] == [r["lr"] for r in rows[:3]]
    table = results_table(rows[:3]).splitlines()
    assert len(table) == 3
    assert f"| {np.mean([0.95, 0.2, 0.91]):.3f} | 0.200 - 0.950 | 2 of 3 |" in table[2]


def test_the_plot_points_carry_the_spread_per_filler() -> None:
    rows = [
        {"mechanism": "kda", "state_numbers": 8, "accuracy": a, "random_non_queries": r}
        for a, r in ((1.0, False), (0.5, False), (0.1, True))
    ]
    points = plots.mqar_points(rows)
    assert sorted(points) == ["kda, blank fillers", "kda, random fillers"]
    ((state, blank),) = points["kda, blank fillers"]
    assert state == 8.0 and (blank["mean"], blank["min"], blank["max"]) == (0.75, 0.5, 1.0)
    assert blank["solved"] == 1 and blank["runs"] == 2
    with pytest.raises(ValueError, match="accuracies must be"):
        plots.spread([])


def test_the_lr_sweep_stops_at_the_first_lr_that_solves(tmp_path) -> None:
    """An lr that reaches stop_accuracy ends the sweep; the others are listed as skipped."""
    preset = replace(
        PRESET, mechanisms=("deltanet",), widths=(8,), lrs=(1e-3, 3e-3, 1e-2),
        train=replace(PRESET.train, stop_accuracy=0.99),
    )  # fmt: skip

    def oracle(mechanism, d_model, p):
        return Oracle(p.task.vocab_size, p.task.n_kv)

    (row,) = sweep.run_sweep(preset, results_path=tmp_path / "r.jsonl", checkpoint_dir=None,
                             progress=False, builder=oracle, meter=lambda m, t: [1, 1],
                             log=lambda _: None)  # fmt: skip
    assert row["accuracy"] == 1.0 and row["lr"] == 1e-3 and row["stopped_early"]
    assert row["lr_sweep"][1:] == [{"lr": 3e-3, "skipped": True}, {"lr": 1e-2, "skipped": True}]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(seeds=()), "seeds must be"),
        (dict(seeds=(1, 1)), "seeds must be"),
        (dict(seeds=(-1,)), "seeds must be"),
        (dict(fillers=("zeros",)), "fillers must be"),
        (dict(fillers=("blank", "blank")), "fillers must be"),
    ],
)
def test_bad_seeds_and_fillers(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(PRESET, **kwargs)
