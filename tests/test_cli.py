"""The `linattn` command: exit statuses and error messages, in process and once as a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from linattn import cli
from linattn.experiments import verify

SRC = Path(__file__).resolve().parents[1] / "src"


def test_verify_passes(capsys):
    assert cli.main(["verify"]) == 0
    out = capsys.readouterr().out
    assert "causal softmax: each row sums to one" in out
    assert "WY form: the product of 6 transitions is I - K^T T K" in out
    assert "FAIL" not in out


def test_verify_json(monkeypatch, capsys):
    monkeypatch.setattr(verify, "SECTIONS", (verify.figure5_checks,))  # quick: the format only
    assert cli.main(["verify", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["passed"] is True and len(payload["checks"]) == 3


def test_verify_exits_1_when_a_check_fails(monkeypatch, capsys):
    failing = verify.compare("a check that fails", 1.0, 2.0)
    monkeypatch.setattr(verify, "SECTIONS", (lambda: [failing],))
    assert cli.main(["verify"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_table1_small(capsys):
    assert cli.main(["table1", "--ns", "8,16", "--repetitions", "4", "--r", "8"]) == 0
    out = capsys.readouterr().out
    assert "| 8 |" in out and "| 16 |" in out and "r = d = 8" in out


def test_costs_json(capsys):
    assert cli.main(["costs", "--json", "--n", "1024"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["n"] == 1024


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["table1", "--ns", "8,abc"], "argument --ns: expected an integer >= 1, got 'abc'"),
        (["table1", "--ns", "8,,16"], "argument --ns: expected integers >= 1 separated by commas"),
        (["table1", "--repetitions", "0"], "argument --repetitions: expected an integer >= 1"),
        (["table1", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["costs", "--C", "0"], "argument --C: expected an integer >= 1, got 0"),
        (["costs", "--d-model", "big"], "argument --d-model: expected an integer >= 1"),
        (["verify", "--nonsense"], "unrecognized arguments: --nonsense"),
    ],
)
def test_bad_options_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_library_error_exits_2(monkeypatch, capsys):
    from linattn.experiments import costs

    def bad(*args):
        raise ValueError("C must be an integer >= 1, got 0")

    monkeypatch.setattr(costs, "compute_costs", bad)
    assert cli.main(["costs"]) == 2
    assert "linattn costs: error: C must be an integer >= 1" in capsys.readouterr().err


def run_module(*argv):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "linattn", *argv], capture_output=True, text=True, env=env
    )


def test_python_m_linattn():
    ok = run_module("costs")
    assert ok.returncode == 0 and "33,554,432" in ok.stdout
    bad = run_module("table1", "--ns", "8,abc")
    assert bad.returncode == 2 and "argument --ns" in bad.stderr
