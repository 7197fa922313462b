"""Several runs of `linattn bench` as one table: the median of every measured number, row by row.

On a shared machine one run's numbers move a lot from minute to minute, and not all rows of a
run alike; the median over runs of one configuration is steadier. Each run's efficiencies are taken
against that run's own roof (``bench.compute_bench``), and the merged efficiency of a row is the
median of those ratios, not a ratio of medians.
"""

from __future__ import annotations

import statistics

# Fields that say what a row is, not what was measured: equal in every run.
ROW_IDENTITY = ("mechanism", "mode", "T", "B", "H", "K", "V", "chunk_size")
ROW_COUNTS = ("forward_ops", "backward_ops")
GENERATION_IDENTITY = ("t", "H", "K")
GENERATION_COUNTS = (
    "softmax_step_ops",
    "linear_step_ops",
    "delta_step_ops",
    "cache_bytes",
    "state_bytes",
)
# Options that do not change what is measured.
UNTIMED_OPTIONS = ("out", "json", "merge")


def merge_runs(results: list[dict]) -> dict:
    """One result (``bench.compute_bench``'s layout) whose numbers are the runs' medians.

    Raises ValueError when the runs differ in configuration or in their rows.
    """
    if len(results) < 2:
        raise ValueError(f"--merge: expected at least 2 runs, got {len(results)}")
    first = results[0]
    options = _timed_options(first)
    for i, result in enumerate(results[1:], start=2):
        if _timed_options(result) != options:
            raise ValueError(f"--merge: run {i} was made with other options than run 1")
    rows = _merge_tables([r["rows"] for r in results], ROW_IDENTITY, ROW_COUNTS)
    generation = _merge_tables(
        [r["generation"] for r in results], GENERATION_IDENTITY, GENERATION_COUNTS
    )
    roofs = [r["roof_ops_per_s"] for r in results]
    return {
        "config": {**first["config"], "merged_runs": len(results)},
        "machine": first["machine"],
        "roof_ops_per_s": statistics.median(roofs),
        "run_roofs_ops_per_s": roofs,
        "roof_samples_ops_per_s": [x for r in results for x in r["roof_samples_ops_per_s"]],
        "rows": rows,
        "generation": generation,
    }


def _timed_options(result: dict) -> dict:
    return {k: v for k, v in result["config"].items() if k not in UNTIMED_OPTIONS}


def _merge_tables(tables: list[list[dict]], identity, counts) -> list[dict]:
    """Row i of the merge: row i of every table (same identity and counts), numbers medianed."""
    if len({len(t) for t in tables}) != 1:
        raise ValueError("--merge: the runs have different numbers of rows")
    merged = []
    for same in zip(*tables, strict=True):
        for field in identity + counts:
            if len({str(r.get(field)) for r in same}) != 1:
                raise ValueError(f"--merge: the runs' rows differ in {field}")
        row = dict(same[0])
        for field, value in same[0].items():
            measured = isinstance(value, int | float) and not isinstance(value, bool)
            if not measured or field in identity or field in counts:
                continue
            values = [r[field] for r in same if field in r]
            row[field] = statistics.median(values)
        merged.append(row)
    return merged
