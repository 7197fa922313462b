"""Rebuild every claim of the spec into one page: checks, tables, figures and measured results.

Runs what ``linattn verify``, ``linattn table1`` and ``linattn costs`` print (the same functions,
the same text), draws the spec's nine figures, Figure 10 and the Table 1 plot, writes the
appendix's numbers files, gathers the benchmark (``runs/bench/bench.json``, from ``linattn
bench``) and the recall sweep (``runs/mqar.jsonl``, from ``linattn mqar``), or the results
committed under ``benchmarks/results`` (the current folder's copy, else the clone's that linattn
was imported from, else the copy installed with the package) when they are newer or the runs are
missing, says which file it used and the setup and machine it records, and writes
``DIR/index.html`` (one self-contained page, the figures beside it, nothing fetched from the
network) and ``DIR/report.md``.

Every input file is read and validated before any work, and the report is built in a hidden
folder beside DIR that takes DIR's place only when it is complete: a failure leaves no partial
folder. Running it again over its own earlier output replaces that output; a non-empty DIR that it
did not write needs ``--force``. Results of a ``smoke`` preset (a two-step check of the code, not a
measurement) in your latest run never replace the committed results unless the file is given
(``--mqar``, ``--state-tracking``). The last line printed is the path of ``DIR/index.html``; the
exit status is 1 if a check fails (the report is written all the same).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from linattn.experiments._args import input_file, positive_int
from linattn.experiments.report_setup import state_tracking_setup

if TYPE_CHECKING:
    from linattn.experiments.report_contents import Report

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
GPU_FILES = _committed("gpu.json")
MQAR_FILES = (Path("runs/mqar.jsonl"), *_committed("mqar-cpu.jsonl"))
STATE_TRACKING_FILES = (
    Path("runs/state-tracking.jsonl"),
    *_committed("state-tracking-default.jsonl"),
)


# The file that marks a folder as a report this command wrote: a later run may replace it whole.
MARKER = ".linattn-report"
SMOKE = "smoke"  # the presets whose rows are a check of the code, not a measurement


def prepare_out_dir(out: Path, force: bool) -> Path:
    """Check, before any work, that ``out`` can take the report; create nothing. Returns ``out``.

    ``out`` may be missing, empty, an earlier report (it holds ``MARKER``), or, with ``force``,
    any folder. Raises ``ValueError`` with a clear message: ``out`` is a file, holds files that
    this command did not write and ``force`` is off, or its folder cannot be written.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"the report path {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file() and not force:
        raise ValueError(
            f"the report directory {out} holds files that linattn report did not write; "
            "pass --force to write into it, or choose another --out"
        )
    parent = out.resolve().parent
    while not parent.exists():
        parent = parent.parent
    try:
        if not parent.is_dir():
            raise NotADirectoryError(20, "Not a directory")
        # Probe with a real file: os.access does not see read-only mounts or some ACLs.
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".linattn-probe-"):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise ValueError(f"cannot write the report to {out}: {reason}") from None
    return out


def staging_dir(out: Path) -> tuple[Path, Path | None]:
    """A new hidden folder beside ``out`` to build the report in, and the highest folder above
    it that had to be created for it (None if none), so that a failure can remove both."""
    parent, created = out.resolve().parent, None
    for folder in [parent, *parent.parents]:
        if folder.exists():
            break
        created = folder
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=parent)), created


def publish(staging: Path, out: Path) -> None:
    """Put the finished report at ``out``: it replaces an empty folder or an earlier report
    whole; into a folder it did not write (``--force``) its files are moved one by one."""
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        for item in staging.iterdir():
            target = out / item.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(item, target)
        staging.rmdir()
        return
    old = None
    if out.exists():
        # Moved aside first, so that out is never missing the report for longer than a rename.
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.resolve().parent))
        os.replace(out, old / out.name)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old)


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


def build_report(args: argparse.Namespace, out: Path, inputs: dict | None = None) -> Report:
    """Compute, draw and gather everything into ``out``, with one progress bar on stderr.

    ``inputs``: the measured results as ``read_inputs`` returns them (read from ``args`` when
    None)."""
    inputs = read_inputs(args) if inputs is None else inputs
    # Imported here, not above: they bring torch and scipy, seconds that a bad input file (read
    # first, by read_inputs) should not wait for.
    from linattn.experiments import costs as costs_command
    from linattn.experiments import table1 as table1_command
    from linattn.experiments import verify as verify_command
    from linattn.experiments.report_contents import Report
    from linattn.experiments.state_tracking import results
    from linattn.figures import FIGURES, numbers, plots
    from linattn.figures.legibility import legible_width, png_css_width

    start = time.perf_counter()
    figures_dir = out / "figures"
    steps = 1 + len(TABLE1_NS) + 1 + len(FIGURES) + 4
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
        for figure in FIGURES:
            begin(f"figure {figure.number}")
            figure.draw(figures_dir)
            report.figures.append(
                {"number": str(figure.number), "name": figure.name, "caption": figure.caption}
            )
            bar.update()
        begin("table 1 plot, numbers files")
        for narrow in (False, True):  # and drawn again for a phone's column
            plots.table1_plot(rows, figures_dir, TABLE1_R, narrow=narrow)
        report.numbers_files = [p.name for p in numbers.write_numbers(out / "numbers")]
        bar.update()
        begin("benchmark, recall")
        for name, value in inputs.items():
            setattr(report, name, value)
        if report.state_tracking is not None:  # the rows, summarised over seeds
            report.state_tracking = results.aggregate(report.state_tracking)
        draw_results(report, figures_dir)
        bar.update(2)
        report.widths = {p.stem: png_css_width(p) for p in figures_dir.glob("*.png")}
        # Every figure and plot keeps its legible width on a narrow screen (figures.legibility).
        report.legible = {name: legible_width(width) for name, width in report.widths.items()}
        begin("pages")
        report.seconds = time.perf_counter() - start
        write_files(report, out)
        bar.update()
    return report


