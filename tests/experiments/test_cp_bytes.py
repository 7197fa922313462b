"""``linattn cp-bytes``: the bytes a rank sends do not depend on its slice length (2 ranks)."""

from __future__ import annotations

import json

import pytest

from linattn import cli


@pytest.fixture
def main(monkeypatch, worker_env):
    """``linattn cp-bytes ARGS`` through the real CLI; the ranks it starts import this tree."""
    for name, value in worker_env.items():
        monkeypatch.setenv(name, value)
    return lambda argv: cli.main(["cp-bytes", *argv])


@pytest.mark.slow
def test_cp_bytes_at_4096_and_65536_tokens(main, tmp_path, capsys):
    out = tmp_path / "bytes.json"
    argv = ["--lengths", "4096", "65536", "--mechanisms", "linear", "deltanet"]
    assert main([*argv, "--json-out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["mechanism"], r["T"]) for r in rows} == {
        (m, T) for m in ("linear", "deltanet") for T in (4096, 65536)
    }
    for mechanism in ("linear", "deltanet"):
        totals = {r["T"]: r["bytes"] for r in rows if r["mechanism"] == mechanism}
        assert totals[4096] == totals[65536] > 0
    # B=1, H=2, K=V=16, float32: the delta rule's map is [K, K] + [K, V] per head.
    delta = next(r for r in rows if r["mechanism"] == "deltanet")
    assert delta["bytes_maps"] == 4 * 2 * (16 * 16 + 16 * 16)
    assert "deltanet" in capsys.readouterr().out


def test_cp_bytes_rejects_bad_options(main, capsys):
    assert main(["--nproc", "0"]) == 2
    assert "--nproc must be >= 1" in capsys.readouterr().err


def test_cp_bytes_json_prints_the_rows_to_stdout(main, capsys):
    """``--json`` means what it means in every command: JSON on stdout (a file is --json-out)."""
    argv = ["--lengths", "64", "--mechanisms", "linear", "--nproc", "1", "--json"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["world_size"] == 1
    assert [(r["mechanism"], r["T"]) for r in printed["rows"]] == [("linear", 64)]
