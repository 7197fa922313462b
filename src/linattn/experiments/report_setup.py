"""What the report says about how its measured results were made: the benchmark's shapes,
threads and machine, the recall sweep's models and training, and the GPU benchmark's tables
(``gpu_table``, shown by the report and the documentation site), read from the results files.

The files record their own setup (``linattn bench``'s ``config`` and ``machine``; each recall row
its model and training); the machine they were measured on is not the one the report is built on
(the page's Machine table), and the page says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def bench_setup(bench: dict) -> str:
    """One sentence: the shapes (B, H, K, V, C), the threads, the timing and the machine of a
    benchmark file (``plots.load_bench``'s dict: ``meta``, and ``machine`` and ``roof`` when
    ``linattn bench`` wrote it)."""
    meta, machine = bench.get("meta") or {}, bench.get("machine") or {}
    shapes = [
        f"{label} = {meta[key]:,}"
        for key, label in (("B", "B"), ("H", "H"), ("K", "K"), ("V", "V"), ("chunk_size", "C"))
        if isinstance(meta.get(key), int)
    ]
    threads = machine.get("threads", meta.get("threads"))
    timing = []
    if threads is not None:
        timing.append(f"{threads} thread{'' if threads == 1 else 's'}")
    if meta.get("repeats"):
        clock = " (CPU time)" if meta.get("clock") == "cpu" else ""
        timing.append(f"the median of {meta['repeats']} repeats{clock}")
    where = [f"{label}{machine[key]}" for key, label in (("platform", ""), ("torch", "torch "))
             if machine.get(key)]  # fmt: skip
    if bench.get("roof_ops_per_s"):
        where.append(f"matrix-product rate {bench['roof_ops_per_s'] / 1e9:,.0f} GFLOP/s")
    text = "Setup: float32 inputs [B, T, H, K]" + (", " + ", ".join(shapes) if shapes else "")
    text += "; " + ", ".join(timing) if timing else ""
    text += ". Measured on " + ", ".join(where) if where else ". The file does not name its machine"
    return text + "; not necessarily the machine this report was built on (Machine, below)."


def mqar_setup(rows: Sequence[dict]) -> str:
    """One sentence: the models and the training of a recall sweep, from its rows."""
    parts = [
        _values("preset", rows, "preset"),
        _values("d_model", rows, "d_model"),
        _values("heads", rows, "n_heads"),
        _values("sequence length", rows, "seq_len"),
        _values("key-value pairs", rows, "n_kv"),
        _values("vocabulary", rows, "vocab_size"),
        _values("batch", rows, "batch_size"),
        _values("steps taken", rows, "steps"),
        _values("step budget", rows, "max_steps"),
        _fillers(rows),
        _lr_sweep(rows),
        _values("seeds", rows, "seed"),
        _values("threads", rows, "threads"),
        _values("torch", rows, "torch"),
    ]
    text = "Setup: " + ", ".join(part for part in parts if part)
    return text + (
        "; accuracy on held-out sequences after training. The file does not name the machine; "
        "this report's machine is under Machine, below."
    )


def _values(label: str, rows: Iterable[dict], key: str) -> str:
    """ "label v" for one value, "label v1 to v2" (numbers) or "label a, b" otherwise; "" if
    absent."""
    values = sorted({row[key] for row in rows if key in row}, key=str)
    if not values:
        return ""
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values) and len(values) > 1:
        low, high = min(values), max(values)
        return f"{label} {low:,} to {high:,}"
    return f"{label} " + ", ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in values)


def _fillers(rows: Sequence[dict]) -> str:
    """ "blank fillers", "random fillers" or "blank and random fillers"; "" if not recorded."""
    kinds = sorted({bool(r["random_non_queries"]) for r in rows if "random_non_queries" in r})
    names = ["random" if kind else "blank" for kind in kinds]
    return f"{' and '.join(names)} fillers" if names else ""


def _lr_sweep(rows: Sequence[dict]) -> str:
    """ "lr sweep 0.002, 0.0045, 0.01 (the best per seed)"; "" without sweeps in the rows."""
    lrs = sorted({x["lr"] for r in rows for x in r.get("lr_sweep", [])})
    return f"lr sweep {', '.join(f'{lr:g}' for lr in lrs)} (the best per seed)" if lrs else ""


def state_tracking_setup(rows: Sequence[dict]) -> str:
    """One sentence: how the state-tracking rows shown were trained and tested, from the rows
    themselves (so that a run with other lengths or steps is not described as the default)."""
    lengths = sorted({int(n) for row in rows for n in row.get("accuracy", {})})
    parts = [
        _values("preset", rows, "preset"),
        _values("tasks", rows, "task"),
        _values("trained at", rows, "train_len") + (" tokens" if _has(rows, "train_len") else ""),
        _values("curriculum step every", rows, "curriculum_every"),
        _values("steps", rows, "steps"),
        _values("d_model", rows, "d_model"),
        _values("heads", rows, "n_heads"),
        _values("lr", rows, "lr"),
        _values("batch", rows, "batch_size"),
        _values("seeds", rows, "seed"),
        "tested at " + ", ".join(f"{n:,}" for n in lengths) + " tokens" if lengths else "",
    ]
    return (
        "Word problems (parity, sums modulo m, permutation groups), a label at every token "
        "(linattn state-tracking). Setup: "
        + ", ".join(part for part in parts if part)
        + "; accuracy per token, the mean over seeds (lowest-highest)."
    )


def _has(rows: Iterable[dict], key: str) -> bool:
    return any(key in row for row in rows)


def gpu_table(result: dict | None) -> str:
    """``benchmarks/gpu.py``'s results as tables (ms per call: the PyTorch loop, fla called
    directly, linattn's dispatch), or, where none are committed, what runs them."""
    if not result or not result.get("rows"):
        return (
            "Not measured yet: no machine with a GPU has run it. On one, "
            "`PYTHONPATH=src python benchmarks/gpu.py` writes `benchmarks/results/gpu.json`, "
            "which this page shows."
        )
    setup = result.get("setup", {})
    lines = [
        f"On {setup.get('device', '?')}, torch {setup.get('torch', '?')}, "
        f"{setup.get('dtype', '?')}, B {setup.get('B', '?')}, H {setup.get('H', '?')}, "
        f"K = V = {setup.get('K', '?')}.",
        "",
    ]
    for kind, title in (("fwd", "forward"), ("fwdbwd", "forward + backward")):
        lines += [f"**{title}, ms**", "", "| mechanism | T | PyTorch loop | fla | dispatch |"]
        lines += ["|---|---:|---:|---:|---:|"]
        for row in result["rows"]:
            cells = [_gpu_ms(row.get(f"{path}_{kind}_ms")) for path in ("torch", "fla", "dispatch")]
            lines.append(f"| {row['mechanism']} | {row['T']} | " + " | ".join(cells) + " |")
        lines.append("")
    checks = result.get("checks", {})
    if checks:
        failed = [name for name, check in checks.items() if not check.get("ok")]
        lines.append(
            f"Agreement with the float64 reference on the device: {len(checks) - len(failed)} of "
            f"{len(checks)} checks within tolerance" + (f" (failed: {failed})." if failed else ".")
        )
    return "\n".join(lines)


def _gpu_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
