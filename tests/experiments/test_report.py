"""`linattn report`: one page with every check, table and figure, and the measured results."""

import contextlib
import html
import io
import json
import os
import re
import sys
from pathlib import Path

import pytest

from linattn import cli
from linattn.experiments import costs, report, table1, verify
from linattn.experiments.report_contents import Report
from linattn.experiments.report_page import markdown_to_html, render_html, render_markdown
from linattn.figures import FIGURES

PIL = pytest.importorskip("PIL.Image")
REPETITIONS = "3"  # a reduced Table 1 keeps the test fast; the default is the spec's 200


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    bench, mqar = root / "bench.json", root / "mqar.jsonl"
    bench.write_text(
        json.dumps(
            {
                "results": [
                    {"name": "softmax", "T": 128, "seconds": 0.001},
                    {"name": "softmax", "T": 256, "seconds": 0.004},
                ]
            }
        )
    )
    mqar.write_text(
        json.dumps({"mechanism": "deltanet", "state_numbers": 4096, "accuracy": 0.875}) + "\n"
    )
    out = root / "out"
    status, stdout, stderr = run_cli(
        [
            "report",
            "--out",
            str(out),
            "--bench",
            str(bench),
            "--mqar",
            str(mqar),
            "--table1-repetitions",
            REPETITIONS,
        ]
    )
    return out, status, stdout, stderr


def printed(argv):
    status, stdout, _ = run_cli(argv)
    assert status == 0
    return stdout.rstrip("\n")


def test_status_and_last_line_is_the_page(built):
    out, status, stdout, stderr = built
    assert status == 0
    assert stdout.splitlines()[-1] == str((out / "index.html").resolve())
    assert "linattn report" in stderr  # the progress bar goes to stderr


def test_files(built):
    out = built[0]
    for name in (
        "index.html",
        "report.md",
        "numbers/attention-maps-numbers.tex",
        "numbers/memory-numbers.tex",
        "data/verify.json",
        "data/table1.json",
        "data/costs.json",
    ):
        assert (out / name).stat().st_size > 0, name
    names = [f.name for f in FIGURES] + ["table1", "bench", "mqar", "state-tracking"]
    for name in names:
        for suffix in ("png", "svg"):
            assert (out / "figures" / f"{name}.{suffix}").stat().st_size > 0


