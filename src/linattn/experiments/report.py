"""Rebuild every claim of the spec into one page: checks, tables, figures and measured results.

Runs what ``linattn verify``, ``linattn table1`` and ``linattn costs`` print (the same functions,
the same text), draws the spec's nine figures and the Table 1 plot, writes the appendix's numbers
files, gathers the benchmark (``runs/bench/bench.json``, from ``linattn bench``) and the recall
sweep (``runs/mqar.jsonl``, from ``linattn mqar``), or the results committed under
``benchmarks/results`` (the current folder's copy, else the clone's that linattn was imported
from, else the copy installed with the package) when they are newer or the runs are missing, says
which file it used and the setup and machine it records, and writes ``DIR/index.html`` (one
self-contained page, the figures beside it, nothing fetched from the network) and
``DIR/report.md``.

An existing, non-empty DIR is not overwritten without ``--force``. The last line printed is the path
of ``DIR/index.html``; the exit status is 1 if a check fails (the report is written all the same).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from linattn.experiments import costs as costs_command
from linattn.experiments import table1 as table1_command
from linattn.experiments import verify as verify_command
from linattn.experiments._args import input_file, positive_int
from linattn.experiments.report_contents import Report
from linattn.experiments.report_page import render_html, render_markdown
from linattn.figures.legibility import legible_width, png_css_width

TABLE1_NS = (8, 16, 32, 64, 128)
TABLE1_R = 32
# The clone this package was imported from (src/linattn/experiments/report.py, four levels up):
# an editable install or PYTHONPATH=src. An installed wheel has no clone: CLONE is None, and the
# package's own copy of the committed results (PACKAGED, package data) is used.
_ROOT = Path(__file__).resolve().parents[3]
CLONE = _ROOT if (_ROOT / "benchmarks" / "results").is_dir() else None
PACKAGED = Path(__file__).resolve().parent / "results"


def _committed(name: str) -> tuple[Path, ...]:
    """A committed results file: in the current folder (a clone's root), in the clone, and the
    copy installed with the package, in that order."""
    clone = () if CLONE is None else (CLONE / "benchmarks" / "results" / name,)
    return (Path("benchmarks/results") / name, *clone, PACKAGED / name)


# (your latest run, the committed results where they are found): the page shows the newer.
BENCH_FILES = (Path("runs/bench/bench.json"), *_committed("bench.json"))
MQAR_FILES = (Path("runs/mqar.jsonl"), *_committed("mqar-cpu.jsonl"))
STATE_TRACKING_FILES = (
    Path("runs/state-tracking.jsonl"),
    *_committed("state-tracking-default.jsonl"),
)


def prepare_out_dir(out: Path, force: bool) -> Path:
    """Create ``out`` (or accept it empty, or with ``force``) and check it is writable.

    Raises ``ValueError`` with a clear message: ``out`` is a file, exists with files in it and
    ``force`` is off, cannot be created, or cannot be written.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"the report path {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ValueError(
            f"the report directory {out} already exists and is not empty; "
            "pass --force to overwrite it, or choose another --out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Probe with a real file: os.access does not see read-only mounts or some ACLs.
        with tempfile.NamedTemporaryFile(dir=out, prefix=".linattn-probe-"):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise ValueError(f"cannot write the report to {out}: {reason}") from None
    return out


def environment() -> dict[str, str]:
    """The machine and the library versions, without importing the heavy libraries."""
    info = {
        "machine": f"{platform.system()} {platform.release()} {platform.machine()}",
        "processor": platform.processor() or platform.machine(),
        "CPU cores": str(os.cpu_count()),
        "Python": platform.python_version(),
    }
    for package in ("linattn", "numpy", "scipy", "torch", "matplotlib", "tqdm"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = _module_version(package)
    return info


def _module_version(package: str) -> str:
    """The version of an imported-by-path package (``PYTHONPATH=src``), or "not installed"."""
    try:
        module = __import__(package)
    except ImportError:
        return "not installed"
    return str(getattr(module, "__version__", "unknown"))


def build_report(args: argparse.Namespace, out: Path) -> Report:
    """Compute, draw and gather everything, with one progress bar on stderr."""
    from linattn.figures import SPEC_FIGURES, numbers, plots

    start = time.perf_counter()
    figures_dir = out / "figures"
    steps = 1 + len(TABLE1_NS) + 1 + len(SPEC_FIGURES) + 4
    bar = tqdm(total=steps, desc="linattn report", unit="step", file=sys.stderr, disable=args.quiet)

    def begin(description: str) -> None:
        bar.set_postfix_str(description)

    with bar:
        begin("verify")
        checks = verify_command.run_checks()
        bar.update()
        rows: list[dict[str, float]] = []
        for n in TABLE1_NS:  # each n has its own generator: one n at a time is the same table
            begin(f"table 1, n = {n}")
            rows += table1_command.compute_table1(TABLE1_R, (n,), args.table1_repetitions)
            bar.update()
        begin("costs")
        costs = costs_command.compute_costs()
        report = Report(
            command=" ".join(["linattn", "report", *args.argv]),
            date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            environment=environment(),
            checks=checks,
            verify_text=verify_command.report(checks),
            table1_rows=rows,
            table1_text=table1_command.table1_markdown(rows, TABLE1_R, args.table1_repetitions),
            costs=costs,
            costs_text=costs_command.costs_markdown(costs),
        )
        bar.update()
        for figure in SPEC_FIGURES:
            begin(f"figure {figure.number}")
            figure.draw(figures_dir)
            report.figures.append(
                {"number": str(figure.number), "name": figure.name, "caption": figure.caption}
            )
            bar.update()
        begin("table 1 plot, numbers files")
        plots.table1_plot(rows, figures_dir, TABLE1_R)
        report.numbers_files = [p.name for p in numbers.write_numbers(out / "numbers")]
        bar.update()
        begin("benchmark, recall")
        gather_results(args, report, figures_dir)
        bar.update(2)
        report.widths = {p.stem: png_css_width(p) for p in figures_dir.glob("*.png")}
        # Every figure and plot keeps its legible width on a narrow screen (figures.legibility).
        report.legible = {name: legible_width(width) for name, width in report.widths.items()}
        begin("pages")
        report.seconds = time.perf_counter() - start
        write_files(report, out)
        bar.update()
    return report


def gather_results(args: argparse.Namespace, report: Report, figures_dir: Path) -> None:
    """The benchmark and recall results into ``report``, with the note saying which file (or
    where none was found), and their plots."""
    from linattn.figures import plots

    source, report.bench_note = results_file(args.bench, BENCH_FILES)
    report.bench, report.bench_source = plots.load_bench(source), str(source)
    if report.bench is None:
        report.bench_note = missing_note(args.bench, BENCH_FILES, "bench", "--bench")
    else:
        plots.bench_plot(report.bench, figures_dir)
    source, report.mqar_note = results_file(args.mqar, MQAR_FILES)
    report.mqar, report.mqar_source = plots.load_mqar(source), str(source)
    if report.mqar is None:
        report.mqar_note = missing_note(args.mqar, MQAR_FILES, "mqar", "--mqar")
    else:
        plots.mqar_plot(report.mqar, figures_dir)
    gather_state_tracking(report, figures_dir)


def gather_state_tracking(report: Report, figures_dir: Path) -> None:
    """The state-tracking results (``linattn state-tracking``): the newer of your run and the
    committed default run, summarised over seeds, and their figure."""
    from linattn.experiments.mqar.sweep import read_results
    from linattn.experiments.state_tracking import results
    from linattn.figures import style

    source, report.state_tracking_note = results_file(None, STATE_TRACKING_FILES)
    report.state_tracking_source = str(source)
    rows = read_results(source) if source.is_file() else []
    if not rows:
        report.state_tracking_note = missing_note(
            None, STATE_TRACKING_FILES, "state-tracking", "runs/state-tracking.jsonl"
        )
        return
    report.state_tracking = results.aggregate(rows)
    style.save(results.figure(report.state_tracking), figures_dir, "state-tracking")


def results_file(given: Path | None, files: tuple[Path, ...]) -> tuple[Path, str]:
    """The results file to show and a note saying which it is: ``given`` when passed; otherwise
    the newer of your latest run (``files[0]``) and the first of the committed copies
    (``files[1:]``: the current folder's, the clone's, the package's) that exists."""
    if given is not None:
        return given, "(given with the command)"
    run, *copies = files
    committed = next((path for path in copies if path.exists()), None)
    if run.exists() and (committed is None or run.stat().st_mtime >= committed.stat().st_mtime):
        where = f"the committed results are {committed}" if committed else "no committed results"
        return run, f"(your latest run; {where})"
    if committed is not None:
        why = f"newer than your run at {run}" if run.exists() else f"no run at {run}"
        whose = {copies[0]: "", PACKAGED / committed.name: ", the package's copy"}.get(
            committed, ", the clone's copy"
        )
        return committed, f"(the results committed with the code{whose}: {why})"
    return run, ""


def missing_note(given: Path | None, files: tuple[Path, ...], command: str, flag: str) -> str:
    """Where the report looked for a results file, and how to give one."""
    if given is not None:
        return f"no such file (given with {flag})"
    run, *copies = files
    return (
        f"none at {run} (run linattn {command}) or at "
        + " or ".join(str(path) for path in copies)
        + f"; pass {flag} FILE to include one"
    )


def write_files(report: Report, out: Path) -> None:
    """index.html, report.md, and the computed data as JSON under data/."""
    data = out / "data"
    data.mkdir(exist_ok=True)
    (data / "verify.json").write_text(verify_command.to_json(report.checks) + "\n")
    (data / "table1.json").write_text(json.dumps(report.table1_rows, indent=2) + "\n")
    (data / "costs.json").write_text(json.dumps(report.costs, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    (out / "index.html").write_text(render_html(report))


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn report``."""
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("report"),
        help="directory for index.html, report.md and the figures (default: report)",
    )
    parser.add_argument(
        "--force", action="store_true", help="write into --out even if it already holds files"
    )
    parser.add_argument(
        "--bench",
        type=Path,
        default=None,
        help=f"benchmark results to include (default: the newer of {BENCH_FILES[0]}, which "
        "linattn bench writes, and the committed benchmarks/results/bench.json, here or in the "
        "clone linattn was imported from)",
    )
    parser.add_argument(
        "--mqar",
        type=Path,
        default=None,
        help=f"recall results to include (default: the newer of {MQAR_FILES[0]} and the "
        "committed benchmarks/results/mqar-cpu.jsonl, here or in the clone)",
    )
    parser.add_argument(
        "--table1-repetitions",
        type=positive_int,
        default=200,
        help="repetitions per n for Table 1 (default: the spec's 200)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Build the report; print the page's path last. Exit status 1 if a check fails."""
    try:
        import matplotlib  # noqa: F401 (the figures need it: the optional `plot` extra)
    except ImportError:
        print(
            "linattn report: error: the figures need matplotlib: "
            "pip install 'linattn[plot]' (or matplotlib>=3.7)",
            file=sys.stderr,
        )
        return 2
    for flag in ("bench", "mqar"):  # a given input is a readable file, before verify runs
        if getattr(args, flag) is not None:
            input_file(f"--{flag}", getattr(args, flag))
    args.argv = _argv(args)
    out = prepare_out_dir(Path(args.out), args.force)
    report = build_report(args, out)
    failed = [check.name for check in report.checks if not check.passed]
    print(
        f"{len(report.checks) - len(failed)} of {len(report.checks)} checks passed; "
        f"report built in {report.seconds:.0f} s"
    )
    if failed:
        print("FAILED: " + "; ".join(failed), file=sys.stderr)
    print((out / "index.html").resolve())
    return 1 if failed else 0


def _argv(args: argparse.Namespace) -> list[str]:
    """The options as they would be typed, for the page's record of how it was made."""
    words = [] if Path(args.out) == Path("report") else ["--out", str(args.out)]
    if args.force:
        words.append("--force")
    if args.table1_repetitions != 200:
        words += ["--table1-repetitions", str(args.table1_repetitions)]
    for flag, value in (("--bench", args.bench), ("--mqar", args.mqar)):
        if value is not None:
            words += [flag, str(value)]
    if args.quiet:
        words.append("--quiet")
    return words
