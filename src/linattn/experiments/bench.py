"""Speed and memory of every mechanism and form on the CPU, as ratios measured in one run.

For each mechanism (softmax, linear attention with and without decays, the delta rule, Gated
DeltaNet, KDA), form and length T, on float32 inputs [B, T, H, D]: the median time of the forward
pass and of forward plus backward, the section-9 operation count, the achieved rate, its
*efficiency* (the rate over that of a large float32 matrix product timed in the same process), and
the peak extra memory (measured in a child process). Then the generation step against a softmax
decoding step over a KV cache, and, when fla-core is importable, our chunk forms against its
pure-PyTorch chunked references. Writes bench.json, bench.md and bench.png (log-log time vs T).

With several thread counts (``--threads 1,2,4``) it times the scaling instead: every chunk-form
row at each thread count, the counts interleaved call by call and the rows in rounds over the
whole table (``compute_scaling``), the forward pass and forward plus backward; each thread
count's efficiency against the matrix-product rate measured at that same count, and the speed-up
over the fewest threads (the median of the paired calls' ratios). Writes scaling.json,
scaling.md and scaling.png (speed-up and efficiency against threads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

from linattn.cpu import DESCRIPTION, tune_malloc
from linattn.experiments import _bench_cases as cases
from linattn.experiments import _generation_step, _timing
from linattn.experiments._args import (
    check_memory,
    input_file,
    int_list,
    nonnegative_int,
    output_dir,
    positive_int,
)
from linattn.experiments._bench_merge import merge_runs
from linattn.experiments._timing import (
    matmul_rate,
    measure_memory_in_child,
    median,
    median_time,
    medians_in_turns,
    memory_supported,
)
from linattn.ops import native, tuning

MODES = ("chunk", "parallel", "recurrent")
SLOW_CALL_S = 1.0  # a call slower than this is repeated at most 3 times


def _time_call(mech, inputs, mode, C, backward, repeats, d_o=None) -> float:
    """Median seconds of the forward (no autograd graph) or of forward + backward."""
    if backward:
        for x in inputs.values():
            x.requires_grad_(True)

        def fn():
            for x in inputs.values():
                x.grad = None
            cases.call(mech, inputs, mode, C).backward(d_o)

    else:

        def fn():
            with torch.no_grad():
                cases.call(mech, inputs, mode, C)

    first, _ = median_time(fn, 1, warmup=0)  # the warm-up run, timed to choose the repeats
    n = repeats if first < SLOW_CALL_S else min(repeats, 3)
    seconds, _ = median_time(fn, n, warmup=0)
    for x in inputs.values():
        x.requires_grad_(False)
        x.grad = None
    return seconds


def _time_fla(mech, inputs, C, repeats) -> dict | None:
    """Our chunk form and the fla-core reference timed in turns (medians), or None.

    The two calls alternate, so that both medians come from the same minutes of a shared machine
    and their ratio is the speed-up; also the largest |o_ours - o_fla|.
    """
    ref = cases.fla_reference(mech)
    if ref is None:
        return None
    prepared = cases.prepare_fla(inputs)
    with torch.no_grad():
        theirs = ref(prepared, C)
        ours = cases.call(mech, inputs, "chunk", C)
        ours_s, fla_s = medians_in_turns(
            [lambda: cases.call(mech, inputs, "chunk", C), lambda: ref(prepared, C)], repeats
        )
    return {
        "fla_forward_s": fla_s,
        "fla_ours_forward_s": ours_s,
        "fla_speedup": fla_s / ours_s,
        "fla_max_abs_diff": float((theirs.float() - ours).abs().max()),
    }


def _max_T(args, mech, mode) -> int:
    """The longest T timed for this mechanism and form (quadratic forms are capped)."""
    if cases.quadratic(mech):
        return args.softmax_max_T
    return {"chunk": max(args.T), "parallel": args.parallel_max_T}.get(mode, args.recurrent_max_T)


def _row(args, mech, mode, T) -> dict:
    """Time one (mechanism, form, T); the efficiency and memory columns are filled in later."""
    B, H, K, V, C = args.B, args.H, args.K, args.V, args.chunk_size
    inputs = cases.make_inputs(mech, B, T, H, K, V, seed=args.seed)
    d_o = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(args.seed + 1))
    ops = cases.forward_ops(mech, B, T, H, K, V, C if mode == "chunk" else T)
    fwd = _time_call(mech, inputs, mode, C, False, args.repeats)
    row = {
        "mechanism": mech.name,
        "mode": mode,
        "T": T,
        "B": B,
        "H": H,
        "K": K,
        "V": V,
        "chunk_size": C,
        "forward_ops": ops,
        "forward_s": fwd,
        "forward_rate": ops / fwd,
    }
    if not args.no_backward:
        both = _time_call(mech, inputs, mode, C, True, args.repeats, d_o)
        both_ops = cases.BACKWARD_FACTOR * ops
        row.update(
            backward_ops=both_ops,
            forward_backward_s=both,
            forward_backward_rate=both_ops / both,
        )
    if args.fla and mode == "chunk" and T <= args.fla_max_T:
        fla = _time_fla(mech, inputs, C, max(args.repeats, 3))
        if fla is not None:
            row.update(fla)
    return row


def _memory(args, rows) -> None:
    """Fill peak extra memory (forward; forward + backward) for the chunk and softmax rows."""
    jobs, where = [], []
    for i, r in enumerate(rows):
        if r["mode"] != "chunk" or r["T"] < args.memory_min_T:
            continue
        for backward in (False, True) if not args.no_backward else (False,):
            jobs.append(
                {k: r[k] for k in ("mechanism", "B", "T", "H", "K", "V", "mode", "chunk_size")}
                | {"backward": backward}
            )
            where.append((i, "forward_backward_peak_bytes" if backward else "forward_peak_bytes"))
    if not jobs:
        return
    try:
        peaks = measure_memory_in_child(jobs, timeout=args.memory_timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as error:  # keep the timings regardless
        print(f"linattn bench: warning: peak memory not measured: {error}", file=sys.stderr)
        return
    for (i, key), value in zip(where, peaks, strict=True):
        rows[i][key] = value


def _progress(row: dict) -> None:
    """One line per timed row on stderr, so that a long run shows where it is."""
    both = row.get("forward_backward_s")
    print(
        f"bench: {row['mechanism']} {row['mode']} T={row['T']}: forward {row['forward_s']:.4g} s"
        + ("" if both is None else f", forward+backward {both:.4g} s"),
        file=sys.stderr,
        flush=True,
    )


def compute_bench(args: argparse.Namespace) -> dict:
    """Every row of the benchmark (see the module docstring) and the generation table."""
    torch.manual_seed(args.seed)
    roofs = []
    rows = []
    for name in args.mechanisms:
        mech = cases.by_name(name)
        # Measured again before each mechanism (the load of a shared machine drifts); the run's
        # roof is the highest of these (below).
        roofs.append(matmul_rate())
        modes = ("chunk",) if cases.quadratic(mech) else args.modes
        for mode in modes:
            for T in args.T:
                if T <= _max_T(args, mech, mode):
                    rows.append(_row(args, mech, mode, T))
                    _progress(rows[-1])
    # One roof for the whole run: the highest measurement. A lower one means the machine was busy
    # at that moment, and dividing by it would flatter the rows timed then, so every efficiency
    # is taken against the best.
    roof = max(roofs)
    for r in rows:
        r["roof_ops_per_s"] = roof
        r["forward_efficiency"] = r["forward_rate"] / roof
        if "forward_backward_rate" in r:
            r["forward_backward_efficiency"] = r["forward_backward_rate"] / roof
    if args.memory and memory_supported():
        _memory(args, rows)
    softmax = {r["T"]: r for r in rows if r["mechanism"] == "softmax"}
    for r in rows:
        if r["T"] in softmax and r["mechanism"] != "softmax":
            r["softmax_over_this_forward"] = softmax[r["T"]]["forward_s"] / r["forward_s"]
    generation = []
    if args.generation_t:
        generation = _generation_step.generation_rows(
            args.generation_t, args.H, args.generation_K, args.generation_repeats
        )
    return {
        "config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "roof_ops_per_s": roof,
        "roof_samples_ops_per_s": roofs,
        "rows": rows,
        "generation": generation,
    }


def _time_at(n: int, mech, inputs, C, backward, repeats, d_o=None) -> float:
    """``_time_call`` of the chunk form on n torch threads."""
    torch.set_num_threads(n)
    return _time_call(mech, inputs, "chunk", C, backward, repeats, d_o)


class _ScalingCase:
    """One (mechanism, T) of the scaling table: its inputs and every timed call, per pass
    ("forward", "forward_backward") and thread count."""

    def __init__(self, args, mech, T: int, counts: list[int]) -> None:
        B, H, K, V = args.B, args.H, args.K, args.V
        self.mech, self.T, self.counts, self.C = mech, T, counts, args.chunk_size
        self.inputs = cases.make_inputs(mech, B, T, H, K, V, seed=args.seed)
        self.d_o = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(args.seed + 1))
        self.ops = cases.forward_ops(mech, B, T, H, K, V, self.C)
        self.passes = [("forward", False)]
        if not args.no_backward:
            self.passes.append(("forward_backward", True))
        self.runs = {key: {n: [] for n in counts} for key, _ in self.passes}

    def time_round(self, i: int) -> None:
        """One call at every thread count, each after a warm-up call at that count (the pool of
        threads has just been resized): the counts in order in even rounds, reversed in odd."""
        for key, backward in self.passes:
            for n in self.counts if i % 2 == 0 else self.counts[::-1]:
                seconds = _time_at(n, self.mech, self.inputs, self.C, backward, 1, self.d_o)
                self.runs[key][n].append(seconds)

    def rows(self) -> list[dict]:
        """One row per thread count: each pass's calls, their median, and the median of the
        rounds' speed-ups (the fewest threads' call over this count's, in the same round)."""
        first = self.counts[0]
        rows = []
        for n in self.counts:
            row = {"mechanism": self.mech.name, "T": self.T, "threads": n}
            row["forward_ops"] = self.ops
            for key, runs in self.runs.items():
                ratios = [one / this for one, this in zip(runs[first], runs[n], strict=True)]
                row[f"{key}_runs_s"] = runs[n]
                row[f"{key}_s"] = median(runs[n])
                row[f"{key}_speedup"] = median(ratios)
            rows.append(row)
        return rows


