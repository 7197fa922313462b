"""``benchmarks/weak_scaling.py`` runs as benchmarks/README.md prints it, on a small setting."""

import importlib.util
from pathlib import Path

import pytest

from linattn.ops import _native

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")
def test_the_weak_scaling_benchmark_times_every_row(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # as a script: ab_kernels beside it
    spec = importlib.util.spec_from_file_location("weak_scaling", BENCHMARKS / "weak_scaling.py")
    weak_scaling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(weak_scaling)
    rows = weak_scaling.main(["--T", "96", "--turns", "2"])
    assert list(rows) == ["matrix product", *weak_scaling.ROWS]
    for r in rows.values():
        assert r["one_ms"] > 0 and r["two_ms"] > 0 and r["low"] <= r["median"] <= r["high"]
    printed = capsys.readouterr().out
    assert "| kda |" in printed and "4 heads on 1 thread" in printed
