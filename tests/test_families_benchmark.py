"""``benchmarks/families.py`` times every family against its nearest mechanism, on a small
setting: a family registered here with a nearest mechanism gets its row and its line."""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from linattn import registry

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench():
    spec = importlib.util.spec_from_file_location("families_benchmark", BENCHMARKS / "families.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.fixture
def two_families():
    """A reparametrisation of GLA (its op on its own inputs), a family with its own op and one
    whose kernel works at another width (its nearest fed K = 12), all nearest GLA."""
    gla = registry.get("gla")
    same = dataclasses.replace(
        gla,
        name="bench_reparam",
        nearest="gla",
        case=dataclasses.replace(gla.case, as_nearest=True),
    )
    other = dataclasses.replace(registry.get("gated_delta"), name="bench_family", nearest="gla")
    wide = dataclasses.replace(
        gla, name="bench_wide", nearest="gla",
        case=dataclasses.replace(gla.case, nearest_dims=lambda K, V: (K + 4, V)),
    )  # fmt: skip
    for entry in (same, other, wide):
        registry.register(entry)
    yield
    for entry in (same, other, wide):
        registry.unregister(entry.name)


def test_every_family_with_a_nearest_mechanism_gets_a_paired_row(tmp_path, capsys, two_families):
    bench = _bench()
    out = tmp_path / "families.json"
    argv = ["--T", "40", "--H", "2", "--K", "8", "--V", "8", "--repeats", "2", "--clock", "cpu",
            "--mechanisms", "bench_reparam,bench_family,bench_wide", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = {row["mechanism"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"bench_reparam", "bench_family", "bench_wide"}
    assert rows["bench_reparam"]["line"] == 1.05
    assert rows["bench_family"]["line"] == rows["bench_wide"]["line"] == 1.3
    assert (rows["bench_wide"]["nearest_K"], rows["bench_wide"]["nearest_V"]) == (12, 8)
    assert (rows["bench_family"]["nearest_K"], rows["bench_family"]["nearest_V"]) == (8, 8)
    for row in rows.values():
        assert row["nearest"] == "gla" and row["form"] == "chunk"
        for p in ("fwd", "fwdbwd"):
            ratio = row[f"{p}_ratio"]
            assert 0 < ratio["low"] <= ratio["median"] <= ratio["high"]
            assert row[f"{p}_s"] > 0 and row[f"{p}_nearest_s"] > 0
    printed = capsys.readouterr().out
    assert "| bench_reparam | gla | chunk |" in printed and "of 3 within their line" in printed
    assert "| bench_wide | gla (K 12, V 8) | chunk |" in printed


def test_an_unknown_mechanism_fails_before_any_work():
    with pytest.raises(ValueError, match="unknown mechanism 'nope'"):
        _bench().main(["--mechanisms", "nope"])


def test_also_nearest_K_adds_a_labelled_row_per_pair(tmp_path, capsys, two_families):
    """``--also-nearest-K``: each pair timed a second time against the nearest fed keys of that
    width, its own row after the pair's first."""
    bench = _bench()
    out = tmp_path / "families.json"
    argv = ["--T", "40", "--H", "2", "--K", "8", "--V", "8", "--repeats", "1", "--clock", "cpu",
            "--mechanisms", "bench_family", "--also-nearest-K", "16",
            "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mechanism"], r["nearest_K"], r["nearest_V"]) for r in rows] == [
        ("bench_family", 8, 8), ("bench_family", 16, 8),
    ]  # fmt: skip
    printed = capsys.readouterr().out
    assert "| bench_family | gla | chunk |" in printed
    assert "| bench_family | gla (K 16, V 8) | chunk |" in printed and "of 2 within" in printed


def test_the_nearest_can_be_timed_as_several_passes(tmp_path, capsys, two_families):
    # --nearest-calls 2: the nearest runs twice in each timed call (two passes of its memory)
    bench = _bench()
    out = tmp_path / "families.json"
    argv = ["--T", "40", "--H", "2", "--K", "8", "--V", "8", "--repeats", "2", "--clock", "cpu",
            "--mechanisms", "bench_family", "--nearest-calls", "2", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["setup"]["nearest_calls"] == 2
    assert [row["nearest"] for row in data["rows"]] == ["gla x2"]
    assert "| bench_family | gla x2 | chunk |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--nearest-calls", "0"])
