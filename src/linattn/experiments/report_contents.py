"""What ``linattn report`` shows: the ``Report`` that ``report.build_report`` gathers and
``report_page`` renders (a module of its own, so that neither of those two imports the other).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linattn.experiments.verify import Check


@dataclass
class Report:
    """Everything the page shows, gathered by ``build_report``."""

    command: str
    date: str
    environment: dict[str, str]
    checks: list[Check]
    verify_text: str
    table1_rows: list[dict[str, float]]
    table1_text: str
    costs: dict[str, object]
    costs_text: str
    figures: list[dict[str, str]] = field(default_factory=list)  # number, name, caption
    numbers_files: list[str] = field(default_factory=list)
    bench: dict | None = None
    bench_source: str = ""
    mqar: list[dict] | None = None
    mqar_source: str = ""
    bench_note: str = ""  # which file, and why that one
    mqar_note: str = ""
    # ``linattn state-tracking``: the summaries over seeds (state_tracking.results.aggregate)
    state_tracking: list[dict] | None = None
    state_tracking_source: str = ""
    state_tracking_note: str = ""
    state_tracking_setup: str = ""  # how the rows shown were trained and tested, from the rows
    gpu: dict | None = None  # benchmarks/gpu.py's committed results, measured on a GPU
    gpu_source: str = ""
    seconds: float = 0.0
    widths: dict[str, int] = field(default_factory=dict)  # figure name: natural CSS width
    legible: dict[str, int] = field(default_factory=dict)  # figure name: narrowest legible width
