"""The report's setup sentences and the GPU benchmark's tables (``report_setup``)."""

from __future__ import annotations

from linattn.experiments import report_setup


def test_the_gpu_tables_show_committed_results_or_says_none_were_measured():
    assert "Not measured yet" in report_setup.gpu_table(None)
    result = {
        "setup": {"device": "NVIDIA H100", "torch": "2.13.0", "dtype": "bfloat16", "B": 1,
                  "H": 8, "K": 128},
        "rows": [{"mechanism": "gated_delta", "T": 4096, "torch_fwd_ms": 12.5,
                  "fla_fwd_ms": 1.25, "dispatch_fwd_ms": 1.26, "torch_fwdbwd_ms": None}],
        "checks": {"gated_delta": {"ok": True}, "kda": {"ok": False}},
    }  # fmt: skip
    table = report_setup.gpu_table(result)
    assert "On NVIDIA H100, torch 2.13.0, bfloat16" in table
    assert "| gated_delta | 4096 | 12.5 | 1.25 | 1.26 |" in table
    assert "| gated_delta | 4096 | - | - | - |" in table  # forward + backward: not measured
    assert "1 of 2 checks within tolerance (failed: ['kda'])." in table
