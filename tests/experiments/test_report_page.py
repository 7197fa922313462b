"""The report page: the committed results found from any folder (and which
file it used), the benchmark's and the recall sweep's setup and machine, the tables readable on
a phone, the printed blocks rendered, every plot kept at its legible width."""

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from linattn import cli
from linattn.experiments import costs, report, report_setup, table1, verify
from linattn.experiments.report_contents import Report
from linattn.experiments.report_page import _bench_rows, render_html, render_markdown
from linattn.figures import legibility, plots, style

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
pytest.importorskip("matplotlib")


def small_report(**changes):
    rows = table1.compute_table1(ns=(8,), repetitions=2)
    computed = costs.compute_costs()
    checks = verify.figure5_checks()
    fields = dict(
        command="linattn report",
        date="today",
        environment={"Python": "3", "CPU cores": "2"},
        checks=checks,
        verify_text=verify.report(checks),
        table1_rows=rows,
        table1_text=table1.table1_markdown(rows),
        costs=computed,
        costs_text=costs.costs_markdown(computed),
        bench_source="runs/bench/bench.json",
        mqar_source="runs/mqar.jsonl",
    )
    fields.update(changes)
    return Report(**fields)


def committed_report(**changes):
    return small_report(
        bench=plots.load_bench(RESULTS / "bench.json"),
        bench_source=str(RESULTS / "bench.json"),
        mqar=plots.load_mqar(RESULTS / "mqar-cpu.jsonl"),
        mqar_source=str(RESULTS / "mqar-cpu.jsonl"),
        **changes,
    )


def test_the_clone_is_found_from_the_package():
    assert report.CLONE == ROOT
    assert report.BENCH_FILES[-2:] == (RESULTS / "bench.json", report.PACKAGED / "bench.json")
    assert report.MQAR_FILES[-2:] == (
        RESULTS / "mqar-cpu.jsonl",
        report.PACKAGED / "mqar-cpu.jsonl",
    )


@pytest.mark.parametrize("name", ["bench.json", "mqar-cpu.jsonl", "state-tracking-default.jsonl"])
def test_the_packages_copy_is_the_committed_one_and_is_package_data(name):
    # An installed wheel has no clone: it carries a copy, which must stay the committed file.
    assert (report.PACKAGED / name).read_bytes() == (RESULTS / name).read_bytes()
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["linattn.experiments"]
    assert f"results/{name}" in patterns


def test_the_packages_copy_is_used_without_a_clone(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "PACKAGED", tmp_path / "package")
    (tmp_path / "package").mkdir()
    packaged = tmp_path / "package" / "bench.json"
    packaged.write_text("{}")
    run, here = tmp_path / "runs.json", tmp_path / "here.json"
    path, note = report.results_file(None, (run, here, packaged))
    assert path == packaged
    assert note == f"(the results committed with the code, the package's copy: no run at {run})"


def test_the_clones_copy_is_used_when_the_folder_has_none(tmp_path):
    run, here, clone = tmp_path / "runs.json", tmp_path / "here.json", tmp_path / "clone.json"
    clone.write_text("{}")
    path, note = report.results_file(None, (run, here, clone))
    assert (
        path == clone
        and note == f"(the results committed with the code, the clone's copy: no run at {run})"
    )
    here.write_text("{}")
    path, note = report.results_file(None, (run, here, clone))
    assert path == here and "clone's copy" not in note  # the folder's own copy comes first


def test_a_missing_result_names_where_it_looked_and_the_flag():
    assert report.missing_note(Path("x.json"), (), "bench", "--bench") == (
        "no such file (given with --bench)"
    )
    note = report.missing_note(None, report.BENCH_FILES, "bench", "--bench")
    assert note.startswith("none at runs/bench/bench.json (run linattn bench) or at ")
    assert str(RESULTS / "bench.json") in note and note.endswith("pass --bench FILE to include one")
    page = render_html(small_report(bench_note=note, mqar_note="pass --mqar FILE"))
    assert "No benchmark results at <code>runs/bench/bench.json</code>: none at" in page
    assert "--bench FILE" in page and "--mqar FILE" in page
    assert "pass --bench FILE" in render_markdown(small_report(bench_note=note))