def compute_scaling(args: argparse.Namespace) -> dict:
    """The scaling table (module docstring): rows per (mechanism, T, threads), with each thread
    count's efficiency against the highest matrix-product rate measured at that count, and the
    speed-up over the fewest threads.

    ``--repeats`` rounds over the whole table: each round times one call of every case at every
    thread count (``_ScalingCase.time_round``), so that each row's calls are spread over the whole
    run. On a shared machine the two-thread rate changes in spells of seconds to a minute (another
    tenant's work on the same host), which hit every call of a row timed in one block and none
    of the next; spread out, a row's median sees the machine as the other rows do.
    """
    counts = sorted(set(args.threads))
    before = torch.get_num_threads()
    roofs: dict[int, list[float]] = {n: [] for n in counts}
    table = [
        _ScalingCase(args, cases.by_name(name), T, counts)
        for name in args.mechanisms
        for T in args.T
        if T <= _max_T(args, cases.by_name(name), "chunk")
    ]
    try:
        for i in range(args.repeats):
            for n in counts:  # the roof measured again every round; the run's is the highest
                torch.set_num_threads(n)
                roofs[n].append(matmul_rate())
            for case in table:
                case.time_round(i)
            print(f"bench: scaling round {i + 1} of {args.repeats}", file=sys.stderr, flush=True)
    finally:
        torch.set_num_threads(before)
    rows = [row for case in table for row in case.rows()]
    roof = {n: max(samples) for n, samples in roofs.items()}
    for r in rows:
        r["roof_ops_per_s"] = roof[r["threads"]]
        for key, ops in (("forward", 1), ("forward_backward", cases.BACKWARD_FACTOR)):
            if f"{key}_s" in r:
                r[f"{key}_efficiency"] = ops * r["forward_ops"] / r[f"{key}_s"] / roof[r["threads"]]
    return {
        "config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "cores": os.cpu_count(),
            "chunk_loop": chunk_loop(),
        },
        "threads": counts,
        "roof_ops_per_s": {str(n): roof[n] for n in counts},
        "rows": rows,
    }


