"""Read and check the measured results files (``linattn bench``'s JSON, ``linattn mqar``'s JSON
lines, and the JSON lines of the sweeps: ``read_results``), in formats documented in
``linattn.figures.plots``.

A module of its own, with no import of torch, scipy or matplotlib: ``linattn report`` reads its
input files before any work, and a bad one should fail in a fraction of a second, not after the
seconds those imports take. Library code (the plots, the documentation site) and the experiments
read the files through it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path


def load_bench(path: Path | str) -> dict | None:
    """The benchmark file (format in the module docstring), or None when it does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if isinstance(data, dict) and "results" not in data and isinstance(data.get("rows"), list):
        data = bench_results(data)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or not results:
        raise ValueError(f"{path}: expected an object with a non-empty list 'results'")
    for index, row in enumerate(results):
        if (
            not isinstance(row, dict)
            or not is_number(row.get("T"))
            or not is_number(row.get("seconds"))
        ):
            raise ValueError(f"{path}: results[{index}] needs numbers 'T' and 'seconds'")
        if "name" not in row and "method" not in row:
            raise ValueError(f"{path}: results[{index}] needs a 'name' (or a 'method')")
    return data


def bench_results(run: dict) -> dict:
    """What ``linattn bench`` writes (``{"config", "rows", ...}``) as the plot's data (above)."""
    data = {"meta": run.get("config", {}), "results": _bench_rows(run["rows"])}
    for key in ("machine", "roof_ops_per_s"):  # where it was measured: the report says so
        if key in run:
            data[key] = run[key]
    return data


def _bench_rows(rows: list) -> list:
    """``linattn bench``'s rows as the results above: one forward pass per (mechanism, mode, T)."""
    return [
        {"name": f"{row['mechanism']}, {row['mode']}", "T": row["T"], "seconds": row["forward_s"]}
        if isinstance(row, dict) and {"mechanism", "mode", "T", "forward_s"} <= row.keys()
        else row
        for row in rows
    ]


def load_gpu(path: Path | str) -> dict | None:
    """``benchmarks/gpu.py``'s results (``{"setup", "rows", "checks"}``, each row a mechanism, a
    T and its milliseconds per path), or None when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected an object with a list 'rows'")
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or "mechanism" not in row or not is_number(row.get("T")):
            raise ValueError(f"{path}: rows[{index}] needs a 'mechanism' and a number 'T'")
    return data


def load_mqar(path: Path | str) -> list[dict] | None:
    """The recall results, one JSON object a line (format in the module docstring), or None."""
    path = Path(path)
    if not path.exists():
        return None
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error})") from None
        if not isinstance(row, dict) or not (row.get("mechanism") or row.get("mixer")):
            raise ValueError(f"{path}, line {number}: needs a 'mechanism'")
        if not is_number(row.get("state_numbers")) or not is_number(row.get("accuracy")):
            raise ValueError(f"{path}, line {number}: needs numbers 'state_numbers', 'accuracy'")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no results")
    return rows


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_results(path: Path, check: Callable[[dict], None] | None = None) -> list[dict]:
    """All rows of a results file (missing file: none); ``ValueError`` naming the file and line.

    A partial last line (a run killed while appending) is refused, not skipped: the file is the
    record of finished runs, and the user decides whether to delete that line. So is a line
    that is not UTF-8 text (another file given by mistake), read line by line as bytes so that
    the error can name the line, and a row that ``check`` refuses (its ``ValueError`` message).
    """
    if not path.exists():
        return []
    rows = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"results file {path}, line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{where}: not UTF-8 text (a binary file?)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{where}: not valid JSON ({error.msg}); delete or repair that line"
                ) from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: not a JSON object")
            if check is not None:
                try:
                    check(row)
                except ValueError as error:
                    raise ValueError(f"{where}: {error}; delete or repair that line") from None
            rows.append(row)
    return rows
