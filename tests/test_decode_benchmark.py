"""``benchmarks/decode.py`` runs as the README prints it, on its smallest setting."""

import importlib.util
import json
from pathlib import Path

import pytest

from linattn.ops import _native

ROOT = Path(__file__).resolve().parents[1]


def load_decode():
    spec = importlib.util.spec_from_file_location("decode", ROOT / "benchmarks" / "decode.py")
    decode = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(decode)
    return decode


@pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")
def test_the_decode_benchmark_runs_and_reports_every_mechanism(tmp_path, capsys):
    decode = load_decode()
    out = tmp_path / "decode.json"
    argv = ["--threads", "1", "--batches", "1", "--shapes", "small", "--turns", "2", "--out"]
    assert decode.main([*argv, str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["mechanism"] for r in rows] == decode.MECHANISMS
    for r in rows:
        assert r["step_ms"] > 0 and r["pass_ms"] > 0 and r["ratio"] > 0
        assert r["kernel_ms"] > 0 and r["kernel_ratio"] > 0
    printed = capsys.readouterr().out
    assert "small B 1 kda:" in printed and "<= 3.0x" in printed


@pytest.mark.skipif(not _native.available(), reason="the fused CPU code is unavailable")
def test_the_paired_thread_scaling_is_measured_and_judged(tmp_path, capsys):
    decode = load_decode()
    out = tmp_path / "decode.json"
    argv = ["--threads", "1,2", "--batches", "8", "--shapes", "small", "--turns", "2"]
    assert decode.main([*argv, "--scaling-only", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["rows"] == []
    assert [r["mechanism"] for r in result["scaling"]] == decode.MECHANISMS
    for r in result["scaling"]:
        assert r["step_speedup"] > 0 and r["pass_speedup"] > 0
    printed = capsys.readouterr().out
    assert "small B 8 kda: 2 threads" in printed and "(paired; the pass" in printed
