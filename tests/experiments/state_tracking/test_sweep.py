"""`linattn state-tracking`: the smoke preset end to end, resume, and a table computed from rows."""

import json
from dataclasses import replace

import pytest
import torch

from linattn.cli import main
from linattn.experiments.mqar.sweep import read_results
from linattn.experiments.mqar.train import TrainConfig, train
from linattn.experiments.state_tracking import results, sweep
from linattn.experiments.state_tracking.sweep import PRESETS, Preset


def smoke_rows(tmp_path, **changes):
    preset = replace(PRESETS["smoke"], **changes)
    logged = []
    rows = sweep.run_sweep(preset, results_path=tmp_path / "r.jsonl",
                           checkpoint_dir=tmp_path / "ck", progress=False,
                           log=logged.append)  # fmt: skip
    return rows, logged


def test_smoke_preset_trains_every_cell_and_reuses_them(tmp_path):
    rows, logged = smoke_rows(tmp_path)
    assert len(rows) == len(PRESETS["smoke"].cells()) == 6
    for row in rows:
        assert set(row["accuracy"]) == {"8", "16"}
        assert all(0.0 <= a <= 1.0 for a in row["accuracy"].values())
        assert row["steps"] == 2
    again, logged = smoke_rows(tmp_path)
    assert again == rows and "6 of 6 cells already in" in logged[0]
    assert len(read_results(tmp_path / "r.jsonl")) == 6  # nothing retrained