def _cell(r: dict, key: str, fmt: str) -> str:
    return "" if key not in r else format(r[key], fmt)


def scaling_markdown(result: dict) -> str:
    """The scaling table as Markdown."""
    cfg, counts = result["config"], result["threads"]
    roofs = ", ".join(f"{n}: {result['roof_ops_per_s'][str(n)] / 1e9:,.0f}" for n in counts)
    lines = [
        f"**linattn bench --threads {','.join(map(str, counts))}** (chunk form, float32, "
        f"B = {cfg['B']}, H = {cfg['H']}, K = {cfg['K']}, V = {cfg['V']}, chunk size "
        f"{cfg['chunk_size']}; {result['machine']['cores']} cores; the thread counts interleaved "
        f"call by call, {cfg['repeats']} rounds over the whole table: medians of the times and "
        f"of the rounds' speed-ups over {counts[0]} thread{'s' if counts[0] > 1 else ''}; "
        f"efficiency against the "
        f"matrix-product rate at the same thread count (GFLOP/s by threads: {roofs}); chunk form: "
        f"{result['machine']['chunk_loop']})",
        "",
        "| mechanism | T | threads | fwd ms | fwd eff. | fwd speed-up | fwd+bwd ms | "
        "fwd+bwd eff. | fwd+bwd speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['mechanism']} | {r['T']:,} | {r['threads']} | {_ms(r['forward_s'])} | "
            f"{_cell(r, 'forward_efficiency', '.2f')} | {_cell(r, 'forward_speedup', '.2f')}x | "
            f"{_ms(r.get('forward_backward_s'))} | {_cell(r, 'forward_backward_efficiency', '.2f')}"
            f" | {_cell(r, 'forward_backward_speedup', '.2f')}"
            + ("x |" if "forward_backward_speedup" in r else " |")
        )
    return "\n".join(lines)


