"""``benchmarks/log_linear.py`` runs and reports every line, on a tiny setting."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench():
    spec = importlib.util.spec_from_file_location(
        "log_linear_benchmark", BENCHMARKS / "log_linear.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_log_linear_benchmark_reports_the_ratio_and_the_growth(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "log_linear.json"
    argv = ["--T", "64", "256", "--H", "1", "--K", "8", "--V", "8", "--C", "16", "--repeats", "1"]
    assert bench.main([*argv, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["T"] for r in result["rows"]] == [64, 256] and result["L"] == 10
    for r in result["rows"]:
        assert r["log_linear_s"] > 0 and r["mamba2_s"] > 0
        assert math.isclose(r["ratio"], r["log_linear_s"] / r["mamba2_s"])
    assert set(result["growth_exponent"]) == {"log_linear", "mamba2", "ratio"}
    printed = capsys.readouterr().out
    assert "| 256 |" in printed and "growth exponent over all T" in printed
    assert bench.slope([1, 2, 4], [3.0, 6.0, 12.0]) == pytest.approx(1.0)
    assert bench.main([*argv[:-2], "--repeats", "1", "--base", "gated_deltanet"]) == 0
    assert "log-linear Gated DeltaNet / Gated DeltaNet" in capsys.readouterr().out


def test_bad_arguments_are_refused(capsys):
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.main(["--C", "12"])
    assert "--C must be a power of two" in capsys.readouterr().err
