"""Where a gate's time goes: the fused chunk kernels' time per term, sampled by ``perf``.

    python benchmarks/gate_profile.py [--T 16384] [--calls 60] [--backward]
        [--mechanisms linear,scalar_decay,gla,delta,gated_delta,kda]

For each mechanism, a child process runs the bench's call (``linattn bench``'s inputs: B 1, H 8,
K = V = 64, chunk 64, one thread) ``--calls`` times under ``perf record -e cpu-clock`` (1 kHz,
CPU time: steadier than elapsed time on a loaded machine), and the samples are summed per
function of the kernels (``linattn_native::...``: a term of the chunk form, named as in csrc/),
the BLAS (every MKL/OpenBLAS product, with the packing copies that first read a chunk's strided
rows), the op's input checks (the finiteness sums and ``aminmax``) and page faults, in ms per
call. Functions inlined into their caller count as the caller (``chunk_step`` holds the
backward's per-row gate work). Needs ``perf`` with access to cpu-clock samples.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import sys, torch
from linattn.experiments._bench_cases import BY_NAME, make_inputs, call
torch.set_num_threads(1)
mech, T, calls, backward = BY_NAME[sys.argv[1]], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = make_inputs(mech, 1, T, 8, 64, 64)
if backward == "1":
    x = {name: t.requires_grad_() for name, t in x.items()}
for _ in range(calls + 1):
    o = call(mech, x, "chunk", 64)
    if backward == "1":
        o.backward(torch.ones_like(o))
"""


def category(symbol: str) -> str | None:
    """The row a sampled function counts in (None: Python, set-up, the inputs' generation)."""
    if "mkl_blas" in symbol or "sgemm" in symbol or "strsm" in symbol:
        return "BLAS products"
    if "linattn_native::" in symbol:
        name = symbol.split("linattn_native::")[-1].replace("(anonymous namespace)::", "")
        return name.split("(")[0][:40]
    if "inner_sum" in symbol or "aminmax" in symbol:
        return "input checks"
    if "clear_page" in symbol or "page_fault" in symbol:
        return "page faults"
    return None


def profile(mechanism: str, T: int, calls: int, backward: bool) -> dict[str, float]:
    """ms per call of each row for one mechanism (the set-up call's samples included: small)."""
    with tempfile.TemporaryDirectory() as folder:
        data = str(Path(folder) / "perf.data")
        child = [sys.executable, "-c", CHILD, mechanism, str(T), str(calls), "01"[backward]]
        subprocess.run(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", "1000", "-o", data, *child],
            check=True,
            capture_output=True,
        )
        report = subprocess.run(
            ["perf", "report", "-i", data, "--no-children", "-n", "--sort", "symbol", "--stdio"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    samples: collections.Counter[str] = collections.Counter()
    for line in report.splitlines():
        found = re.match(r"\s*[\d.]+%\s+(\d+)\s+\[[.k]\]\s+(.*)", line)
        row = category(found.group(2).strip()) if found else None
        if row:
            samples[row] += int(found.group(1))
    return {row: n / calls for row, n in samples.items()}  # 1 kHz: a sample is 1 ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=16384)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--backward", action="store_true", help="forward + backward per call")
    parser.add_argument("--mechanisms", default="linear,scalar_decay,gla,delta,gated_delta,kda")
    parser.add_argument("--min-ms", type=float, default=0.5, help="hide rows below this")
    args = parser.parse_args()
    names = args.mechanisms.split(",")
    table = {name: profile(name, args.T, args.calls, args.backward) for name in names}
    rows = sorted(
        {row for t in table.values() for row in t},
        key=lambda r: -max(t.get(r, 0.0) for t in table.values()),
    )
    print(f"ms per {'forward + backward' if args.backward else 'forward'} call, T = {args.T}")
    print("| term | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for row in rows:
        if max(t.get(row, 0.0) for t in table.values()) >= args.min_ms:
            print(f"| {row} | " + " | ".join(f"{table[n].get(row, 0.0):.1f}" for n in names) + " |")


if __name__ == "__main__":
    main()