def test_a_report_run_outside_the_clone_shows_the_committed_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs/ and no benchmarks/ here
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = cli.main(["report", "--quiet", "--table1-repetitions", "2"])
    assert status == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "No benchmark results" not in page and "No recall results" not in page
    for name in ("bench.json", "mqar-cpu.jsonl"):
        assert f"From <code>{RESULTS / name}</code> (the results committed with the code, the " \
            "clone&#x27;s copy: no run at runs/" in page  # fmt: skip


def test_the_benchmark_states_its_setup_and_machine():
    bench = plots.load_bench(RESULTS / "bench.json")
    text = report_setup.bench_setup(bench)
    assert "B = 1, H = 8, K = 64, V = 64, C = 64" in text
    assert "1 thread, the median of 3 repeats (CPU time)" in text
    assert "Measured on Linux-" in text and "torch 2.13.0+cpu" in text and "GFLOP/s" in text
    assert "not necessarily the machine this report was built on" in text
    bare = report_setup.bench_setup({"results": []})
    assert "does not name its machine" in bare


def test_the_recall_sweep_states_its_setup():
    rows = plots.load_mqar(RESULTS / "mqar-cpu.jsonl")
    text = report_setup.mqar_setup(rows)
    for part in ("preset cpu", "d_model 64", "sequence length 64", "key-value pairs 8",
                 "vocabulary 128", "batch 32", "step budget 500", "blank and random fillers",
                 "lr sweep 0.002, 0.0045, 0.01 (the best per seed)", "seeds 0 to 2", "threads 1",
                 "not name the machine"):  # fmt: skip
        assert part in text, part


def test_the_page_states_the_setups_and_labels_its_machine():
    page = render_html(committed_report())
    assert page.count("<p>Setup: ") == 2
    assert '<h2 id="environment">This report\'s machine</h2>' in page
    assert "<th></th>" not in page  # no empty header row
    markdown = render_markdown(committed_report())
    assert "Setup: float32 inputs" in markdown and "## This report's machine" in markdown


def test_milliseconds_have_thousands_separators():
    rows = _bench_rows(committed_report())
    assert ("softmax, chunk", "16,384", "2,630.255") in rows
    assert all(re.fullmatch(r"\d{1,3}(,\d{3})*\.\d{3}", ms) for _, _, ms in rows)


def test_the_printed_blocks_render_their_markup():
    page = render_html(small_report())
    blocks = re.findall(r'<pre class="printed">(.*?)</pre>', page, re.S)
    assert len(blocks) == 2  # table1 and costs
    for block in blocks:
        assert "**" not in block and "$" not in block
    assert (
        "<b>Table 1. Root-mean-square read error of four memories with <i>r = d = 32</i></b>"
        in blocks[0]
    )
    assert "| Pairs stored <i>n</i> | Additive |" in blocks[0]  # the printed layout kept


def test_the_checks_table_keeps_its_verdict_and_names_readable():
    page = render_html(small_report())
    assert "td.verdict { white-space: nowrap; }" in page and "td.check { min-width: 15em; }" in page
    header = re.search(r"<tr><th>#</th>(.*?)</tr>", page).group(1)
    assert header.startswith("<th>Check</th><th>Verdict</th>")  # the verdict beside the name
    assert page.count('<td class="verdict"><span class="pass">PASS</span></td>') == 3


def test_every_plot_keeps_its_legible_width(tmp_path):
    figures = tmp_path / "figures"
    rows = table1.compute_table1(ns=(8, 16), repetitions=2)
    plots.table1_plot(rows, figures)
    plots.bench_plot(plots.load_bench(RESULTS / "bench.json"), figures)
    plots.mqar_plot(plots.load_mqar(RESULTS / "mqar-cpu.jsonl"), figures)
    widths = {p.stem: legibility.png_css_width(p) for p in figures.glob("*.png")}
    legible = {name: legibility.legible_width(width) for name, width in widths.items()}
    page = render_html(committed_report(widths=widths, legible=legible))
    for name in ("table1", "bench", "mqar"):
        tag = re.search(rf'<img src="figures/{name}.png"[^>]*>', page).group(0)
        assert f'width="{widths[name]}" style="min-width: {legible[name]}px"' in tag, tag


