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


NEEDS_FLA = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("fla", "triton")),
    reason="fla and triton are needed (the integrations extra)",
)
# A fast subset: a rule of the delta family, a memory with a state of parts (TTT's, through
# compat's return conversion), a softmax variant returning o alone, and a family whose call fla
# refuses at the smoke's shape (log-linear attention: K a multiple of 64).
SUBSET = ("gated_delta", "ttt_linear", "forgetting", "log_linear_mamba2")
# What fla refuses in the smoke's float32 at K = 16: (mechanism, kind) -> the reason's words.
REFUSED = {
    "log_linear_mamba2": "K a multiple of 64",
    ("delta_product", "fwd"): "refuses float32",
    ("delta_product", "fwdbwd"): "refuses float32",
    ("parallax", "fwd"): "refuses float32",
    ("parallax", "fwdbwd"): "refuses float32",
    ("cyfa", "fwdbwd"): "power of two of slots",  # the case's M = 6; recurrent: no backward
}


def _smoke(tmp_path, names):
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--out", str(out),
         "--mechanisms", *names],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["setup"]["smoke"] and result["setup"]["device"] == "cpu (smoke)"
    assert result["setup"]["check_T"] < 32  # the check ran on inputs cut from the longest T
    assert list(result["checks"]) == list(names)
    timed = []
    for name, check in result["checks"].items():
        if name in REFUSED:
            assert REFUSED[name] in check["refused"], (name, check)
            continue
        assert check["ok"], (name, check)
        assert max(check["o_rel"], check["state_rel"]) <= check["tolerance"]
        timed.append(name)
    assert [row["mechanism"] for row in result["rows"]] == timed and not result["skipped"]
    for row in result["rows"]:
        for kind in ("fwd", "fwdbwd"):
            if (row["mechanism"], kind) in REFUSED:
                assert REFUSED[row["mechanism"], kind] in row[f"{kind}_note"], row
                continue
            if kind == "fwdbwd" and row["mechanism"] == "iplr":  # fla's IPLR: no backward
                continue
            assert all(row[f"{path}_{kind}_ms"] > 0 for path in ("torch", "fla", "dispatch")), row
    return result


@NEEDS_FLA
def test_the_gpu_benchmark_runs_end_to_end_in_its_smoke_form(tmp_path):
    _smoke(tmp_path, SUBSET)


@NEEDS_FLA
@pytest.mark.slow  # about 4 minutes: every mechanism of the dispatch table
def test_the_gpu_benchmark_covers_every_dispatched_mechanism(tmp_path):
    _smoke(tmp_path, list(dispatch.table()))