def read_inputs(args: argparse.Namespace) -> dict:
    """The benchmark, recall and state-tracking results, read and validated now (before any
    work): the ``Report`` fields they fill, with the notes that say which file and why."""
    from linattn.results_files import load_bench, load_gpu, load_mqar, read_results

    fields = {}
    bench, fields["bench_source"], fields["bench_note"] = read_input(
        args.bench, BENCH_FILES, load_bench, "bench", "--bench"
    )
    fields["bench"] = bench
    mqar, fields["mqar_source"], fields["mqar_note"] = read_input(
        args.mqar, MQAR_FILES, load_mqar, "mqar", "--mqar"
    )
    fields["mqar"] = mqar
    rows, fields["state_tracking_source"], fields["state_tracking_note"] = read_input(
        getattr(args, "state_tracking", None),
        STATE_TRACKING_FILES,
        lambda path: read_results(Path(path)) or None,
        "state-tracking",
        "--state-tracking",
    )
    fields["state_tracking"] = rows  # summarised over seeds by build_report
    fields["state_tracking_setup"] = "" if rows is None else state_tracking_setup(rows)
    # benchmarks/gpu.py runs only on a machine with a GPU: the committed results, if any
    gpu = next((path for path in GPU_FILES if path.is_file()), GPU_FILES[0])
    fields["gpu"], fields["gpu_source"] = load_gpu(gpu), str(gpu)
    return fields


def read_input(
    given: Path | None,
    files: tuple[Path, ...],
    load: Callable[[Path], object],
    command: str,
    flag: str,
) -> tuple[object, str, str]:
    """(the results, or None; the file they come from; the note saying which file and why).

    ``given`` is read as it is. Otherwise ``results_file`` picks the newer of your latest run and
    the committed copy; rows of a smoke preset in your run are left out, and a run that holds
    nothing else gives way to the committed results.
    """
    source, note = results_file(given, files)
    if given is not None:
        try:
            return load(input_file(flag, given)), str(given), note
        except ValueError as error:
            message = str(error)
            raise ValueError(message if message.startswith(flag) else f"{flag} {message}") from None
    if not source.exists():
        return None, str(source), missing_note(None, files, command, flag)
    data = load(input_file("the results file", source))
    if source != files[0] or not isinstance(data, list):
        return data, str(source), note
    measured = [row for row in data if row.get("preset") != SMOKE]
    if len(measured) == len(data):
        return data, str(source), note
    why = (
        f"your latest run at {source} holds {len(data) - len(measured)} rows of the {SMOKE} "
        f"preset, a check of the code rather than a measurement (pass {flag} {source} to show "
        "them)"
    )
    if measured:
        return measured, str(source), f"(your latest run, without its {SMOKE} rows: {why})"
    committed = next((path for path in files[1:] if path.exists()), None)
    if committed is None:
        return None, str(source), f"nothing but {SMOKE}-preset rows: {why}"
    return (
        load(input_file("the results file", committed)),
        str(committed),
        (f"(the results committed with the code: {why})"),
    )


def draw_results(report: Report, figures_dir: Path) -> None:
    """The plots of the benchmark, recall and state-tracking results the report holds."""
    from linattn.experiments.state_tracking import results
    from linattn.figures import plots, style

    for narrow, suffix in ((False, ""), (True, "-narrow")):  # and drawn again for a phone
        if report.bench is not None:
            plots.bench_plot(report.bench, figures_dir, narrow=narrow)
        if report.mqar is not None:
            plots.mqar_plot(report.mqar, figures_dir, narrow=narrow)
        if report.state_tracking is not None:
            figure = results.figure(report.state_tracking, narrow=narrow)
            style.save(figure, figures_dir, "state-tracking" + suffix)


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
    from linattn.experiments.report_page import render_html, render_markdown
    from linattn.experiments.verify import to_json

    (data / "verify.json").write_text(to_json(report.checks) + "\n")
    (data / "table1.json").write_text(json.dumps(report.table1_rows, indent=2) + "\n")
    (data / "costs.json").write_text(json.dumps(report.costs, indent=2) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    (out / "index.html").write_text(render_html(report))
    (out / MARKER).write_text("written by linattn report; a later run replaces this folder\n")


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn report``."""
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("report"),
        help="directory for index.html, report.md and the figures (default: report)",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into --out even if it holds files that linattn report did not write (an "
        "earlier report is replaced without it)",
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
        "--state-tracking",
        type=Path,
        default=None,
        help=f"state-tracking results to include (default: the newer of "
        f"{STATE_TRACKING_FILES[0]} and the committed "
        "benchmarks/results/state-tracking-default.jsonl; smoke-preset rows of your run are "
        "shown only when the file is given here)",
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
    inputs = read_inputs(args)  # every input file read and validated before any work
    out = prepare_out_dir(Path(args.out), args.force)
    args.argv = _argv(args)
    staging, created = staging_dir(out)
    try:
        report = build_report(args, staging, inputs)
        publish(staging, out)
    except BaseException:
        shutil.rmtree(created or staging, ignore_errors=True)
        raise
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
    given = (("--bench", args.bench), ("--mqar", args.mqar))
    given += (("--state-tracking", getattr(args, "state_tracking", None)),)
    for flag, value in given:
        if value is not None:
            words += [flag, str(value)]
    if args.quiet:
        words.append("--quiet")
    return words