def test_the_table_is_computed_from_the_rows(tmp_path):
    rows, _ = smoke_rows(tmp_path, seeds=(0, 1))
    summaries = results.aggregate(rows)
    assert len(summaries) == 6 and all(s["seeds"] == [0, 1] for s in summaries)
    first = [r for r in rows if (r["task"], r["mechanism"]) == ("parity", "deltanet")]
    want = sum(r["accuracy"]["16"] for r in first) / 2
    assert summaries[0]["mean"][1] == pytest.approx(want)
    assert summaries[0]["low"][1] == min(r["accuracy"]["16"] for r in first)
    # change one seed's number: the table follows
    edited = [dict(r, accuracy={**r["accuracy"], "16": 0.123}) if r is first[0] else r
              for r in rows]  # fmt: skip
    table = results.results_table(results.aggregate(edited))
    assert f"{(0.123 + first[1]['accuracy']['16']) / 2:.2f} (" in table.splitlines()[2]
    assert table.splitlines()[0] == "| task | mechanism | seeds | T = 8 | T = 16 |"
    # the table names each mechanism as the log and --mechanisms do, beside its title
    assert "| DeltaNet [0, 2] (`deltanet_neg`) |" in table
    path = results.plot_results(summaries, tmp_path / "fig.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_an_interrupted_cell_resumes_from_its_checkpoint(tmp_path):
    preset = replace(PRESETS["smoke"], train=replace(PRESETS["smoke"].train, steps=4))
    cell = ("parity", "deltanet_neg", 1)

    def model():
        torch.manual_seed(0)  # the same initialisation each time, as run_cell makes it
        return sweep.build_model(preset, *cell)

    task = sweep.StateTask("parity", preset.train_len)
    path = tmp_path / "ck.pt"
    part = train(model(), task, preset.train, checkpoint=path, progress=False, stop_after=2)
    assert not part.complete and part.steps == 2
    resumed = train(model(), task, preset.train, checkpoint=path, progress=False)
    whole = train(model(), task, preset.train, progress=False)
    assert resumed.complete and resumed.losses == whole.losses


def test_cli_json_and_bad_options(tmp_path, capsys):
    args = ["state-tracking", "--preset", "smoke", "--results", str(tmp_path / "r.jsonl"),
            "--plot", str(tmp_path / "p.png"), "--checkpoint-dir", "none", "--tasks", "parity",
            "--mechanisms", "deltanet_neg", "--json"]  # fmt: skip
    assert main(args) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [s["mechanism"] for s in payload["summaries"]] == ["deltanet_neg"]
    assert main([*args, "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err


def test_bad_presets_and_tasks():
    with pytest.raises(ValueError, match="tasks: unknown"):
        replace(PRESETS["smoke"], tasks=("S7",))
    with pytest.raises(ValueError, match="d_model 10 is not divisible"):
        replace(PRESETS["smoke"], d_model=10, n_heads=4)
    with pytest.raises(TypeError, match="task must be an MQARTask or have the methods"):
        train(sweep.build_model(PRESETS["smoke"], "parity", "deltanet", 1), object(),
              TrainConfig(steps=1))  # fmt: skip
    assert isinstance(PRESETS["default"], Preset) and len(PRESETS["default"].seeds) >= 3


def test_the_report_shows_the_table_computed_from_the_rows(tmp_path):
    from linattn.experiments.report_page import render_html, render_markdown
    from tests.experiments.test_report_page import small_report

    rows, _ = smoke_rows(tmp_path)
    summaries = results.aggregate(rows)
    page = small_report(state_tracking=summaries, state_tracking_source="r.jsonl")
    markdown = render_markdown(page)
    assert "## State tracking" in markdown and results.results_table(summaries) in markdown
    assert "figures/state-tracking.png" in markdown
    html = render_html(page)
    assert 'id="state-tracking"' in html and "DeltaNet [0, 2]" in html
    empty = render_markdown(small_report(state_tracking_note="none here"))
    assert "No state-tracking results at" in empty and "none here" in empty


def test_a_task_with_its_own_mechanisms_runs_those_alone(tmp_path, capsys):
    preset = replace(PRESETS["smoke"], task_mechanisms={"S3": ("deltanet_neg",)})
    assert preset.cells() == [
        ("parity", m, 1, 0) for m in ("deltanet", "deltanet_neg", "softmax")
    ] + [("S3", "deltanet_neg", 1, 0)]
    # a task's own list may name a mechanism the others do not run, and two-layer extras apply
    wider = replace(preset, task_mechanisms={"S3": ("deltanet_neg", "linear")},
                    extra_layers={"deltanet_neg": (2,)})  # fmt: skip
    assert [c[1:3] for c in wider.cells() if c[0] == "S3"] == [
        ("deltanet_neg", 1), ("deltanet_neg", 2), ("linear", 1)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="mechanisms: unknown"):
        replace(PRESETS["smoke"], task_mechanisms={"S3": ("lstm",)})
    with pytest.raises(ValueError, match="tasks: unknown"):
        replace(PRESETS["smoke"], task_mechanisms={"S7": ("deltanet",)})
    # --mechanisms narrows a task's own list too
    args = ["state-tracking", "--preset", "smoke", "--results", str(tmp_path / "r.jsonl"),
            "--plot", "none", "--checkpoint-dir", "none", "--mechanisms", "deltanet_neg",
            "--json"]  # fmt: skip
    assert main(args) == 0
    summaries = json.loads(capsys.readouterr().out)["summaries"]
    assert [(s["task"], s["mechanism"]) for s in summaries] == [
        ("parity", "deltanet_neg"), ("S3", "deltanet_neg")
    ]  # fmt: skip


def test_the_default_preset_runs_a5_on_the_delta_rules_with_beta_to_2():
    """The issue's "Must show": every cell at least 3 seeds; A5 on DeltaNet [0, 2] (one and two
    blocks) and DeltaProduct n_h = 2, 3, 4; softmax and the [0, 1] rules on the rest."""
    preset = PRESETS["default"]
    cells = preset.cells()
    assert len(preset.seeds) >= 3 and len(cells) == len(set(cells))
    big = {"deltanet_neg", "deltaproduct2_neg", "deltaproduct3_neg", "deltaproduct4_neg"}
    for task in ("A5",):
        assert {(m, n) for t, m, n, _ in cells if t == task} == {
            *((m, 1) for m in big),
            ("deltanet_neg", 2),
        }
    for task in ("parity", "mod3", "S3"):
        ran = {m for t, m, _, _ in cells if t == task}
        assert {"softmax", "linear", "deltanet", "deltanet_neg", "deltaproduct2_neg"} <= ran


def test_the_curriculum_reaches_the_cells_and_their_hash(tmp_path):
    smoke = PRESETS["smoke"]
    preset = replace(smoke, curriculum_every=1, tasks=("parity",), mechanisms=("deltanet_neg",))
    cell = ("parity", "deltanet_neg", 1, 0)
    assert sweep.config_hash(preset, *cell) != sweep.config_hash(smoke, *cell)
    row = sweep.run_cell(preset, *cell, checkpoint_dir=None, progress=False)
    assert row["curriculum_every"] == 1 and row["config_hash"] == sweep.config_hash(preset, *cell)
    with pytest.raises(ValueError, match="curriculum_every must be an int >= 0"):
        replace(smoke, curriculum_every=-1)


def test_steps_from_the_command_line_keep_the_curriculum_s_shape():
    import argparse

    from linattn.experiments.state_tracking.cli import build_preset, configure

    parser = argparse.ArgumentParser()
    configure(parser)
    default = PRESETS["default"]
    assert build_preset(parser.parse_args([])) == default
    fewer = build_preset(parser.parse_args(["--steps", str(default.train.steps // 10)]))
    assert fewer.curriculum_every == max(1, default.curriculum_every // 10)
    assert fewer.train.steps == default.train.steps // 10
    assert build_preset(parser.parse_args(["--steps", "1"])).curriculum_every == 1