def chunk_loop() -> str:
    """Which loop runs the float32 chunk forms here: the fused C++ one or PyTorch's."""
    if native.available():
        cache = os.environ.get("LINATTN_CACHE_MIB", str(tuning.CACHE_MIB))
        return f"fused C++ forward and backward; output blocks reused, LINATTN_CACHE_MIB={cache}"
    return f"PyTorch group loop ({native.reason()})"


def _ms(s: float | None) -> str:
    return "" if s is None else f"{s * 1e3:,.1f}"


def _mib(b: int | None) -> str:
    return "" if b is None else f"{b / 2**20:,.0f}"


def _roof_text(result: dict) -> str:
    """The header's account of the roof (one run, or the roofs of merged runs)."""
    runs = result["config"].get("merged_runs")
    if runs:
        roofs = result["run_roofs_ops_per_s"]
        return (
            f"the median of {runs} runs, row by row, each row's efficiency against its own run's "
            f"matrix-product roof ({min(roofs) / 1e9:,.0f}-{max(roofs) / 1e9:,.0f} GFLOP/s, each "
            "the highest of that run's measurements)"
        )
    return (
        f"matrix-product roof {result['roof_ops_per_s'] / 1e9:,.0f} GFLOP/s, the highest of "
        f"{_roof_range(result)}"
    )


