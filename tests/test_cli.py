"""The `linattn` command: exit statuses and error messages, in process and once as a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from linattn import cli
from linattn.experiments import verify

SRC = Path(__file__).resolve().parents[1] / "src"


def test_verify_passes(capsys):
    assert cli.main(["verify"]) == 0
    out = capsys.readouterr().out
    assert "causal softmax: each row sums to one" in out
    assert "WY form: the product of 6 transitions is I - K^T T K" in out
    assert "FAIL" not in out


def test_verify_json(monkeypatch, capsys):
    monkeypatch.setattr(verify, "SECTIONS", (verify.figure5_checks,))  # quick: the format only
    assert cli.main(["verify", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["passed"] is True and len(payload["checks"]) == 3


def test_verify_exits_1_when_a_check_fails(monkeypatch, capsys):
    failing = verify.compare("a check that fails", 1.0, 2.0)
    monkeypatch.setattr(verify, "SECTIONS", (lambda: [failing],))
    assert cli.main(["verify"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_table1_small(capsys):
    assert cli.main(["table1", "--ns", "8,16", "--repetitions", "4", "--r", "8"]) == 0
    out = capsys.readouterr().out
    assert "| 8 |" in out and "| 16 |" in out and "r = d = 8" in out


def test_costs_json(capsys):
    assert cli.main(["costs", "--json", "--n", "1024"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["n"] == 1024


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["table1", "--ns", "8,abc"], "argument --ns: expected an integer >= 1, got 'abc'"),
        (["table1", "--ns", "8,,16"], "argument --ns: expected integers >= 1 separated by commas"),
        (["table1", "--repetitions", "0"], "argument --repetitions: expected an integer >= 1"),
        (["table1", "--seed", "-1"], "argument --seed: expected an integer >= 0"),
        (["costs", "--C", "0"], "argument --C: expected an integer >= 1, got 0"),
        (["costs", "--d-model", "big"], "argument --d-model: expected an integer >= 1"),
        (["verify", "--nonsense"], "unrecognized arguments: --nonsense"),
        (["accuracy", "--seed", "-3"], "argument --seed: expected an integer >= 0, got -3"),
        (["memory", "--mixers", "kda,,softmax"], "expected names separated by commas"),
        (["memory", "--mixers", "kda,"], "expected names separated by commas"),
        (["memory", "--mixers", "kda,gru"], "unknown mixers ['gru'] in 'kda,gru'"),
    ],
)
def test_bad_options_exit_2_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_library_error_exits_2(monkeypatch, capsys):
    from linattn.experiments import costs

    def bad(*args):
        raise ValueError("C must be an integer >= 1, got 0")

    monkeypatch.setattr(costs, "compute_costs", bad)
    assert cli.main(["costs"]) == 2
    assert "linattn costs: error: C must be an integer >= 1" in capsys.readouterr().err


def run_module(*argv):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "linattn", *argv], capture_output=True, text=True, env=env
    )


def test_python_m_linattn():
    ok = run_module("costs")
    assert ok.returncode == 0 and "33,554,432" in ok.stdout
    bad = run_module("table1", "--ns", "8,abc")
    assert bad.returncode == 2 and "argument --ns" in bad.stderr


def test_a_failed_write_exits_2_with_one_line(monkeypatch, capsys):
    """A full disk while the report is written: one line naming the file, not a traceback."""
    import errno

    from linattn.experiments import report

    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device", "report/index.html")

    monkeypatch.setattr(report, "build_report", full_disk)
    monkeypatch.setattr(report, "prepare_out_dir", lambda out, force: out)
    assert cli.main(["report", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "linattn report: error: [Errno 28] No space left on device: 'report/index.html'\n"
    )


def test_ctrl_c_exits_130_with_one_line(monkeypatch, capsys):
    from linattn.experiments import costs

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(costs, "compute_costs", interrupted)
    try:
        status = cli.main(["costs"])
    except KeyboardInterrupt:  # escaping, it would stop the whole pytest session
        pytest.fail("Ctrl-C escaped cli.main as a traceback")
    assert status == 130
    assert capsys.readouterr().err == "linattn costs: interrupted\n"


def test_a_multi_line_message_is_printed_on_one_line(monkeypatch, capsys):
    from linattn.experiments import costs

    def bad(*args):
        raise ValueError("first line\n  second line")

    monkeypatch.setattr(costs, "compute_costs", bad)
    assert cli.main(["costs"]) == 2
    assert capsys.readouterr().err == "linattn costs: error: first line second line\n"


def refuse_work(monkeypatch, module, name):
    def work(*args, **kwargs):
        raise AssertionError(f"{name} ran before the output path was checked")

    monkeypatch.setattr(module, name, work)


def test_bench_out_is_checked_before_any_timing(tmp_path, monkeypatch, capsys):
    from linattn.experiments import bench

    refuse_work(monkeypatch, bench, "compute_bench")
    out = tmp_path / "a-file"
    out.write_text("")
    assert cli.main(["bench", "--out", str(out)]) == 2
    assert (
        capsys.readouterr().err
        == f"linattn bench: error: --out {out} is a file; expected a folder\n"
    )


def test_cp_bytes_json_is_checked_before_the_ranks_start(tmp_path, monkeypatch, capsys):
    from linattn.experiments import launch

    refuse_work(monkeypatch, launch, "run_local")
    parent = tmp_path / "a-file"
    parent.write_text("")
    path = parent / "rows.json"
    assert cli.main(["cp-bytes", "--json-out", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"linattn cp-bytes: error: --json-out {path}: {parent} is a file, not a folder\n"


@pytest.mark.slow
def test_ctrl_c_during_a_sweep_with_workers_is_one_line_and_130(tmp_path):
    """A real SIGINT to the whole process group, as a terminal sends it, workers included."""
    import signal
    import time

    paths = ["--results", str(tmp_path / "r.jsonl"), "--checkpoint-dir", str(tmp_path / "ck")]
    argv = [
        "mqar",
        "--preset",
        "smoke",
        "--workers",
        "2",
        "--no-progress",
        "--plot",
        "none",
        *paths,
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "linattn", *argv],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline().startswith("MQAR preset")  # parsed, the workers starting
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (130, "linattn mqar: interrupted\n")


# every size option bounded against the machine's memory, before any work.
T13 = str(10**13)


@pytest.mark.parametrize(
    ("argv", "module", "work", "named"),
    [
        (["accuracy", "--T", "10000000000"], "accuracy", "compute_accuracy", "--T 10000000000"),
        (
            ["accuracy", "--T", "99999999999999999999"],
            "accuracy",
            "compute_accuracy",
            "--T 99999999999999999999 --K 16 --V 16",
        ),
        (["accuracy", "--K", "4000000000000"], "accuracy", "compute_accuracy", "--K 4000000000000"),
        (["bench", "--T", "100000000000"], "bench", "compute_bench", "--T 100000000000 --B 1"),
        (["bench", "--generation-t", T13], "bench", "compute_bench", f"--generation-t {T13}"),
        (["table1", "--r", "100000000"], "table1", "compute_table1", "--r 100000000 --ns"),
        (["cp-bytes", "--lengths", "1000000000000"], "launch", "run_local", "--lengths 10000"),
    ],
)
def test_a_size_beyond_the_machine_is_refused_naming_the_option(
    argv, module, work, named, tmp_path, monkeypatch, capsys
):
    import importlib

    if argv[0] == "bench":
        argv = [*argv, "--out", str(tmp_path)]
    refuse_work(monkeypatch, importlib.import_module(f"linattn.experiments.{module}"), work)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"linattn {argv[0]}: error: ") and err.count("\n") == 1, err
    assert named in err and " would take at least " in err and "this machine has " in err


def test_mqar_sizes_are_bounded_before_training(tmp_path, monkeypatch, capsys):
    from linattn.experiments.mqar import cli as mqar_cli

    refuse_work(monkeypatch, mqar_cli, "run_sweep")
    argv = ["mqar", "--preset", "smoke", "--seq-len", "100000", "--vocab-size", "100000000"]
    argv += ["--results", str(tmp_path / "r.jsonl"), "--plot", "none", "--checkpoint-dir", "none"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("linattn mqar: error: --seq-len 100000 --vocab-size 100000000 ")
    assert " would take at least " in err


def test_sizes_that_fit_pass_the_bound(capsys):
    assert cli.main(["accuracy", "--T", "40", "--K", "4", "--V", "4"]) == 0


def test_an_allocation_that_fails_anyway_is_one_line(monkeypatch, capsys):
    """Sizes under the bound whose allocation still fails (memory taken by others): one line."""
    from linattn.experiments import accuracy

    def no_memory(*args):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8")

    monkeypatch.setattr(accuracy, "compute_accuracy", no_memory)
    assert cli.main(["accuracy"]) == 2
    assert capsys.readouterr().err.startswith("linattn accuracy: error: out of memory: ")


def test_another_runtime_error_is_not_taken_for_memory(monkeypatch):
    from linattn.experiments import accuracy

    def bug(*args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(accuracy, "compute_accuracy", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["accuracy"])


# an input file that is missing, not a regular file, or too large is refused before
# any work, in the one error format.
def test_bench_merge_of_a_missing_file(tmp_path, capsys):
    missing = tmp_path / "nonexistent.json"
    assert cli.main(["bench", "--merge", str(missing), "--out", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == (
        f"linattn bench: error: --merge {missing}: No such file or directory\n"
    )


def test_bench_merge_of_a_device_or_an_oversized_file(tmp_path, capsys):
    from linattn.experiments._args import MAX_INPUT_BYTES

    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)  # sparse: nothing written
    for path, reason in (("/dev/zero", "is not a regular file"), (huge, "is 256 MiB, more than")):
        assert cli.main(["bench", "--merge", str(path), "--out", str(tmp_path / "m")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"linattn bench: error: --merge {path} {reason}"), err


@pytest.mark.parametrize("flag", ["--bench", "--mqar", "--state-tracking"])
def test_report_refuses_a_device_as_input_before_verify(flag, tmp_path, monkeypatch, capsys):
    from linattn.experiments import report

    refuse_work(monkeypatch, report, "build_report")
    refuse_work(monkeypatch, report, "prepare_out_dir")
    assert cli.main(["report", "--out", str(tmp_path / "r"), flag, "/dev/zero"]) == 2
    assert capsys.readouterr().err == (
        f"linattn report: error: {flag} /dev/zero is not a regular file\n"
    )


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["table1", "--ns", "8,abc"], False),  # a bad value: one line
        (["bench", "--mechanisms", "nope"], False),
        (["cp-bytes", "--mechanisms", "nope"], False),  # a refused choice
        (["verify", "--nonsense"], True),  # the usage itself is wrong: the usage helps
    ],
)
def test_one_error_line_and_a_usage_block_only_for_a_wrong_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("usage: ") == usage, err
    if not usage:
        assert err.startswith(f"linattn {argv[0]}: error: ") and err.count("\n") == 1, err
