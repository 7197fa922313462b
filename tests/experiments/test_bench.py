"""`linattn bench`: the structure of its output on a tiny configuration (never its timings)."""

import argparse
import json

import pytest
import torch

from linattn import cli
from linattn.experiments import _bench_cases as cases
from linattn.experiments import bench


def test_tiny_run_writes_json_markdown_and_plot(tiny_bench_args, tmp_path, capsys):
    args = tiny_bench_args + [
        "--mechanisms",
        "softmax,linear,delta",
        "--modes",
        "chunk,recurrent",
        "--generation-t",
        "16,32",
        "--generation-K",
        "8",
        "--generation-repeats",
        "1",
        "--no-fla",
        "--out",
        str(tmp_path),
    ]
    assert cli.main(["bench", *args]) == 0
    out = capsys.readouterr().out
    assert "| mechanism | form | T |" in out and "**Generation step**" in out
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["machine"]["malloc"] == "malloc defaults" and "; malloc defaults; " in out
    # Which loop ran the chunk forms: the fused C++ one where it compiled, else PyTorch's.
    loop = result["machine"]["chunk_loop"]
    assert loop == bench.chunk_loop() and f"; chunk form: {loop})" in out
    assert (tmp_path / "bench.md").read_text().strip() == out.strip()
    rows = result["rows"]
    keys = {(r["mechanism"], r["mode"], r["T"]) for r in rows}
    assert keys == {("softmax", "chunk", 32), ("softmax", "chunk", 64)} | {
        (m, mode, T)
        for m in ("linear", "delta")
        for mode in ("chunk", "recurrent")
        for T in (32, 64)
    }
    for r in rows:
        assert r["forward_s"] > 0 and r["forward_backward_s"] > 0
        assert r["forward_efficiency"] == pytest.approx(r["forward_rate"] / r["roof_ops_per_s"])
        assert r["backward_ops"] == cases.BACKWARD_FACTOR * r["forward_ops"]
        if r["mode"] == "chunk":  # peak memory is measured for the chunk forms and softmax
            assert r["forward_peak_bytes"] >= 0 and r["forward_backward_peak_bytes"] >= 0
    assert [g["t"] for g in result["generation"]] == [16, 32]
    assert result["generation"][0]["cache_bytes"] == 4 * 2 * 16 * 8 * 2  # 2 t d per head, float32
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "bench.png").stat().st_size > 0


def test_operation_counts_follow_section_9():
    from linattn.reference.costs import (
        delta_training_ops,
        dplr_training_ops,
        linear_training_ops,
    )

    for name, count in (
        ("linear", linear_training_ops),
        ("gla", linear_training_ops),
        ("delta", delta_training_ops),
        ("kda", delta_training_ops),
        ("rwkv7", dplr_training_ops),
    ):
        mech = cases.by_name(name)
        assert cases.forward_ops(mech, 2, 128, 3, 16, 16, 32) == 2 * 3 * count(128, 16, 16, 32)
    assert cases.forward_ops(cases.by_name("softmax"), 1, 128, 2, 16, 16, 32) == 2 * 4 * 128**2 * 16
    # DeltaProduct: the delta rule over its T n_h write rows
    product = cases.forward_ops(cases.by_name("delta_product"), 1, 128, 2, 16, 16, 32)
    assert product == 2 * delta_training_ops(256, 16, 16, 32)


def test_inputs_are_in_the_ops_ranges():
    for mech in cases.mechanisms():
        x = cases.make_inputs(mech, 1, 16, 2, 8, 8)
        assert x["v"].dtype == torch.float32 and x["v"].shape[-2:] == (2, 8)
        if "beta" in x:
            assert bool(((x["beta"] >= 0) & (x["beta"] <= 2)).all())
        if "g" in x:
            assert bool((x["g"] <= 0).all())


def test_fla_comparison_when_installed():
    mech = cases.by_name("delta")
    if cases.fla_reference(mech) is None:
        pytest.skip("fla-core is not installed")
    x = cases.make_inputs(mech, 1, 64, 2, 16, 16)
    ours = cases.call(mech, x, "chunk", 16)
    theirs = cases.fla_reference(mech)(cases.prepare_fla(x), 16)
    torch.testing.assert_close(theirs.float(), ours, rtol=1e-4, atol=1e-4)


def test_bad_options_exit_2(capsys):
    with pytest.raises(SystemExit) as error:
        cli.main(["bench", "--mechanisms", "nope"])
    assert error.value.code == 2
    assert "expected a subset" in capsys.readouterr().err
    assert bench._choices("chunk,parallel", bench.MODES) == ["chunk", "parallel"]


