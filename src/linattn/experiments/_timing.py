"""Timing and memory measurement for `linattn bench`: medians, the matrix-product roof, peak RSS.

Speed is reported as a ratio to the rate of one large float32 matrix product timed in the same
process (the "roof"), so that a loaded or a faster machine moves both alike.

Peak memory on the CPU: each configuration is measured in a child process started with glibc's
``MALLOC_MMAP_THRESHOLD_=65536``, so that every tensor above 64 KiB is its own mapping and is
returned to the system when freed (resident memory then follows live memory). Before each call the
child resets the kernel's peak-RSS counter (``/proc/self/clear_refs``), and afterwards reads
``VmHWM - VmRSS(before)``: the extra resident memory of the call at its peak, outputs and gradients
included, inputs and the upstream gradient excluded (they exist before the call).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from linattn.cpu import empty_cache

ROOF_SIZE = 2048  # n x n @ n x n float32: 2 n^3 operations, large enough to run at full rate


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]  # the clock of every timing; `linattn bench --clock cpu` switches it


def use_clock(name: str) -> None:
    """Time with wall-clock time ("wall") or with this process's CPU time ("cpu").

    CPU time counts only the cycles this process ran, so on a machine shared with other jobs it
    stays close to the time on an idle machine (for one thread; with several threads it adds them).
    """
    global clock
    clock = CLOCKS[name]


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> tuple[float, list]:
    """Median time (s, by ``clock``) of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return median(times), times


def times_in_turns(fns: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """The times of each of ``fns``, called in turns (f1, f2, ..., f1, f2, ...) ``repeats``
    times: entry i of each list comes from turn i, the calls of a turn a moment apart."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, own in zip(fns, times, strict=True):
            start = clock()
            fn()
            own.append(clock() - start)
    return times


def medians_in_turns(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median time of each of ``fns``, called in turns (``times_in_turns``): on a shared
    machine all the medians then come from the same minutes."""
    return [median(own) for own in times_in_turns(fns, repeats)]


def paired_ratios(top: list[float], bottom: list[float]) -> dict[str, float]:
    """The ratios top[i] / bottom[i] of times taken in the same turn: their median, lowest and
    highest (a slow minute moves both times of a turn alike, and drops out of their ratio)."""
    ratios = sorted(t / b for t, b in zip(top, bottom, strict=True))
    return {"median": median(ratios), "low": ratios[0], "high": ratios[-1]}


def median(values: list[float]) -> float:
    """The median (the mean of the two middle values for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def matmul_call(n: int = ROOF_SIZE) -> Callable[[], object]:
    """One n x n float32 matrix product into a reused output: 2 n^3 operations a call."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return lambda: torch.mm(a, b, out=out)


def matmul_rate(n: int = ROOF_SIZE, repeats: int = 5) -> float:
    """Operations per second of ``matmul_call(n)`` (median)."""
    seconds, _ = median_time(matmul_call(n), repeats)
    return 2 * n**3 / seconds


def on_threads(threads: int, fn: Callable[[], object]) -> Callable[[], object]:
    """fn, called with ``threads`` intra-op threads (set before each call: for calls in turns)."""
    return lambda: (torch.set_num_threads(threads), fn())


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak resident memory of ``fn()`` above the resident memory before it, in bytes (Linux).

    Meaningful in a process started with MALLOC_MMAP_THRESHOLD_ set (see the module docstring).
    The blocks the fused chunk form keeps for reuse are returned to the system first, so that a
    call cannot look smaller by reusing memory an earlier call left resident.
    """
    gc.collect()
    empty_cache()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    result = fn()
    peak = _status_kib("VmHWM")
    del result
    return max(0, peak - before) * 1024


def memory_supported() -> bool:
    """Whether this system lets a process read and reset its peak RSS (Linux /proc)."""
    return Path("/proc/self/clear_refs").exists() and Path("/proc/self/status").exists()


def measure_memory_in_child(jobs: list[dict], timeout: float = 1800) -> list[dict]:
    """Run ``linattn.experiments._memory_child`` on ``jobs`` in a fresh process; its results."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
    src = str(Path(__file__).resolve().parents[2])  # the directory that holds linattn/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "linattn.experiments._memory_child"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory measurement failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