@pytest.fixture(scope="module")
def plots_text_kept(tmp_path_factory):
    """The three data plots with their SVG text kept as text, to measure it."""
    out = tmp_path_factory.mktemp("plots")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(style, "SVG_FONTTYPE", "none")
        plots.table1_plot(table1.compute_table1(ns=(8, 16, 32), repetitions=2), out)
        plots.bench_plot(plots.load_bench(RESULTS / "bench.json"), out)
        plots.mqar_plot(plots.load_mqar(RESULTS / "mqar-cpu.jsonl"), out)
    return out


@pytest.mark.parametrize("name", ["table1", "bench", "mqar"])
def test_the_data_plots_follow_the_figures_legibility_rule(plots_text_kept, name):
    # The rule of the nine figures (tests/figures/test_legibility.py): smallest text of at least
    # style.SMALLEST_TEXT points, at most MAX_WIDTH inches wide, 11 px tall at 1,280 and 390 px.
    svg = plots_text_kept / f"{name}.svg"
    width, sizes = legibility.svg_text_sizes(svg)
    assert min(sizes) >= style.SMALLEST_TEXT, (name, min(sizes))
    assert width / 72 <= style.MAX_WIDTH + 0.05
    for page_width in (1280, 390):
        assert legibility.smallest_text_px(svg, page_width) >= legibility.MINIMUM_PX - 0.05


def test_the_bench_plot_draws_every_form_timed_at_one_length(monkeypatch):
    kept = {}
    monkeypatch.setattr(style, "save", lambda fig, out_dir, name: kept.setdefault(name, fig))
    plots.bench_plot(plots.load_bench(RESULTS / "bench.json"), "unused")
    lines, side = kept["bench"].axes
    assert {line.get_linestyle() for line in lines.get_lines()} == {"-"}  # chunk, over T
    markers = {line.get_marker() for line in side.get_lines()}
    assert markers == {"o", "s", "^"}  # chunk, parallel, recurrent side by side at one T
    assert "1,024" in side.get_title()
    assert len(side.get_lines()) == 1 + 6 * 3  # softmax's chunk form, six mechanisms x 3 forms
    style.pyplot().close("all")


def test_the_bench_json_keeps_its_machine(tmp_path):
    data = plots.load_bench(RESULTS / "bench.json")
    assert data["machine"]["threads"] == 1 and data["roof_ops_per_s"] > 1e9
    assert json.loads(json.dumps(data))  # still plain JSON data


def test_the_gpu_section_shows_the_committed_results_or_what_runs_them(tmp_path):
    source = "benchmarks/results/gpu.json"
    absent = small_report(gpu_source=source)
    assert '<h2 id="gpu">GPU</h2>' in render_html(absent) and 'href="#gpu"' in render_html(absent)
    assert "Not measured yet: no machine with a GPU has run it" in render_html(absent)
    assert "## GPU" in render_markdown(absent)
    result = {
        "setup": {"device": "NVIDIA H100", "torch": "2.13.0", "dtype": "bfloat16", "B": 1,
                  "H": 8, "K": 64},
        "rows": [{"mechanism": "kda", "T": 4096, "torch_fwd_ms": 30.0, "fla_fwd_ms": 1.5,
                  "dispatch_fwd_ms": 1.75}],
    }  # fmt: skip
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(result))
    from linattn.results_files import load_gpu

    shown = small_report(gpu=load_gpu(path), gpu_source=str(path))
    page, markdown = render_html(shown), render_markdown(shown)
    assert "On NVIDIA H100, torch 2.13.0, bfloat16" in page and "Not measured" not in page
    assert "| kda | 4096 | 30 | 1.5 | 1.75 |" in markdown
    assert re.search(r"<td[^>]*>kda</td>", page)
    path.write_text(json.dumps({"rows": [{"T": 1}]}))
    with pytest.raises(ValueError, match=r"rows\[0\] needs a 'mechanism'"):
        load_gpu(path)


def test_the_report_reads_the_committed_gpu_results_when_there_are_some(tmp_path, monkeypatch):
    committed = tmp_path / "gpu.json"
    monkeypatch.setattr(report, "GPU_FILES", (tmp_path / "absent.json", committed))
    args = cli.build_parser().parse_args(["report"])
    assert report.read_inputs(args)["gpu"] is None
    committed.write_text(json.dumps({"rows": [{"mechanism": "kda", "T": 64}]}))
    fields = report.read_inputs(args)
    assert fields["gpu"]["rows"][0]["mechanism"] == "kda"
    assert fields["gpu_source"] == str(committed)