def test_every_efficiency_is_taken_against_the_highest_roof(tiny_bench_args, monkeypatch):
    """A roof measured while the machine was busy (lower) must not flatter the rows after it."""
    samples = iter([150e9, 89e9, 140e9])
    monkeypatch.setattr(bench, "matmul_rate", lambda: next(samples))
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    args = parser.parse_args([*tiny_bench_args, "--mechanisms", "linear,delta,kda",
                              "--modes", "chunk", "--no-fla", "--no-memory",
                              "--no-backward"])  # fmt: skip
    args.generation_t = []  # no generation table: this test is about the roof
    result = bench.compute_bench(args)
    assert result["roof_ops_per_s"] == 150e9
    assert result["roof_samples_ops_per_s"] == [150e9, 89e9, 140e9]
    for r in result["rows"]:
        assert r["roof_ops_per_s"] == 150e9
        assert r["forward_efficiency"] == pytest.approx(r["forward_rate"] / 150e9)
    assert "the highest of 3 measurements, lowest 89" in bench.bench_markdown(result)


@pytest.mark.parametrize("applied", [True, False])
def test_tune_malloc_option_is_applied_and_reported(
    applied, tiny_bench_args, tmp_path, capsys, monkeypatch
):
    calls = []
    # The real call is process-wide (tests/test_cpu.py runs it in a child process).
    monkeypatch.setattr(bench, "tune_malloc", lambda: calls.append(1) or applied)
    args = [*tiny_bench_args, "--mechanisms", "linear", "--modes", "chunk", "--T", "32"]
    args += ["--no-memory"]
    args += ["--generation-t", "none", "--no-fla", "--tune-malloc", "--out", str(tmp_path)]
    assert cli.main(["bench", *args]) == 0
    out = capsys.readouterr().out
    malloc = json.loads((tmp_path / "bench.json").read_text())["machine"]["malloc"]
    assert calls == [1]
    expected = bench.DESCRIPTION if applied else "not tuned (no glibc mallopt)"
    assert malloc == expected and f"; {expected}; chunk form: " in out


def test_fla_and_ours_are_timed_in_turns(monkeypatch):
    calls = []
    o = torch.zeros(1, 8, 2, 4)

    def ours(mech, inputs, mode, C):
        calls.append("ours")
        return o

    def theirs(prepared, C):
        calls.append("fla")
        return o + 0.5

    monkeypatch.setattr(cases, "call", ours)
    monkeypatch.setattr(cases, "fla_reference", lambda mech: theirs)
    monkeypatch.setattr(cases, "prepare_fla", lambda inputs: inputs)
    fla = bench._time_fla(cases.by_name("delta"), {}, 4, 3)
    assert calls == ["fla", "ours"] + ["ours", "fla"] * 3  # the check, then three turns
    assert fla["fla_speedup"] == fla["fla_forward_s"] / fla["fla_ours_forward_s"]
    assert fla["fla_max_abs_diff"] == 0.5


def test_threads_takes_one_count_or_several(capsys):
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    assert parser.parse_args(["--threads", "2"]).threads == [2]
    assert parser.parse_args(["--threads", "1,2,4"]).threads == [1, 2, 4]
    with pytest.raises(SystemExit):
        parser.parse_args(["--threads", "0,2"])
    assert "integer >= 1" in capsys.readouterr().err


def test_several_thread_counts_need_the_wall_clock(tiny_bench_args, tmp_path, capsys):
    # CPU time adds the threads' times: a speed-up cannot be measured with it.
    args = [*tiny_bench_args, "--threads", "1,2", "--out", str(tmp_path)]
    assert cli.main(["bench", *args]) == 2
    assert "needs --clock wall" in capsys.readouterr().err
    assert not (tmp_path / "scaling.json").exists()


def test_bench_errors_take_the_one_format(tiny_bench_args, tmp_path, capsys):
    args = [*tiny_bench_args, "--threads", "1,2", "--clock", "cpu", "--out", str(tmp_path)]
    assert cli.main(["bench", *args]) == 2
    assert capsys.readouterr().err == (
        "linattn bench: error: --threads with several counts needs --clock wall\n"
    )  # one format


