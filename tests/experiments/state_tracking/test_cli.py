"""`linattn state-tracking`'s limits: each bad option or results file gets a one-line error that
names it, before any cell is trained."""

import json
import re
import sys

import pytest

from linattn.cli import main
from linattn.experiments.state_tracking import cli

SMOKE = ["state-tracking", "--preset", "smoke", "--no-progress", "--checkpoint-dir", "none"]


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--threads", "100000", "argument --threads: expected at most the"),
        ("--threads", "0", "argument --threads: expected an integer >= 1"),
        ("--seeds", str(2**70), "argument --seeds: expected an integer <= 2\\*\\*63 - 1"),
        ("--seeds", "-1", "argument --seeds: expected an integer >= 0"),
    ],
)
def test_bounded_options(capsys, tmp_path, option, value, message, monkeypatch):
    trained = []
    monkeypatch.setattr(cli, "run_sweep", lambda *a, **k: trained.append(1) or [])
    argv = [*SMOKE, "--plot", "none", "--results", str(tmp_path / "r.jsonl"), option, value]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and not trained
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def _run(tmp_path, capsys, results, plot="none"):
    argv = [*SMOKE, "--plot", plot, "--results", str(results)]
    status = main(argv)
    return status, capsys.readouterr()


def test_a_binary_results_file_is_named_with_its_line(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    results.write_bytes(b'{"task": "parity"}\n\x00\xff\xfe binary\n')
    status, out = _run(tmp_path, capsys, results)
    assert status == 2
    assert f"results file {results}, line 1: field 'config_hash'" in out.err  # the first row
    results.write_bytes(b"\x00\xff\xfe binary\n")
    status, out = _run(tmp_path, capsys, results)
    assert status == 2 and out.err.count("\n") == 1
    assert f"results file {results}, line 1: not UTF-8 text" in out.err


@pytest.mark.parametrize(
    "field, value",
    [("seed", "0"), ("accuracy", [0.5]), ("n_layers", None), ("accuracy", {"8": 1.5})],
)
def test_a_mistyped_results_row_is_named_with_its_line(tmp_path, capsys, field, value):
    results = tmp_path / "r.jsonl"
    status, _ = _run(tmp_path, capsys, results)
    assert status == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    rows[2][field] = value
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    status, out = _run(tmp_path, capsys, results)
    assert status == 2 and out.err.count("\n") == 1
    assert f"results file {results}, line 3: field '{field}'" in out.err


def test_a_missing_matplotlib_is_found_before_any_training(tmp_path, capsys, monkeypatch):
    trained = []
    monkeypatch.setattr(cli, "run_sweep", lambda *a, **k: trained.append(1) or [])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    status, out = _run(tmp_path, capsys, tmp_path / "r.jsonl", plot=str(tmp_path / "p.png"))
    assert status == 2 and not trained
    assert "--plot: the figures need matplotlib" in out.err and out.err.count("\n") == 1
