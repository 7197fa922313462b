"""``linattn build``: the fused CPU chunk kernels built ahead of time, checked, and reported."""

from __future__ import annotations

import pytest

from linattn import build
from linattn.cli import main
from linattn.ops import _native

needs_native = pytest.mark.skipif(
    not _native.available(), reason=f"fused forward unavailable: {_native.reason()}"
)


@needs_native
def test_build_reports_the_ready_kernels(capsys):
    assert main(["build"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("linattn build: the fused CPU chunk kernels are ready (")
    assert str(_native.location()) in out and "from float64 (relative)" in out
    error = float(out.rsplit(" is ", 1)[1].split()[0])
    assert error <= build.CHECK_TOLERANCE


def test_build_exits_1_when_disabled(monkeypatch, capsys):
    monkeypatch.setenv("LINATTN_NATIVE", "0")
    assert main(["build"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("linattn build: error: the fused CPU chunk kernels are unavailable")
    assert "unavailable (disabled by LINATTN_NATIVE=0); the chunk form runs its PyTorch loop" in err


def test_build_exits_1_with_the_reason_when_the_build_failed(monkeypatch, capsys):
    monkeypatch.setattr(_native, "_state", {"ok": False, "reason": "build failed: no compiler"})
    assert main(["build"]) == 1
    assert "unavailable (build failed: no compiler)" in capsys.readouterr().err


@needs_native
def test_build_exits_1_when_the_check_fails(monkeypatch, capsys):
    monkeypatch.setattr(build, "self_check", lambda: 0.5)
    assert main(["build"]) == 1
    assert "failed their check: 5.0e-01 from float64, more than 1e-05" in capsys.readouterr().err


def test_build_exits_2_on_a_bad_timeout(monkeypatch, capsys):
    monkeypatch.setattr(_native, "_state", {})
    monkeypatch.setenv("LINATTN_BUILD_TIMEOUT", "soon")
    assert main(["build"]) == 2
    err = capsys.readouterr().err
    assert "LINATTN_BUILD_TIMEOUT must be a number of seconds, got 'soon'" in err
