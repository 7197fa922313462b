"""``benchmarks/dplr.py`` runs as benchmarks/README.md prints it, on a small setting."""

import importlib.util
import json
from pathlib import Path

import pytest

from linattn.ops import _native
from linattn.ops.rules import dplr

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")
def test_the_dplr_benchmark_reports_every_line(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("dplr_benchmark", BENCHMARKS / "dplr.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "dplr.json"
    assert (
        bench.main(["--T", "96", "--H", "2", "--repeats", "2", "--no-fla", "--out", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    # the rule at its own default chunk size, against the delta rule at its own and at the same
    assert result["C"] == dplr.CHUNK_SIZE and result["delta_C"] == 64
    assert [r["gate"] for r in result["delta"]] == list(bench.GATES)
    for r in result["delta"]:
        for key in ("forward_ratio", "forward_ratio_same_C", "forward_backward_ratio_same_C"):
            low, high = r[f"{key}_range"]
            assert 0 < low <= r[key] <= high
    for r in result["scaling"]:
        for key in ("forward_speedup", "forward_backward_speedup", "gemm_speedup"):
            low, high = r[f"{key}_range"]
            assert 0 < low <= r[key] <= high
    for r in result["efficiency"]:
        assert r["ops"] == 96 // 32 * 2 * bench.dplr_chunk_ops(32, 64, 64)
        assert r["forward_efficiency"] > 0 and r["forward_backward_efficiency"] > 0
    printed = capsys.readouterr().out
    assert "at its default C 64 and at C 32" in printed and "| channel |" in printed
    assert "a matrix product, just after" in printed
