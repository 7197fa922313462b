"""``benchmarks/gpu.py --smoke``: the GPU benchmark's whole path on CPU tensors under Triton's
interpreter, at a tiny shape (its timings mean nothing; its agreement with float64 does).

Run in a process of its own: the interpreter must be on before fla is imported, and this
process may have imported fla already.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from linattn import dispatch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("fla", "triton")),
    reason="fla and triton are needed (the integrations extra)",
)
def test_the_gpu_benchmark_runs_end_to_end_in_its_smoke_form(tmp_path):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["setup"]["smoke"] and result["setup"]["device"] == "cpu (smoke)"
    assert result["setup"]["check_T"] < 32  # the check ran on inputs cut from the longest T
    names = list(dispatch.table())
    assert list(result["checks"]) == names
    for name, check in result["checks"].items():
        assert check["ok"], (name, check)
        assert max(check["o_rel"], check["state_rel"]) <= check["tolerance"]
    assert [row["mechanism"] for row in result["rows"]] == names and not result["skipped"]
    for row in result["rows"]:
        if row["mechanism"] == "delta_product":  # fla's kernel refuses the smoke's float32
            assert "refuses float32" in row["fwd_note"]
            continue
        for path in ("torch", "fla", "dispatch"):
            assert row[f"{path}_fwd_ms"] > 0, row
        if row["mechanism"] != "iplr":  # fla's IPLR chunk kernel has no backward
            assert all(row[f"{path}_fwdbwd_ms"] > 0 for path in ("torch", "fla", "dispatch"))
