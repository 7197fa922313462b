"""``linattn mqar``: the smoke preset end to end with the real model, and bad configurations."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from linattn import cli
from linattn.experiments.mqar.sweep import CURATED, PRESETS


def main(argv: list[str]) -> int:
    return cli.main(argv)


def test_smoke_preset_end_to_end(tmp_path, capsys) -> None:
    results, plot = tmp_path / "mqar.jsonl", tmp_path / "mqar.png"
    argv = ["mqar", "--preset", "smoke", "--results", str(results), "--plot", str(plot),
            "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["mechanism"] for r in rows] == list(CURATED)
    for row in rows:
        assert row["preset"] == "smoke" and row["steps"] == 2 and 0.0 <= row["accuracy"] <= 1.0
        assert len(row["state_numbers_per_block"]) == row["n_layers"]
        assert row["state_numbers"] > 0
        assert f"| {row['mechanism']} | {row['d_model']} |" in out
    by_name = {r["mechanism"]: r for r in rows}
    # softmax's KV cache: keys and values of every token seen, 2 T d_model numbers per block
    assert by_name["softmax"]["state_numbers"] >= 2 * 16 * 16
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n-kv", "5"], "n_kv too large"),
        (["--vocab-size", "16"], "vocab_size must be larger than seq_len"),
        (["--seq-len", "17", "--vocab-size", "64"], "seq_len must be even"),
        (["--widths", "15"], "not divisible by n_heads"),
        (["--steps", "0"], "steps must be >= 1"),
        (["--batch-size", "0"], "batch_size must be >= 1"),
        (["--lr", "-1"], "lrs must be"),
        (["--workers", "0"], "workers must be"),
        (["--threads", "0"], "--threads must be"),
    ],
)
def test_bad_configuration_fails_before_training(tmp_path, capsys, extra, message) -> None:
    results = tmp_path / "mqar.jsonl"
    argv = ["mqar", "--preset", "smoke", "--results", str(results), "--no-progress"] + extra
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("linattn mqar: error:")
    assert not results.exists()  # nothing was trained


def test_fillers_option_sets_the_task(tmp_path, capsys) -> None:
    for fillers, expected in (("random", True), ("blank", False)):
        results = tmp_path / f"{fillers}.jsonl"
        argv = ["mqar", "--preset", "smoke", "--mechanisms", "deltanet", "--fillers", fillers,
                "--results", str(results), "--plot", "none", "--checkpoint-dir", "none",
                "--no-progress"]  # fmt: skip
        assert main(argv) == 0
        assert f"{fillers} fillers" in capsys.readouterr().out
        (row,) = [json.loads(line) for line in results.read_text().splitlines()]
        assert row["random_non_queries"] is expected


def test_steps_option_replaces_the_per_mechanism_steps(tmp_path, capsys, monkeypatch) -> None:
    smoke = replace(PRESETS["smoke"], mechanism_steps={"deltanet": 3})
    monkeypatch.setitem(PRESETS, "smoke", smoke)
    cases = (([], 3, "2 (deltanet: 3) steps"), (["--steps", "1"], 1, "1 steps"))
    for extra, expected, line in cases:
        results = tmp_path / f"r{expected}.jsonl"
        argv = ["mqar", "--preset", "smoke", "--mechanisms", "deltanet", "--results", str(results),
                "--plot", "none", "--checkpoint-dir", "none", "--no-progress", *extra]  # fmt: skip
        assert main(argv) == 0
        assert line in capsys.readouterr().out
        (row,) = [json.loads(line) for line in results.read_text().splitlines()]
        assert row["steps"] == row["max_steps"] == expected


@pytest.mark.parametrize(
    ("option", "make", "message"),
    [
        ("--results", "folder", "--results {path} is a folder; expected a file name"),
        ("--plot", "folder", "--plot {path} is a folder; expected a file name"),
        ("--plot", "below-a-file", "--plot {path}: {parent} is a file, not a folder"),
        ("--checkpoint-dir", "file", "--checkpoint-dir {path} is a file; expected a folder"),
    ],
)
def test_bad_output_paths_fail_before_training(tmp_path, capsys, monkeypatch, option, make,
                                               message) -> None:  # fmt: skip
    from linattn.experiments.mqar import cli as mqar_cli

    def no_training(*args, **kwargs):
        raise AssertionError("trained before the output paths were checked")

    monkeypatch.setattr(mqar_cli, "run_sweep", no_training)
    parent = tmp_path / "a-file"
    parent.write_text("")
    path = {"folder": tmp_path, "file": parent, "below-a-file": parent / "x.png"}[make]
    argv = ["mqar", "--preset", "smoke", "--results", str(tmp_path / "r.jsonl"), "--plot", "none",
            "--checkpoint-dir", "none", "--no-progress", option, str(path)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message.format(path=path, parent=parent) in err and len(err.splitlines()) == 1
    assert not (tmp_path / f"{tmp_path.name}.png").exists()


def test_negative_seed_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["mqar", "--preset", "smoke", "--seed", "-3"])
    assert exit_info.value.code == 2
    assert "argument --seed: expected an integer >= 0" in capsys.readouterr().err


def test_seeds_and_both_fillers_print_a_table_per_filler(tmp_path, capsys) -> None:
    results = tmp_path / "r.jsonl"
    argv = ["mqar", "--preset", "smoke", "--mechanisms", "deltanet", "--seeds", "0", "4",
            "--fillers", "blank", "random", "--lr", "1e-3", "3e-3", "--results", str(results),
            "--plot", "none", "--checkpoint-dir", "none", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted((r["random_non_queries"], r["seed"]) for r in rows) == [
        (False, 0), (False, 4), (True, 0), (True, 4)
    ]  # fmt: skip
    assert all([x["lr"] for x in r["lr_sweep"]] == [1e-3, 3e-3] for r in rows)
    assert "budget: 2 steps of 4 sequences for every mechanism" in out
    assert "lr sweep [0.001, 0.003], the best per seed" in out
    for filler in ("blank", "random"):
        assert f"{filler} fillers (over seeds [0, 4]):" in out
    assert out.count("| deltanet | 16 |") == 2 and out.count(" of 2 |") == 2


def test_seed_and_seeds_together_are_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["mqar", "--preset", "smoke", "--seed", "1", "--seeds", "2"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_plugin_mechanism_trains_from_the_command_line(tmp_path) -> None:
    # A rule written outside the package (examples/), named to the command by LINATTN_PLUGINS:
    # the registry runs the file on import, so the command and its workers know the mechanism.
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "implicit_delta_rule.py"
    results = tmp_path / "mqar.jsonl"
    env = {**os.environ, "LINATTN_PLUGINS": str(example)}
    argv = [sys.executable, "-m", "linattn", "mqar", "--preset", "smoke", "--mechanisms",
            "implicit_delta", "--results", str(results), "--plot", "none",
            "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress"]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["mechanism"] for r in rows] == ["implicit_delta"]
    assert rows[0]["mixers"] == ["conv", "implicit_delta"] and rows[0]["state_numbers"] > 0