def _roof_range(result: dict) -> str:
    samples = result.get("roof_samples_ops_per_s") or [result["roof_ops_per_s"]]
    return f"{len(samples)} measurements, lowest {min(samples) / 1e9:,.0f}"


def _threads(n: int) -> str:
    """ "1 thread", "4 threads"."""
    return f"{n} thread{'' if n == 1 else 's'}"


def efficiency_note(rows: list[dict]) -> str:
    """Why a row's efficiency passes 1, when one does; "" otherwise.

    The efficiency divides the spec's section-9 count by the time: for softmax that count is
    4 T^2 d, the full T x T score and value products. A causal kernel (SDPA with ``is_causal``)
    skips the blocks above the diagonal, about half of them, so it can run at up to about twice
    the matrix-product roof against that count. The count stays the spec's, the one the other
    mechanisms are compared with; the note says what the number means.
    """
    above = [
        f"{r['mechanism']} {r['mode']} at T = {r['T']:,}"
        for r in rows
        if max(r.get("forward_efficiency", 0.0), r.get("forward_backward_efficiency", 0.0)) > 1
    ]
    if not above:
        return ""
    return (
        "Efficiency above 1 (" + "; ".join(above) + "): the efficiency is the section-9 "
        "operation count over the time, against the matrix-product roof. For softmax that count "
        "is 4 T^2 d, the full T x T products, while the causal kernel skips the blocks above the "
        "diagonal (about half the work), so against the full count it can reach about 2."
    )


