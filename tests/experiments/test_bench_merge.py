"""`linattn bench --merge`: several runs as one table of medians (``_bench_merge``)."""

import json

import pytest

from linattn import cli


@pytest.fixture
def tiny_run(tiny_bench_args, tmp_path):
    """``tiny_run(name)``: a tiny ``linattn bench`` into ``tmp_path / name``; its bench.json."""

    def run(name: str):
        args = [*tiny_bench_args, "--mechanisms", "softmax,linear", "--modes", "chunk", "--no-fla"]
        args += ["--generation-t", "16", "--generation-K", "8", "--generation-repeats", "1"]
        assert cli.main(["bench", *args, "--out", str(tmp_path / name)]) == 0
        return tmp_path / name / "bench.json"

    return run


def test_merge_takes_the_median_of_every_measured_number(tiny_run, tmp_path, capsys):
    paths = [tiny_run(f"run{i}") for i in range(3)]
    runs = [json.loads(p.read_text()) for p in paths]
    out = tmp_path / "merged"
    assert cli.main(["bench", "--merge", *map(str, paths), "--out", str(out)]) == 0
    assert "the median of 3 runs" in capsys.readouterr().out
    merged = json.loads((out / "bench.json").read_text())
    assert merged["config"]["merged_runs"] == 3
    assert merged["run_roofs_ops_per_s"] == [r["roof_ops_per_s"] for r in runs]
    for i, row in enumerate(merged["rows"]):
        same = [r["rows"][i] for r in runs]
        assert (row["mechanism"], row["T"]) == (same[0]["mechanism"], same[0]["T"])
        for field in ("forward_s", "forward_efficiency", "forward_backward_efficiency"):
            assert row[field] == sorted(r[field] for r in same)[1]
        assert row["forward_ops"] == same[0]["forward_ops"]
    step = [r["generation"][0]["delta_step_s"] for r in runs]
    assert merged["generation"][0]["delta_step_s"] == sorted(step)[1]


def test_merge_refuses_runs_of_other_options(tiny_run, tmp_path, capsys):
    a = tiny_run("a")
    other = json.loads(a.read_text())
    other["config"]["H"] = 4
    b = tmp_path / "b.json"
    b.write_text(json.dumps(other))
    assert cli.main(["bench", "--merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 2
    assert "run 2 was made with other options" in capsys.readouterr().err
    assert cli.main(["bench", "--merge", str(a), "--out", str(tmp_path / "m")]) == 2
    assert "at least 2 runs" in capsys.readouterr().err


def test_a_truncated_run_is_named(tiny_run, tmp_path, capsys):
    a = tiny_run("a")
    b = tmp_path / "b.json"
    b.write_text(a.read_text()[:-40])  # a copy cut short
    assert cli.main(["bench", "--merge", str(a), str(b), "--out", str(tmp_path / "m")]) == 2
    assert f"linattn bench: error: --merge {b}: not valid JSON" in capsys.readouterr().err