def test_every_image_of_the_page_exists_and_opens(built):
    out = built[0]
    page = (out / "index.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', page)
    assert len(sources) == len(FIGURES) + 4  # Table 1, bench, MQAR, state tracking
    for source in sources:
        with PIL.open(out / source) as image:
            image.load()
    for figure in FIGURES:  # each figure with its caption
        assert f"<b>Figure {figure.number}.</b>" in page


def test_the_page_needs_no_network(built):
    page = (built[0] / "index.html").read_text()
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<style>" in page


def test_checks_are_what_verify_prints(built):
    out = built[0]
    text = printed(["verify"])
    assert f"```text\n{text}\n```" in (out / "report.md").read_text()
    page = (out / "index.html").read_text()
    assert f"<pre>{html.escape(text)}</pre>" in page
    assert page.count('<span class="pass">PASS</span>') == len(verify.run_checks())
    for name in ("section 6.1: the causal mask raises the linear rank to n", "Eckart-Young"):
        assert html.escape(name) in page.split("As printed by")[0]  # in the table of checks
    assert json.loads((out / "data" / "verify.json").read_text())["passed"] is True


def test_tables_are_what_table1_and_costs_print(built):
    out = built[0]
    markdown = (out / "report.md").read_text()
    assert printed(["table1", "--repetitions", REPETITIONS]) in markdown
    assert printed(["costs"]) in markdown
    page = (out / "index.html").read_text()
    assert markdown_to_html(printed(["costs"])) in page


def test_results_are_gathered(built):
    out = built[0]
    page, markdown = (out / "index.html").read_text(), (out / "report.md").read_text()
    assert "| softmax | 256 | 4.000 |" in markdown
    # the recall row: mean, min - max, runs solved (>= 0.9), runs
    assert "| deltanet | 4,096 | 0.875 | 0.875 - 0.875 | 0 | 1 |" in markdown
    assert "No benchmark results" not in page and "No recall results" not in page


def small_report(**changes):
    rows = table1.compute_table1(ns=(8,), repetitions=2)
    computed = costs.compute_costs()
    checks = verify.figure5_checks()
    fields = dict(
        command="linattn report",
        date="today",
        environment={"Python": "3"},
        checks=checks,
        verify_text=verify.report(checks),
        table1_rows=rows,
        table1_text=table1.table1_markdown(rows),
        costs=computed,
        costs_text=costs.costs_markdown(computed),
        bench_source="runs/bench.json",
        mqar_source="runs/mqar.jsonl",
    )
    fields.update(changes)
    return Report(**fields)


def test_absent_results_are_said_so():
    page, markdown = render_html(small_report()), render_markdown(small_report())
    assert "No benchmark results at <code>runs/bench.json</code>" in page
    assert "No recall results at <code>runs/mqar.jsonl</code>" in page
    assert "No benchmark results at `runs/bench.json`" in markdown


def test_a_failed_check_shows():
    failing = verify.Check("made to fail", 1.0, 1e-12, False)
    page = render_html(small_report(checks=[failing]))
    assert "1 of 1 checks FAILED: made to fail" in page
    assert '<span class="fail">FAIL</span>' in page


def test_markdown_to_html_escapes():
    assert markdown_to_html("a <b> & **c**") == "<p>a &lt;b&gt; &amp; <b>c</b></p>"
    # Table 1's caption and the costs table: subscripts and powers typeset, not "β_t", "4n^2 d".
    assert "<i>β<sub>t</sub> = 1</i>" in markdown_to_html("$\\beta_t = 1$")
    assert markdown_to_html("4n^2 d and 6 d_model") == (
        "<p>4n<sup>2</sup> d and 6 d<sub>model</sub></p>"
    )
    assert "<code>run_x ^2</code>" in markdown_to_html("`run_x ^2`")  # code is left as it is


def test_a_folder_it_did_not_write_needs_force(built, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    status, stdout, stderr = run_cli(["report", "--out", str(foreign)])
    assert status == 2 and stdout == ""
    assert "holds files that linattn report did not write; pass --force" in stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert (built[0] / report.MARKER).is_file()  # a report marks itself, for the next run


def fake_build(calls):
    """A stand-in for build_report that writes a page naming the call: the tests below are about
    where the report lands, not what it holds."""
    from types import SimpleNamespace

    def build(args, out, inputs=None):
        calls.append(out)
        (out / "index.html").write_text(f"call {len(calls)}")
        (out / report.MARKER).write_text("")
        return SimpleNamespace(checks=[], seconds=0.0)

    return build


def test_running_again_replaces_its_own_report(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(report, "build_report", fake_build(calls))
    out = tmp_path / "report"
    assert run_cli(["report", "--out", str(out)])[0] == 0
    (out / "stale.png").write_text("from the first run")
    status, stdout, stderr = run_cli(["report", "--out", str(out)])  # no --force
    assert status == 0, stderr
    assert (out / "index.html").read_text() == "call 2" and not (out / "stale.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # nothing left beside it
    assert calls[1].parent == tmp_path and calls[1].name.startswith(".report.partial-")


def test_force_writes_into_a_foreign_folder_and_keeps_its_other_files(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "build_report", fake_build([]))
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert run_cli(["report", "--out", str(out), "--force"])[0] == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "index.html").is_file()


def test_a_failure_while_building_leaves_no_folder(tmp_path, monkeypatch):
    def fail(args, out, inputs=None):
        (out / "index.html").write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "build_report", fail)
    status, _, stderr = run_cli(["report", "--out", str(tmp_path / "new" / "report")])
    assert status == 2 and "No space left on device" in stderr
    assert list(tmp_path.iterdir()) == []  # neither the report nor the folder made for it


@pytest.mark.parametrize("content", ["root:x:0:0:root:/root:/bin/bash\n", '{"results": []}'])
def test_a_bad_bench_file_fails_before_any_work_and_leaves_nothing(content, tmp_path, monkeypatch):
    def work_began(*args):
        raise AssertionError("the report began its work before reading --bench")

    monkeypatch.setattr(verify, "run_checks", work_began)
    monkeypatch.setattr(report, "build_report", work_began)
    bad = tmp_path / "passwd"
    bad.write_text(content)
    status, stdout, stderr = run_cli(["report", "--out", str(tmp_path / "r"), "--bench", str(bad)])
    assert status == 2 and stdout == ""
    assert stderr.startswith("linattn report: error: ") and stderr.count("\n") == 1, stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["passwd"]


def test_smoke_rows_of_a_run_never_replace_the_committed_results(tmp_path):
    run, committed = tmp_path / "runs" / "mqar.jsonl", tmp_path / "committed.jsonl"
    row = {"mechanism": "deltanet", "state_numbers": 4096, "accuracy": 0.9, "preset": "cpu"}
    committed.write_text(json.dumps(row) + "\n")
    os.utime(committed, (1, 1))
    run.parent.mkdir()
    smoke = {**row, "accuracy": 0.031, "preset": "smoke"}
    run.write_text(json.dumps(smoke) + "\n")  # newer, but a smoke run: the committed rows
    from linattn.figures.plots import load_mqar as load

    rows, source, note = report.read_input(None, (run, committed), load, "mqar", "--mqar")
    assert rows == [row] and source == str(committed)
    assert "holds 1 rows of the smoke preset" in note and f"--mqar {run}" in note
    rows, source, _ = report.read_input(run, (run, committed), load, "mqar", "--mqar")
    assert rows == [smoke] and source == str(run)  # given explicitly: shown as it is
    run.write_text(json.dumps(smoke) + "\n" + json.dumps({**row, "accuracy": 0.5}) + "\n")
    rows, source, note = report.read_input(None, (run, committed), load, "mqar", "--mqar")
    assert rows == [{**row, "accuracy": 0.5}] and "without its smoke rows" in note


def test_force_and_empty_directories_are_accepted_and_nothing_is_created(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.txt").write_text("old")
    assert report.prepare_out_dir(tmp_path / "full", force=True) == tmp_path / "full"
    (tmp_path / "empty").mkdir()
    assert report.prepare_out_dir(tmp_path / "empty", force=False) == tmp_path / "empty"
    assert (
        report.prepare_out_dir(tmp_path / "new" / "deep", force=False) == tmp_path / "new" / "deep"
    )
    assert not (tmp_path / "new").exists()  # checked, not made: made only once the work is done


def test_a_file_is_not_a_report_directory(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    status, _, stderr = run_cli(["report", "--out", str(path)])
    assert status == 2 and "exists and is not a directory" in stderr


def test_an_unwritable_directory_gives_a_clear_error(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    status, _, stderr = run_cli(["report", "--out", str(blocker / "report")])
    assert status == 2 and f"cannot write the report to {blocker / 'report'}" in stderr


def test_a_read_only_directory_gives_a_clear_error(tmp_path):
    if os.geteuid() == 0:  # root writes into a directory of mode 500: take one the kernel refuses
        with pytest.raises(ValueError, match="cannot write the report to"):
            report.prepare_out_dir(Path("/sys/linattn-report"), force=False)
        return
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(ValueError, match="cannot write the report to"):
            report.prepare_out_dir(locked, force=False)
    finally:
        locked.chmod(0o700)


def test_without_matplotlib_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    status, _, stderr = run_cli(["report", "--out", str(tmp_path / "r")])
    assert status == 2 and "pip install 'linattn[plot]'" in stderr
    assert not (tmp_path / "r").exists()


def test_defaults_are_the_spec_procedure():
    parser = cli.build_parser()
    args = parser.parse_args(["report"])
    assert args.table1_repetitions == 200 and args.out == Path("report")
    assert args.bench is None and args.mqar is None  # the newer of a run and the committed files
    args.argv = report._argv(args)
    assert args.argv == []  # the page's "Made by" line lists only the flags that were passed


def test_made_by_lists_the_flags_that_were_passed(built):
    page = (built[0] / "index.html").read_text()
    made_by = re.search(r"<p>Made by <code>(.*?)</code>", page).group(1)
    assert made_by.startswith("linattn report --out ") and "--quiet" not in made_by
    assert made_by.count("--bench") == made_by.count("--mqar") == 1
    assert "--force" not in made_by and f"--table1-repetitions {REPETITIONS}" in made_by


def test_ids_are_unique_and_every_anchor_exists(built):
    page = (built[0] / "index.html").read_text()
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    for anchor in re.findall(r'href="#([^"]+)"', page):
        assert anchor in ids


def test_the_page_is_responsive(built):
    page = (built[0] / "index.html").read_text()
    assert page.count("<table>") == page.count('<div class="scroll"><table>')  # own scroll box
    assert "max-width: 100%; height: auto" in page and "760px" not in page
    assert "nav li { display: inline-block; white-space: nowrap;" in page
    for width in re.findall(r'<img src="figures/[^"]+" width="(\d+)"', page):
        assert int(width) <= 1100  # the column: every figure shown whole, at most at its size


def test_the_committed_results_are_used_when_no_newer_run_exists(tmp_path):
    run, committed = tmp_path / "runs" / "bench.json", tmp_path / "committed.json"
    assert report.results_file(None, (run, committed)) == (run, "")
    committed.write_text("{}")
    path, note = report.results_file(None, (run, committed))
    assert path == committed and "committed with the code" in note and "no run at" in note
    run.parent.mkdir()
    run.write_text("{}")
    os.utime(committed, (1, 1))  # the run is the newer file
    path, note = report.results_file(None, (run, committed))
    assert path == run and "your latest run" in note
    os.utime(run, (0, 0))
    path, note = report.results_file(None, (run, committed))
    assert path == committed and "newer than your run" in note
    assert report.results_file(tmp_path / "x", (run, committed))[0] == tmp_path / "x"


def test_a_default_report_shows_the_committed_results_and_says_so(tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)  # no runs/ here: the committed files, found from the checkout
    for name in ("bench.json", "mqar-cpu.jsonl"):
        (tmp_path / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
        (tmp_path / "benchmarks" / "results" / name).write_bytes(
            (root / "benchmarks" / "results" / name).read_bytes()
        )
    status, stdout, _ = run_cli(["report", "--quiet", "--table1-repetitions", "2"])
    assert status == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "No benchmark results" not in page and "No recall results" not in page
    assert "From <code>benchmarks/results/bench.json</code> (the results committed" in page
    assert "From <code>benchmarks/results/mqar-cpu.jsonl</code> (the results committed" in page
    assert "<p>Made by <code>linattn report --table1-repetitions 2 --quiet</code>" in page