def bench_markdown(result: dict) -> str:
    """The benchmark as Markdown tables."""
    cfg, threads = result["config"], _threads(result["machine"]["threads"])
    lines = [
        f"**linattn bench** (float32, B = {cfg['B']}, H = {cfg['H']}, K = {cfg['K']}, "
        f"V = {cfg['V']}, chunk size {cfg['chunk_size']}, {threads}; "
        f"medians of {cfg['clock']} time; {_roof_text(result)}; "
        f"{result['machine'].get('malloc', 'malloc defaults')}; "
        f"chunk form: {result['machine'].get('chunk_loop', 'PyTorch group loop')})",
        "",
        "| mechanism | form | T | fwd ms | fwd GFLOP/s | fwd eff. | fwd+bwd ms | fwd+bwd eff. | "
        "peak MiB fwd | peak MiB fwd+bwd | softmax / this (fwd) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        ratio = r.get("softmax_over_this_forward")
        lines.append(
            f"| {r['mechanism']} | {r['mode']} | {r['T']:,} | {_ms(r['forward_s'])} | "
            f"{r['forward_rate'] / 1e9:,.1f} | {r['forward_efficiency']:.2f} | "
            f"{_ms(r.get('forward_backward_s'))} | "
            + (f"{r['forward_backward_efficiency']:.2f}" if "forward_backward_s" in r else "")
            + f" | {_mib(r.get('forward_peak_bytes'))}"
            + f" | {_mib(r.get('forward_backward_peak_bytes'))}"
            + f" | {'' if ratio is None else f'{ratio:,.2f}'} |"
        )
    note = efficiency_note(result["rows"])
    if note:
        lines += ["", note]
    fla = [r for r in result["rows"] if "fla_forward_s" in r]
    if fla:
        lines += [
            "",
            "**Against fla-core's pure-PyTorch chunked references** (forward, same inputs, "
            "the two timed in turns)",
            "",
            "| mechanism | T | ours ms | fla ms | speed-up | max abs diff |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in fla:
            lines.append(
                f"| {r['mechanism']} | {r['T']:,} | "
                f"{_ms(r.get('fla_ours_forward_s', r['forward_s']))} | "
                f"{_ms(r['fla_forward_s'])} | {r['fla_speedup']:,.1f}x | "
                f"{r['fla_max_abs_diff']:.1e} |"
            )
    if result["generation"]:
        lines += ["", _generation_step.generation_markdown(result["generation"])]
    return "\n".join(lines)


def bench_plot(result: dict, path: Path) -> bool:
    """The benchmark's plot (``linattn.figures.plots.bench_figure``) as the PNG ``path``; False
    without matplotlib (the optional ``plot`` extra: the tables are written all the same)."""
    from linattn.figures import plots, style

    try:
        figure = plots.bench_figure(plots.bench_results(result))
    except ImportError:
        return False
    style.save_png(figure, path)
    return True


def configure(parser: argparse.ArgumentParser) -> None:
    """Options of ``linattn bench``."""
    names = [m.name for m in cases.mechanisms()]
    add = parser.add_argument
    add("--T", type=int_list, default=[1024, 4096, 16384, 65536], help="sequence lengths")
    add("--B", type=positive_int, default=1, help="batch size")
    add("--H", type=positive_int, default=8, help="heads")
    add("--K", type=positive_int, default=64, help="key dimension")
    add("--V", type=positive_int, default=64, help="value dimension")
    add("--chunk-size", type=positive_int, default=64, help="chunk size C of the chunk form")
    add(
        "--mechanisms",
        type=lambda s: _choices(s, names),
        default=names,
        help=f"comma-separated subset of {','.join(names)}",
    )
    add(
        "--modes",
        type=lambda s: _choices(s, MODES),
        default=list(MODES),
        help="forms to time: chunk,parallel,recurrent",
    )
    add("--parallel-max-T", type=positive_int, default=1024, help="longest T of the parallel form")
    add("--recurrent-max-T", type=positive_int, default=1024, help="longest T, recurrent form")
    add("--softmax-max-T", type=positive_int, default=16384, help="longest T of softmax attention")
    add("--repeats", type=positive_int, default=3, help="timed runs per configuration (median)")
    add("--no-backward", action="store_true", help="time the forward pass only")
    add("--no-memory", dest="memory", action="store_false", help="skip the peak-memory child")
    add("--memory-min-T", type=positive_int, default=16384, help="measure memory from this T on")
    add("--memory-timeout", type=positive_int, default=3600, help="seconds for the memory child")
    add("--no-fla", dest="fla", action="store_false", help="skip the fla-core comparison")
    add("--fla-max-T", type=positive_int, default=4096, help="longest T timed with fla-core")
    add(
        "--generation-t",
        type=lambda s: [] if s == "none" else int_list(s),
        default=[1024, 16384, 131072],
        help="KV-cache lengths of the generation step ('none')",
    )
    add("--generation-K", type=positive_int, default=128, help="head dimension of the step")
    add("--generation-repeats", type=positive_int, default=50, help="timed steps (median)")
    add(
        "--threads",
        type=int_list,
        default=None,
        help="torch threads (default: torch's); several (1,2,4): the scaling table instead",
    )
    add(
        "--tune-malloc",
        action="store_true",
        help="first let glibc keep freed memory (linattn.cpu.tune_malloc; process-wide)",
    )
    add(
        "--clock",
        choices=sorted(_timing.CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time (steadier on a shared machine)",
    )
    add("--seed", type=nonnegative_int, default=0, help="seed of the random inputs")
    add("--out", type=Path, default=Path("runs/bench"), help="directory for bench.json/md/png")
    add("--json", action="store_true", help="print JSON instead of Markdown")
    add(
        "--merge",
        type=Path,
        nargs="+",
        metavar="BENCH_JSON",
        help="time nothing: merge these bench.json runs (medians, row by row) into --out",
    )


def _choices(text: str, allowed) -> list[str]:
    """A comma-separated subset of ``allowed``."""
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    bad = [c for c in chosen if c not in allowed]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"expected a subset of {','.join(allowed)}, got {text!r}")
    return chosen


def memory_needed(args: argparse.Namespace) -> int:
    """Bytes of the largest float32 tensors one row holds (a lower bound of the peak): q, k, v
    and the output gradient [B, T, H, K or V] at the longest T, the parallel form's T x T scores
    per head at its longest T, and a generation step's KV cache [B, H, t, K] twice."""
    B, H, K, V = args.B, args.H, args.K, args.V
    T = max(args.T)
    parallel = min(T, args.parallel_max_T) if "parallel" in args.modes else 0
    t = max(args.generation_t, default=0)
    inputs = B * H * T * (2 * K + 2 * V)
    return 4 * max(inputs, B * H * parallel * parallel, 2 * B * H * t * args.generation_K)


def _size_options(args: argparse.Namespace) -> str:
    """The size options as typed, for the message of ``check_memory``."""
    words = [f"--T {','.join(map(str, args.T))}"]
    words += [f"--{name} {getattr(args, name)}" for name in ("B", "H", "K", "V")]
    if args.generation_t:
        words.append(f"--generation-t {','.join(map(str, args.generation_t))}")
    return " ".join(words)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, write bench.json, bench.md and bench.png under --out, print the tables."""
    output_dir("--out", args.out)  # before any timing: a bad --out must not cost the run
    if args.merge:
        paths = [input_file("--merge", p) for p in args.merge]  # every one before reading any
        runs = [_read_run(p) for p in paths]
        try:
            merged = merge_runs(runs)  # its ValueErrors name --merge
        except KeyError as error:
            raise ValueError(f"--merge: a run has no {error} (not a bench.json?)") from None
        return _write(merged, args)
    check_memory(_size_options(args), memory_needed(args))
    if args.threads and len(set(args.threads)) > 1:
        return _scaling(args)
    if args.threads:
        torch.set_num_threads(args.threads[0])
    malloc = "malloc defaults"
    if args.tune_malloc:
        if tune_malloc():
            malloc = DESCRIPTION
        else:
            malloc = "not tuned (no glibc mallopt)"
            print("linattn bench: warning: --tune-malloc: no glibc mallopt here", file=sys.stderr)
    _timing.use_clock(args.clock)
    result = compute_bench(args)
    result["machine"]["malloc"] = malloc
    result["machine"]["chunk_loop"] = chunk_loop()
    result["config"]["out"] = str(args.out)
    return _write(result, args)


def _scaling(args: argparse.Namespace) -> int:
    """``--threads`` with several counts: the scaling table, scaling.json/md/png under --out."""
    if args.clock != "wall":  # CPU time adds the threads' times: it cannot show a speed-up
        raise ValueError("--threads with several counts needs --clock wall")
    _timing.use_clock(args.clock)
    result = compute_scaling(args)
    result["config"]["out"] = str(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    text = scaling_markdown(result)
    (args.out / "scaling.json").write_text(json.dumps(result, indent=2))
    (args.out / "scaling.md").write_text(text + "\n")
    from linattn.figures import plots, style

    try:
        style.save_png(plots.scaling_figure(result), args.out / "scaling.png")
    except ImportError:  # no matplotlib: the table all the same
        pass
    print(json.dumps(result, indent=2) if args.json else text)
    return 0


def _read_run(path: Path) -> dict:
    """One bench.json to merge; a file that is not JSON (a run cut short) or cannot be read is
    named in the error (``linattn bench: error: --merge PATH: ...``)."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"--merge {path}: not valid JSON ({error})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--merge {path}: cannot be read ({error})") from None


def _write(result: dict, args: argparse.Namespace) -> int:
    """Write bench.json, bench.md and bench.png under --out and print the tables."""
    args.out.mkdir(parents=True, exist_ok=True)
    text = bench_markdown(result)
    (args.out / "bench.json").write_text(json.dumps(result, indent=2))
    (args.out / "bench.md").write_text(text + "\n")
    bench_plot(result, args.out / "bench.png")
    print(json.dumps(result, indent=2) if args.json else text)
    return 0
