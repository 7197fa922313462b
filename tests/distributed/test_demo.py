"""``linattn cp-bytes``: the bytes a rank sends do not depend on its slice length (2 ranks)."""

from __future__ import annotations

import argparse
import json
import sys

import pytest

from linattn.distributed import demo

from .test_context_parallel import worker_env


def main(argv: list[str]) -> int:
    """``linattn cp-bytes ARGS`` as the CLI runs it (the CLI maps ValueError to status 2).

    Parsed here rather than through ``linattn.cli.main``, which imports every command's module.
    """
    parser = argparse.ArgumentParser(prog="linattn cp-bytes")
    demo.configure(parser)
    try:
        return demo.run(parser.parse_args(argv))
    except ValueError as error:
        print(f"linattn cp-bytes: error: {error}", file=sys.stderr)
        return 2


@pytest.mark.slow
def test_cp_bytes_at_4096_and_65536_tokens(tmp_path, capsys, monkeypatch):
    for name, value in worker_env().items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "bytes.json"
    argv = ["--lengths", "4096", "65536", "--mechanisms", "linear", "deltanet"]
    assert main([*argv, "--json", str(out)]) == 0
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


def test_cp_bytes_rejects_bad_options(capsys):
    assert main(["--nproc", "0"]) == 2
    assert "--nproc must be >= 1" in capsys.readouterr().err