def test_scaling_table_per_thread_count(tiny_bench_args, tmp_path, monkeypatch, capsys):
    # The timings are stand-ins (seconds that fall with the thread count, and a roof per
    # count) so that the efficiency and speed-up columns can be checked as computations.
    roof = {1: 100e9, 3: 250e9}
    monkeypatch.setattr(bench, "matmul_rate", lambda: roof[torch.get_num_threads()])
    calls = []

    def fake_time(n, mech, inputs, C, backward, repeats, d_o=None):
        calls.append((mech.name, inputs["q"].shape[1], n, backward))
        return (2.0 if backward else 1.0) * inputs["q"].shape[1] / n**0.5

    monkeypatch.setattr(bench, "_time_at", fake_time)
    before = torch.get_num_threads()
    args = [*tiny_bench_args, "--clock", "wall", "--threads", "3,1", "--mechanisms",
            "linear,delta", "--repeats", "3", "--out", str(tmp_path)]  # fmt: skip
    assert cli.main(["bench", *args]) == 0
    assert torch.get_num_threads() == before  # restored
    out = capsys.readouterr().out
    assert "| mechanism | T | threads |" in out
    result = json.loads((tmp_path / "scaling.json").read_text())
    assert result["threads"] == [1, 3]
    assert result["roof_ops_per_s"] == {"1": 100e9, "3": 250e9}
    # Rounds over the whole table: in each, every (mechanism, T) forward then forward + backward,
    # the counts interleaved call by call, in order in even rounds and reversed in odd ones.
    repeats = result["config"]["repeats"]
    want = [
        (name, T, n, backward)
        for i in range(repeats)
        for name in ("linear", "delta")
        for T in (32, 64)
        for backward in (False, True)
        for n in ((1, 3) if i % 2 == 0 else (3, 1))
    ]
    assert calls == want
    rows = {(r["mechanism"], r["T"], r["threads"]): r for r in result["rows"]}
    assert len(rows) == 2 * 2 * 2
    for (name, T, n), r in rows.items():
        one = rows[(name, T, 1)]
        assert r["forward_s"] == pytest.approx(T / n**0.5)
        assert r["forward_speedup"] == pytest.approx(one["forward_s"] / r["forward_s"])
        assert r["forward_backward_speedup"] == pytest.approx(n**0.5)
        assert r["forward_efficiency"] == pytest.approx(r["forward_ops"] / r["forward_s"] / roof[n])
        both = cases.BACKWARD_FACTOR * r["forward_ops"] / r["forward_backward_s"] / roof[n]
        assert r["forward_backward_efficiency"] == pytest.approx(both)
    assert (tmp_path / "scaling.md").read_text().strip() == out.strip()
    assert (tmp_path / "scaling.png").stat().st_size > 0


def test_scaling_times_the_chunk_form_at_each_count(tiny_bench_args, monkeypatch):
    # The real timer: each count is set before its call (seen by the op), and restored.
    seen = []
    real = bench._time_call

    def spy(mech, inputs, mode, C, backward, repeats, d_o=None):
        seen.append((mode, torch.get_num_threads()))
        return real(mech, inputs, mode, C, backward, repeats, d_o)

    monkeypatch.setattr(bench, "_time_call", spy)
    monkeypatch.setattr(bench, "matmul_rate", lambda: 1e9)
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    args = parser.parse_args([*tiny_bench_args, "--clock", "wall", "--threads", "1,2",
                              "--mechanisms", "gla", "--T", "32", "--no-backward",
                              "--repeats", "2"])  # fmt: skip
    result = bench.compute_scaling(args)
    # Each timed call after a warm-up call at its count: (1, 2) in the first round, (2, 1) next.
    assert seen == [("chunk", 1), ("chunk", 2), ("chunk", 2), ("chunk", 1)]
    assert [r["threads"] for r in result["rows"]] == [1, 2]
    assert all(r["forward_s"] > 0 for r in result["rows"])


def test_scaling_speedup_is_the_median_of_paired_ratios(tiny_bench_args, monkeypatch):
    # A load that changes from call to call: the rounds' ratios are 2, 5 and 1 (median 2), while
    # the medians' ratio is 3 / 2 = 1.5.
    monkeypatch.setattr(bench, "matmul_rate", lambda: 1e9)
    load = iter([1, 1, 4, 10, 3, 6])  # rounds: (1, 2), (2, 1), (1, 2) threads

    def fake_time(n, mech, inputs, C, backward, repeats, d_o=None):
        return next(load) / n

    monkeypatch.setattr(bench, "_time_at", fake_time)
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    args = parser.parse_args([*tiny_bench_args, "--clock", "wall", "--threads", "1,2",
                              "--mechanisms", "linear", "--T", "32", "--no-backward",
                              "--repeats", "3"])  # fmt: skip
    one, two = bench.compute_scaling(args)["rows"]
    assert one["forward_runs_s"] == [1, 10, 3] and two["forward_runs_s"] == [0.5, 2, 3]
    assert one["forward_s"] == 3 and two["forward_s"] == 2
    assert two["forward_speedup"] == 2.0
    assert one["forward_speedup"] == 1.0


def test_an_efficiency_above_one_is_explained_and_one_thread_is_singular():
    """The causal softmax kernel skips half the spec's 4 T^2 d: its efficiency can pass 1, and
    the table says why; a one-thread run says "1 thread"."""
    row = {"mechanism": "softmax", "mode": "chunk", "T": 4096, "forward_s": 0.01,
           "forward_rate": 2e11, "forward_efficiency": 1.19}  # fmt: skip
    result = {
        "config": {"B": 1, "H": 8, "K": 64, "V": 64, "chunk_size": 64, "clock": "wall"},
        "machine": {"threads": 1},
        "roof_ops_per_s": 1.6e11,
        "rows": [row],
        "generation": [],
    }
    text = bench.bench_markdown(result)
    assert "1 thread;" in text and "1 threads" not in text
    assert "Efficiency above 1 (softmax chunk at T = 4,096)" in text
    assert "skips the blocks above the diagonal" in text
    assert bench.efficiency_note([{**row, "forward_efficiency": 0.9}]) == ""
