"""``benchmarks/short_conv.py`` runs as the README prints it, on its smallest setting."""

import importlib.util
from pathlib import Path

import pytest

from linattn.ops import _native

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")
def test_the_short_conv_benchmark_runs_and_reports_both_convolutions(capsys):
    spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "short_conv.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("x\n") == 2 and "PyTorch / fused" in printed
