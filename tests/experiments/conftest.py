"""Fixtures shared by the experiments' tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def tiny_bench_args() -> list[str]:
    """``linattn bench`` options for a run of seconds: CPU clock, T = 32, 64, H = 2, K = V = 8."""
    return [
        "--clock",
        "cpu",
        "--memory-min-T",
        "1",
        "--T",
        "32,64",
        "--H",
        "2",
        "--K",
        "8",
        "--V",
        "8",
        "--chunk-size",
        "16",
        "--repeats",
        "1",
    ]
